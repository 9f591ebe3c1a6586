"""Bad input to train.py, table-driven: each is one line on stderr, exit code 2, no traceback, and nothing
written to out_dir. Most rows run train.main in this process (fast); a representative few run
`python train.py` in a subprocess, as a user would."""

import os

import pytest
import torch

from engine import flags
from engine import runtime
import configs
import presets
import train
from model import GPT, GPTConfig
from conftest import last_of_each, refused, tiny, train_process, without

TINY = tiny(log_interval=None, max_iters=4)

# (flags, a piece of the message); "FILE" stands for a path that is a plain file, "DANGLING" for a symlink to
# nothing, "LOOP" for a symlink to itself
BAD = [
    (["--lr=0"], "--lr=0.0 must be in [1e-07, 1000]"),
    (["--lr=-1"], "--lr=-1.0 must be in [1e-07, 1000]"),
    (["--lr=1e300"], "--lr=1e+300 must be in [1e-07, 1000]"),
    (["--lr=inf"], "--lr=inf is not a finite number"),
    (["--lr=nan"], "--lr=nan is not a finite number"),
    (["--lr=abc"], "--lr=abc is not a valid float"),
    (["--lr"], "--lr needs a value"),
    (["--min_lr=-0.1"], "--min_lr=-0.1 must be in [0, 1000]"),
    (["--min_lr=0.01"], "--min_lr=0.01 must be in [0, --lr=0.003]"),
    (["--min_lr=nan"], "not a finite number"),
    (["--grad_clip=-0.5"], "--grad_clip=-0.5 must be 0 (off) or >= 0.001"),
    (["--grad_clip=inf"], "not a finite number"),
    (["--weight_decay=-0.1"], "--weight_decay=-0.1 must be in [0, 10]"),
    (["--weight_decay=nan"], "not a finite number"),
    (["--beta1=1.0"], "--beta1=1.0 must be in [0, 1)"),
    (["--beta1=-0.1"], "--beta1=-0.1 must be in [0, 1)"),
    (["--beta2=1.0"], "--beta2=1.0 must be in [0, 1)"),
    (["--beta2=1.5"], "--beta2=1.5 must be in [0, 1)"),
    (["--warmup_iters=-1"], "--warmup_iters=-1 must be in [0, --max_iters=4]"),
    (["--warmup_iters=5"], "--warmup_iters=5 must be in [0, --max_iters=4]"),
    (["--warmup_iters=4", "--max_iters=3"], "--warmup_iters=4 must be in [0, --max_iters=3]"),
    (["--lr_decay_iters=0", "--warmup_iters=0"], "--lr_decay_iters=0 must be"),
    (["--lr_decay_iters=1"], "--lr_decay_iters=1 must be >= --warmup_iters=2"),
    (["--eval_interval=0"], "--eval_interval=0 must be a positive integer"),
    (["--log_interval=0"], "--log_interval=0 must be a positive integer"),
    (["--eval_iters=-3"], "--eval_iters=-3 must be a positive integer"),
    (["--batch_size=0"], "--batch_size=0 must be a positive integer"),
    (["--grad_accum=0"], "--grad_accum=0 must be a positive integer"),
    (["--max_iters=0"], "--max_iters=0 must be a positive integer"),
    (["--keep_checkpoints=0"], "--keep_checkpoints=0 must be a positive integer"),
    (["--seed=-1"], "--seed=-1 must be in [0, 2^63)"),
    (["--norm_eps=nan"], "--norm_eps=nan is not a finite number"),
    (["--norm_eps=0"], "--norm_eps=0.0 must be in [1e-12, 1]"),
    (["--dropout=1.0"], "--dropout=1.0 must be in [0, 1)"),
    (["--dropout=nan"], "not a finite number"),
    (["--init_std=inf"], "--init_std=inf is not a finite number"),
    (["--scale_resids_init=nan"], "--scale_resids_init=nan is not a finite number"),
    (["--layer_scale_init=-inf"], "--layer_scale_init=-inf is not a finite number"),
    (["--embed_grad_scale=1.5"], "--embed_grad_scale=1.5 must be in [0, 1]"),
    (["--pn_alpha_fwd=1.0"], "--pn_alpha_fwd=1.0 must be in [0, 1)"),
    (["--n_head=3"], "must be divisible by --n_head=3"),
    (["--norm=groupnorm"], "--norm=groupnorm is not allowed"),
    (["--compile=maybe"], "--compile=maybe is not a boolean"),
    (["--dtype=float8"], "--dtype=float8 is not allowed"),
    (["--device=tpu"], "--device=tpu is not a device"),
    (["--device=cpu:abc"], "--device=cpu:abc is not a device"),
    (["--device=cuda:x"], "--device=cuda:x is not a device"),
    (["--n_embd=1000000000"], "need about"),
    (["--batch_size=1000000000"], "need about"),
    (["--n_layer=1000000"], "need about"),
    (["--eval_iters=2147483647", "--batch_size=64"], "evaluation windows need about 4.95e+03 GB for their start"),
    (["--out_dir=DANGLING"], "which does not exist; choose another --out_dir"),
    (["--out_dir=DANGLING/run"], "which does not exist; choose another --out_dir"),
    (["--out_dir=LOOP"], "is in a symlink loop; choose another --out_dir"),
    (["--out_dir=LOOP/run"], "is in a symlink loop; choose another --out_dir"),
    (["--dataset=LOOP"], "leads through a symlink loop"),
    (["--dataset=LOOP/corpus.txt"], "leads through a symlink loop"),
    (["--nosuchflag=1"], "unknown flag --nosuchflag"),
    (["positional"], "unexpected argument 'positional'"),
    (["--out_dir="], "--out_dir is empty"),
    (["--out_dir=FILE"], "is a file, not a folder"),
    (["--out_dir=FILE/run"], "is a file, not a folder"),
    (["--block_size=100000"], "too few for --block_size=100000"),
    (["--vocab_size=100"], "smaller than the tokenizer's 256"),
    (["--dataset=/no/such/corpus"], "/no/such/corpus"),
    (["--resume"], "--resume: no checkpoint in"),
    (["--grad_accum=100000000000000000000"], "--grad_accum=100000000000000000000 is too large; an integer flag is at "
                                             "most 2,147,483,647"),
    (["--spike_window=4294967296"], "--spike_window=4294967296 is too large"),
    (["--pn_warmup=100000000000000000000"], "--pn_warmup=100000000000000000000 is too large"),
    (["--seed=9223372036854775808"], "--seed=9223372036854775808 is too large; an integer flag is at most "
                                     "9,223,372,036,854,775,807"),
    (["--device=cpu:100000000000000000000"], "is not a device; choose auto, cpu, cuda, cuda:N or mps (N < 10000)"),
    (["--lr=1_0e-3"], "--lr=1_0e-3 is not a valid float; give a number (ASCII digits"),
    (["--lr=\u0661e-3"], "is not a valid float"),  # an Arabic-Indic 1: float() would take it
    (["--attn_softcap=1e-310"], "--attn_softcap=1e-310 must be 0 (off) or in [0.001, 10000]"),
    (["--init_std=1e300"], "--init_std=1e+300 must be in [0.0001, 1]"),
    (["--preset=olmo2", "--norm=batchnorm"], "--norm=batchnorm has no per-token statistic over head_dim (use one "
     "of layernorm, rmsnorm, cogview, dyt) (the preset olmo2 sets --qk_norm=True)"),
    (["--norm=dyt", "--dyt_alpha=1e300"], "--dyt_alpha=1e+300 must be in [1e-07, 10]"),
    (["--diverge_loss=-1"], "--diverge_loss=-1.0 must be >= 0.693147"),
    (["--norm_eps=1e300"], "--norm_eps=1e+300 must be in [1e-12, 1]"),
    (["--layer_scale", "--layer_scale_init=1e300"], "--layer_scale_init=1e+300 must be in [1e-07, 1]"),
    (["--logit_softcap=1e300"], "--logit_softcap=1e+300 must be 0 (off) or in [0.001, 10000]"),
    (["--logit_softcap=1e-300"], "--logit_softcap=1e-300 must be 0 (off) or in [0.001, 10000]"),
    # values that are 0, or nothing, in float32 or to AdamW (issue 46): each ran and learned nothing, or "diverged"
    (["--lr=1e-300", "--min_lr=0"], "--lr=1e-300 must be in [1e-07, 1000] (AdamW moves every weight by about"),
    (["--lr=1e-8", "--min_lr=0"], "--lr=1e-08 must be in [1e-07, 1000]"),
    (["--init=plain", "--init_std=1e-300"], "--init_std=1e-300 must be in [0.0001, 1]"),
    (["--grad_clip=1e-300"], "--grad_clip=1e-300 must be 0 (off) or >= 0.001 (0 turns clipping off"),
    (["--norm_eps=1e-300"], "--norm_eps=1e-300 must be in [1e-12, 1]"),
    (["--layer_scale", "--layer_scale_init=1e-300"], "--layer_scale_init=1e-300 must be in [1e-07, 1]"),
    (["--scale_resids", "--scale_resids_init=1e-300"], "--scale_resids_init=1e-300 must be in [1e-07, 10]"),
    (["--norm=dyt", "--dyt_alpha=1e-300"], "--dyt_alpha=1e-300 must be in [1e-07, 10]"),
    (["--diverge_loss=1e-300"], "--diverge_loss=1e-300 must be >= 0.693147 (every run starts at about"),
    (["--gpu_peak_tflops=1e-300"], "--gpu_peak_tflops=1e-300 must be >= 0.001"),
    # issue 46: a flag given twice took the last value without a word
    (["--lr=1e-3", "--lr=2e-3"], "--lr is given twice (--lr=1e-3, then --lr=2e-3); give each flag once"),
    (["--lr", "1e-3", "--lr=1e-3"], "--lr is given twice (--lr 1e-3, then --lr=1e-3); give each flag once"),
    (["--compile", "--compile=False"], "--compile is given twice (--compile, then --compile=False)"),
    (["--data_dir="], "--data_dir is empty (it would prepare into the current folder)"),
    (["--out_dir=" + "x" * 300], "a name in it is 300 bytes long"),
]
if not torch.cuda.is_available():
    BAD.append((["--device=cuda"], "CUDA is not available"))
