"""Bad input to train.py, table-driven: each is one line on stderr, exit code 2, no traceback, and nothing
written to out_dir. Most rows run train.main in this process (fast); a representative few run
`python train.py` in a subprocess, as a user would."""

import os
import subprocess
import sys

import pytest
import torch

import flags
import train
from model import GPTConfig

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4", "--eval_iters=2",
        "--warmup_iters=2", "--lr=3e-3", "--max_iters=4"]

# (flags, a piece of the message); "FILE" stands for a path that is a plain file, "DANGLING" for a symlink to
# nothing, "LOOP" for a symlink to itself
BAD = [
    (["--lr=0"], "--lr=0.0 must be > 0"),
    (["--lr=-1"], "--lr=-1.0 must be > 0"),
    (["--lr=inf"], "--lr=inf is not a finite number"),
    (["--lr=nan"], "--lr=nan is not a finite number"),
    (["--lr=abc"], "--lr=abc is not a valid float"),
    (["--lr"], "--lr needs a value"),
    (["--min_lr=-0.1"], "--min_lr=-0.1 must be in [0, --lr="),
    (["--min_lr=0.01"], "--min_lr=0.01 must be in [0, --lr=0.003]"),
    (["--min_lr=nan"], "not a finite number"),
    (["--grad_clip=-0.5"], "--grad_clip=-0.5 must be >= 0"),
    (["--grad_clip=inf"], "not a finite number"),
    (["--weight_decay=-0.1"], "--weight_decay=-0.1 must be >= 0"),
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
    (["--norm_eps=0"], "--norm_eps=0.0 must be > 0"),
    (["--dropout=1.0"], "--dropout=1.0 must be in [0, 1)"),
    (["--dropout=nan"], "not a finite number"),
    (["--init_std=inf"], "--init_std=inf is not a finite number"),
    (["--scale_resids_init=nan"], "--scale_resids_init=nan is not a finite number"),
    (["--layer_scale_init=-inf"], "--layer_scale_init=-inf is not a finite number"),
    (["--embed_grad_scale=1.5"], "--embed_grad_scale=1.5 must be in [0, 1]"),
    (["--pn_alpha_fwd=1.0"], "--pn_alpha_fwd=1.0 must be in (0, 1)"),
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
]
if not torch.cuda.is_available():
    BAD.append((["--device=cuda"], "CUDA is not available"))
if not torch.backends.mps.is_available():
    BAD.append((["--device=mps"], "this torch has no MPS device"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "tiny.txt"
    path.write_text("the norm of the layer scales the residual stream\n" * 200)
    return str(path)


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
    return [f"--dataset={corpus}", f"--data_dir={tmp_path / 'data'}", *out, *TINY, *flags]


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


SHELL = ["--grad_clip=-0.5", "--beta1=1.0", "--norm_eps=nan", "--out_dir=FILE/run", "--device=mps", "--resume",
         "--n_embd=1000000000", "--out_dir=LOOP/run"]


@pytest.mark.parametrize("flag", SHELL)
def test_bad_input_from_the_shell(corpus, tmp_path, flag):
    expected = dict((f[0], e) for f, e in BAD)[flag]
    result = subprocess.run([sys.executable, os.path.join(HERE, "train.py"),
                             *command_line(corpus, tmp_path, [flag])], capture_output=True, text=True, cwd=HERE)
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
    assert capsys.readouterr().err.splitlines() == [f"train.py: --out_dir={out} holds a run (config.json); continue "
                                                    "it with --resume, replace it with --overwrite, or choose another "
                                                    "--out_dir"]
    assert [p.name for p in out.iterdir()] == ["config.json"]
    assert (out / "config.json").read_text() == '{"my": "own notes"}'


def test_a_run_that_wrote_only_empty_files_holds_nothing(corpus, tmp_path):
    """What a fresh run on a full disk can leave behind: a retry is not refused as holding a run."""
    out = tmp_path / "out"
    out.mkdir()
    for name in ("config.json", "log.jsonl", "run.lock"):
        (out / name).write_bytes(b"")
    assert train.main(command_line(corpus, tmp_path, ["--max_iters=2", "--eval_interval=2"])) == 0


@pytest.mark.parametrize("flags, warning", [
    (["--pn_alpha_fwd=0.5"], "--pn_alpha_fwd has no effect with --norm=layernorm"),
    (["--norm=batchnorm", "--pn_alpha_bwd=0.5"], "--pn_alpha_bwd has no effect with --norm=batchnorm"),
    (["--norm=none", "--norm_eps=1e-3"], "--norm_eps has no effect with --norm=none"),
    (["--layer_scale_init=0.1"], "--layer_scale_init has no effect with --layer_scale=False"),
    (["--lr_schedule=constant", "--min_lr=0"], "--min_lr has no effect with --lr_schedule=constant"),
])
def test_a_flag_without_effect_warns_and_runs(corpus, tmp_path, capsys, flags, warning):
    assert train.main(command_line(corpus, tmp_path, ["--max_iters=2", "--eval_interval=2", *flags])) == 0
    assert capsys.readouterr().err.splitlines() == [f"train.py: warning: {warning}"]


def test_a_flag_with_effect_does_not_warn(corpus, tmp_path, capsys):
    assert train.main(command_line(corpus, tmp_path, ["--max_iters=2", "--eval_interval=2", "--norm=powernorm",
                                                       "--pn_alpha_fwd=0.5", "--pn_alpha_bwd=0.5"])) == 0
    assert capsys.readouterr().err == ""


def test_help_lists_every_flag_with_its_default_from_configurable_txt():
    result = subprocess.run([sys.executable, os.path.join(HERE, "train.py"), "--help"], capture_output=True,
                            text=True, cwd=HERE)
    assert result.returncode == 0 and result.stderr == ""
    with open(os.path.join(HERE, "configurable.txt")) as f:
        rows = [line for line in f.read().splitlines() if line and not line.startswith("#")]
    printed = result.stdout.splitlines()
    for row in rows:
        assert row in printed
    for name in flags.field_types(GPTConfig, train.TrainConfig):
        assert any(line.split()[:1] == [name] for line in printed), name


def test_the_default_warmup_does_not_block_a_short_run(corpus, tmp_path):
    """--warmup_iters=50 by default: a 2-step run that does not set it is not bad input."""
    short = [f for f in command_line(corpus, tmp_path, []) if not f.startswith(("--warmup_iters", "--max_iters"))]
    assert train.main([*short, "--max_iters=2", "--eval_interval=2"]) == 0