if not torch.backends.mps.is_available():
    BAD.append((["--device=mps"], "this torch has no MPS device"))


def command_line(corpus, tmp_path, flags):
    """The flags of a row after the defaults of a tiny run; a row's own --out_dir replaces the default one."""
    file = tmp_path / "a_file"
    file.write_text("not a folder")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    places = {"FILE": file, "DANGLING": tmp_path / "dangling", "LOOP": tmp_path / "loop"}
    for name, path in places.items():
        flags = [f.replace(name, str(path)) for f in flags]
    out = [] if any(f.startswith("--out_dir") for f in flags) else [f"--out_dir={tmp_path / 'out'}"]
    return [*without([f"--dataset={corpus}", f"--data_dir={tmp_path / 'data'}", *out, *TINY], flags), *flags]


def test_the_table_is_big_enough():
    assert len(BAD) >= 40


@pytest.mark.parametrize("flags, expected", BAD, ids=[" ".join(f) for f, _ in BAD])
def test_bad_input_in_process(corpus, tmp_path, capsys, flags, expected):
    code = train.main(command_line(corpus, tmp_path, flags))
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.err.count("\n") == 1 and captured.err.startswith("train.py: "), captured.err
    assert expected in captured.err and "Traceback" not in captured.err
    assert not (tmp_path / "out").exists()  # nothing written before the check


# one flag for each stage at which train.py refuses, run as real processes (the whole table runs in process above):
# the config checks, the output folder, the device, --resume with nothing to resume, the memory check
SHELL = ["--beta1=1.0", "--out_dir=FILE/run", "--device=mps", "--resume", "--n_embd=1000000000"]


@pytest.mark.slow
@pytest.mark.parametrize("flag", SHELL)
def test_bad_input_from_the_shell(corpus, tmp_path, flag):
    expected = dict((f[0], e) for f, e in BAD)[flag]
    result = train_process(*command_line(corpus, tmp_path, [flag]))
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def test_an_out_dir_that_cannot_be_written(corpus, tmp_path, capsys, monkeypatch):
    """A read-only folder; root writes anywhere, so for root the permission check is told it cannot."""
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    if os.geteuid() == 0:
        access = os.access
        monkeypatch.setattr(os, "access", lambda path, mode: access(path, mode) and str(path) != str(locked))
    assert train.main(command_line(corpus, tmp_path, [f"--out_dir={locked / 'run'}"])) == 2
    assert capsys.readouterr().err.splitlines() == [f"train.py: --out_dir={locked / 'run'}: {locked} is not writable; "
                                                    "choose another --out_dir"]
    assert list(locked.iterdir()) == []


def test_a_run_in_an_out_dir_holding_one_refuses_and_leaves_it(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "log.jsonl").write_text('{"event": "train", "step": 1}\n')
    (out / "ckpt.pt").write_bytes(b"an earlier run's checkpoint")
    assert train.main(command_line(corpus, tmp_path, [])) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"train.py: --out_dir={out} holds a run (ckpt.pt, log.jsonl); continue it with "
                                "--resume, replace it with --overwrite, or choose another --out_dir"]
    assert sorted(p.name for p in out.iterdir()) == ["ckpt.pt", "log.jsonl"]
    assert (out / "ckpt.pt").read_bytes() == b"an earlier run's checkpoint"


def test_an_out_dir_holding_only_a_users_config_json_is_not_overwritten(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text('{"my": "own notes"}')
    assert train.main(command_line(corpus, tmp_path, [])) == 2
    # no checkpoint: --resume would find nothing to continue (issue 46), so it is not offered
    assert capsys.readouterr().err.splitlines() == [f"train.py: --out_dir={out} holds a run's files but no checkpoint "
                                                    "(config.json), so --resume has nothing to continue; replace them "
                                                    "with --overwrite, or choose another --out_dir"]
    assert [p.name for p in out.iterdir()] == ["config.json"]
    assert (out / "config.json").read_text() == '{"my": "own notes"}'


def test_a_run_that_wrote_only_empty_files_holds_nothing(corpus, tmp_path):
    """What a fresh run on a full disk can leave behind: a retry is not refused as holding a run."""
    out = tmp_path / "out"
    out.mkdir()
    for name in ("config.json", "log.jsonl", "run.lock"):
        (out / name).write_bytes(b"")
    assert train.main(command_line(corpus, tmp_path, ["--max_iters=2", "--eval_interval=2"])) == 0


# (flags after TINY, the one warning they give): the last flag named changes nothing in that configuration
NO_EFFECT = [
    (["--pn_alpha_fwd=0.5"], "--pn_alpha_fwd has no effect with --norm=layernorm"),
    (["--norm=batchnorm", "--pn_alpha_bwd=0.5"], "--pn_alpha_bwd has no effect with --norm=batchnorm"),
    (["--norm=none", "--norm_eps=1e-3"], "--norm_eps has no effect with --norm=none"),
    # the flag that makes it so was set by the preset, not typed: the warning says which
    (["--preset=dyt", "--norm_eps=1e-3"], "--norm_eps has no effect with --norm=dyt (the preset dyt sets --norm=dyt)"),
    (["--layer_scale_init=0.1"], "--layer_scale_init has no effect with --layer_scale=False"),
    (["--lr_schedule=constant", "--min_lr=0"], "--min_lr has no effect with --lr_schedule=constant"),
    (["--dyt_alpha=0.3"], "--dyt_alpha has no effect with --norm=layernorm"),
    (["--norm=rmsnorm", "--dyt_alpha_attn=0.8"], "--dyt_alpha_attn has no effect with --norm=rmsnorm"),
    (["--norm=dyt", "--norm_eps=1e-3"], "--norm_eps has no effect with --norm=dyt"),
    (["--head_scale_at=after_proj"], "--head_scale_at has no effect with --scale_heads=False"),
    (["--mix_ln_ratio=0.5"], "--mix_ln_ratio has no effect with --layout=pre"),
    (["--layout=mix", "--mix_ln_ratio=1.0", "--layer_norm_scaling=True"],
     "--layer_norm_scaling has no effect with --layout=mix --mix_ln_ratio=1.0 (every layer is Post-LN)"),
    (["--n_layer=1", "--layer_norm_scaling=True"],
     "--layer_norm_scaling has no effect with --n_layer=1 (its one layer is scaled by 1/sqrt(1) = 1)"),
    (["--subln=True", "--scale_fc=True"],
     "--scale_fc has no effect with --subln=True (SubLN puts the same norm before W_2)"),
    (["--preset=gemma2", "--attn_impl=sdpa"],
     "--attn_impl has no effect with --attn_softcap=50.0 (a soft-cap forces the manual attention path) (the preset "
     "gemma2 sets --attn_softcap=50.0)"),
    # issue 55: said nothing on a CPU
    (["--gpu_peak_tflops=100"],
     "--gpu_peak_tflops has no effect with --device=cpu (the MFU it is the peak of is shown on CUDA only)"),
]


@pytest.mark.slow
@pytest.mark.parametrize("flags, warning", NO_EFFECT, ids=[" ".join(f) for f, _ in NO_EFFECT])
def test_a_flag_without_effect_warns_and_runs(corpus, tmp_path, capsys, flags, warning):
    assert train.main(command_line(corpus, tmp_path, ["--max_iters=2", "--eval_interval=2", *flags])) == 0
    assert capsys.readouterr().err.splitlines() == [f"train.py: warning: {warning}"]


# another value of each model flag that NO_EFFECT says changes nothing
OTHER_VALUE = {"pn_alpha_fwd": "0.8", "pn_alpha_bwd": "0.8", "norm_eps": "0.1", "layer_scale_init": "0.5",
               "dyt_alpha": "2.0", "dyt_alpha_attn": "2.0", "head_scale_at": "before_proj", "mix_ln_ratio": "0.0",
               "layer_norm_scaling": "False", "scale_fc": "False", "attn_impl": "manual"}
MODEL_ROWS = [(f, w) for f, w in NO_EFFECT if w.split()[0][2:] in GPTConfig.field_names()]


@pytest.mark.parametrize("flags, warning", MODEL_ROWS, ids=[" ".join(f) for f, _ in MODEL_ROWS])
def test_a_flag_said_to_have_no_effect_builds_the_same_model_at_another_value(flags, warning):
    """A warning is a claim: the flag at any other value gives the same weights and the same logits."""
    name = warning.split()[0][2:]
    models = []
    for argv in (flags, [*flags, f"--{name}={OTHER_VALUE[name]}"]):
        model_cfg, _ = configs.build_configs(configs.parse_flags(last_of_each([*TINY, *argv])))
        torch.manual_seed(0)
        models.append(GPT(model_cfg))
    ours, other = models
    assert getattr(ours.config, name) != getattr(other.config, name)
    x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    ours_state, other_state = ours.state_dict(), other.state_dict()
    assert ours_state.keys() == other_state.keys()
    assert all(torch.equal(ours_state[k], other_state[k]) for k in ours_state)
    assert torch.equal(ours(x)[0], other(x)[0])


def test_a_flag_with_effect_does_not_warn(corpus, tmp_path, capsys):
    assert train.main(command_line(corpus, tmp_path, ["--max_iters=2", "--eval_interval=2", "--norm=powernorm",
                                                       "--pn_alpha_fwd=0.5", "--pn_alpha_bwd=0.5"])) == 0
    assert capsys.readouterr().err == ""


def test_the_newer_flags_with_their_enabling_flags_do_not_warn(corpus, tmp_path, capsys):
    assert train.main(command_line(corpus, tmp_path, [
        "--max_iters=2", "--eval_interval=2", "--norm=dyt", "--dyt_alpha=0.3", "--dyt_alpha_attn=0.6",
        "--scale_heads=True", "--head_scale_at=after_proj", "--layout=mix", "--mix_ln_ratio=0.5",
        "--layer_norm_scaling=True", "--scale_fc=True", "--attn_impl=manual", "--logit_softcap=30",
        "--embed_init=inv_sqrt_d"])) == 0
    assert capsys.readouterr().err == ""


# each newer flag beside the flag that gives it its effect (TINY has 2 layers)
WITH_EFFECT = [
    ["--norm=dyt", "--dyt_alpha=0.3"],
    ["--norm=dyt", "--dyt_alpha_attn=0.8"],
    ["--preset=dyt", "--dyt_alpha=0.2", "--dyt_alpha_attn=0.8"],
    ["--norm=rmsnorm", "--norm_eps=1e-3"],
    ["--scale_heads=True", "--head_scale_at=after_proj"],
    ["--preset=nf_normformer", "--head_scale_at=after_proj"],
    ["--layout=mix", "--mix_ln_ratio=0.5"],
    ["--layer_norm_scaling=True"],
    ["--layout=mix", "--mix_ln_ratio=0.5", "--layer_norm_scaling=True"],
    ["--preset=lns", "--n_layer=3"],
    ["--scale_fc=True"],
    ["--subln=True"],
    ["--attn_impl=manual"],
    ["--preset=gemma2", "--attn_softcap=0", "--attn_impl=manual"],
    ["--preset=gemma2", "--logit_softcap=20"],
    ["--attn_softcap=30"],
    ["--embed_init=inv_sqrt_d"],
]


@pytest.mark.parametrize("flags", WITH_EFFECT, ids=[" ".join(f) for f in WITH_EFFECT])
def test_a_newer_flag_with_its_enabling_flag_does_not_warn(flags):
    given = configs.parse_flags(last_of_each([*TINY, *flags]))
    model_cfg, tc = configs.build_configs(given)
    assert configs.no_effect_warnings(given, model_cfg, tc) == []


# a flag the LR schedule does not read is not refused for its relation to the others (it is warned about instead)
UNREAD = [
    ["--lr_schedule=ramp", "--lr=1e-4"],
    ["--lr_schedule=constant", "--lr=1e-4"],
    ["--lr_schedule=ramp", "--warmup_iters=10", "--max_iters=5"],
    ["--lr_schedule=constant", "--warmup_iters=2", "--lr_decay_iters=1"],
]


@pytest.mark.parametrize("flags", UNREAD, ids=[" ".join(f) for f in UNREAD])
def test_a_flag_the_schedule_does_not_read_is_not_refused(flags):
    given = configs.parse_flags(last_of_each([*TINY, *flags]))
    model_cfg, tc = configs.build_configs(given)
    configs.check_train_config(tc, given)


def test_cpu_threads_on_a_machine_without_an_affinity_mask(monkeypatch):
    """macOS has no os.sched_getaffinity: a CPU run there takes every core, not a traceback."""
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    threads = torch.get_num_threads()
    try:
        runtime.start("cpu", runtime.Machine())
        assert torch.get_num_threads() == os.cpu_count()
    finally:
        torch.set_num_threads(threads)


def test_help_prints_the_catalog_of_every_flag(capsys):
    assert train.main(["--help"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out.endswith(configs.catalog())
    printed = captured.out.splitlines()
    for name in flags.field_types(GPTConfig, configs.TrainConfig):
        assert any(line.split()[:1] == [name] for line in printed), name


def test_the_default_warmup_does_not_block_a_short_run(corpus, tmp_path):
    """--warmup_iters=50 by default: a 2-step run that does not set it is not bad input."""
    short = [f for f in command_line(corpus, tmp_path, []) if not f.startswith(("--warmup_iters", "--max_iters"))]
    assert train.main([*short, "--max_iters=2", "--eval_interval=2"]) == 0


def test_presets_py_prints_a_preset_and_refuses_a_name_that_is_none(tmp_path, capsys):
    """Issue 55: python presets.py nosuch exited 0 without a word."""
    assert refused(tmp_path, "presets.py", ["nosuch"]) == (f"presets.py: nosuch is not a preset; choose one of "
                                                           f"{', '.join(presets.PRESETS)}\n")
    assert presets.main(["normformer", "baseline"]) == 0
    assert capsys.readouterr().out == (f"normformer: --scale_attn=True --scale_fc=True --scale_heads=True; "
                                       f"{presets.PRESETS['normformer'].source}\n"
                                       f"baseline: (no flags); {presets.PRESETS['baseline'].source}\n")
