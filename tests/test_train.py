"""train.py end to end on a tiny corpus: exact resume, DDP, mixed precision, checkpoints, bad input."""

import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest
import torch

import model
from engine import runtime
import configs
import train
from norms import NORMS
from conftest import ROOT, TINY, run_train, torchrun, train_argv


def run(corpus, tmp_path, *flags):
    """train.main in this process; returns its exit code."""
    return run_train(corpus, tmp_path / "data", tmp_path / "out", *TINY, *flags)


def events(out_dir, kind):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [e for e in map(json.loads, f) if e["event"] == kind]


def test_run_writes_config_log_and_checkpoint(corpus, tmp_path):
    assert run(corpus, tmp_path, "--max_iters=6", "--eval_interval=3", "--preset=normformer",
               "--scale_heads=False") == 0
    out = tmp_path / "out"
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["n_layer"] == 2 and config["train"]["max_iters"] == 6
    # the resolved config: the preset's flags, with the explicit override on top
    assert config["model"]["scale_attn"] and config["model"]["scale_fc"] and not config["model"]["scale_heads"]
    assert config["model"]["vocab_size"] == 256 and config["train"]["dtype"] == "float32"  # auto on CPU
    assert [e["step"] for e in events(out, "train")] == [1, 2, 3, 4, 5, 6]
    assert [e["step"] for e in events(out, "eval")] == [0, 3, 6]
    first = events(out, "train")[0]
    assert {"loss", "lr", "grad_norm", "ms_per_step", "tokens_per_s"} <= set(first)
    checkpoint = torch.load(out / "ckpt.pt", weights_only=True)
    assert checkpoint["step"] == 6 and checkpoint["model_config"] == config["model"]
    assert not os.path.exists(out / "ckpt.pt.tmp")


def test_config_json_holds_the_one_resolution_of_the_flags(corpus, tmp_path):
    """The configs a run writes are configs.resolve's for its flags, the vocabulary, PowerNorm's warmup, dtype and
    compile included: what a sweep compares with a finished run is what train.py ran."""
    flags = [*TINY, "--max_iters=2", "--eval_interval=2", "--norm=powernorm", "--grad_accum=2"]
    assert run(corpus, tmp_path, *flags) == 0
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    resolved = configs.resolve(configs.parse_flags(train_argv(corpus, tmp_path / "data", tmp_path / "out", *flags)))
    assert config["model"] == json.loads(json.dumps(dataclasses.asdict(resolved.model)))
    assert config["train"] == json.loads(json.dumps(dataclasses.asdict(resolved.train)))
    assert config["model"]["pn_warmup"] == 2 * 2 and config["train"]["compile"] is False  # resolved, not as given


class StepClock:
    """A clock for runtime.Progress that only moves when a training batch is drawn: 1000 s at step 0 (a compile),
    then 1 s per step. No wall-clock time is read, so the ms/step of a progress line is exact."""

    def __init__(self, generator):
        self.now, self.generator = 0.0, generator

    def __call__(self):
        return self.now

    def batch_generator(self, seed, rank, step, *rest):
        self.now += 1000.0 if step == 0 else 1.0
        return self.generator(seed, rank, step, *rest)


def test_the_first_step_is_left_out_of_the_progress_timing(corpus, tmp_path, monkeypatch):
    """The first step compiles and warms up (minutes at GPT-2 small on a GPU): the first progress line's ms/step,
    tokens/s and MFU time the steps after it (2 and 3), the second line steps 4 to 6."""
    clock = StepClock(train.batch_generator)
    monkeypatch.setattr(runtime.time, "perf_counter", clock)
    monkeypatch.setattr(train, "batch_generator", clock.batch_generator)
    assert run(corpus, tmp_path, "--max_iters=6", "--eval_interval=6", "--log_interval=3") == 0
    first, second = events(tmp_path / "out", "train")
    assert (first["step"], first["ms_per_step"]) == (3, 1000.0)
    assert (second["step"], second["ms_per_step"]) == (6, 1000.0)


@pytest.mark.parametrize("first_step, log_interval, laps", [
    (0, 3, [(3, (2, 3)), (6, (4, 6))]),  # the first step is left out of the first line
    (0, 1, [(1, (1, 1)), (2, (2, 2))]),  # ... unless it is a line of its own
    (4, 3, [(6, (6, 6)), (9, (7, 9))]),  # a resumed run's first step (5) is left out too
])
def test_which_steps_each_progress_line_times(monkeypatch, first_step, log_interval, laps):
    now = [0.0]
    monkeypatch.setattr(runtime.time, "perf_counter", lambda: now[0])
    progress, timed = runtime.Progress(first_step), []
    for step in range(first_step + 1, laps[-1][0] + 1):
        now[0] += 1.0
        progress.step_done(step, log_interval)
        if step % log_interval == 0:
            timed.append((step, progress.lap(step)[1]))
    assert timed == laps


def test_gpt2_tokenizer_pads_the_model_vocab(corpus, tmp_path, monkeypatch):
    shared = os.path.join(ROOT, "..", "shared", "tiktoken")
    if not os.environ.get("TIKTOKEN_CACHE_DIR") and not os.path.isdir(shared):
        pytest.skip("GPT-2's BPE ranks are not available offline (set TIKTOKEN_CACHE_DIR)")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", os.environ.get("TIKTOKEN_CACHE_DIR") or shared)
    assert run(corpus, tmp_path, "--tokenizer=gpt2", "--max_iters=2", "--eval_interval=2") == 0
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["data"]["vocab_size"] == 50257 and config["model"]["vocab_size"] == 50304  # 64 * 786


@pytest.mark.slow
def test_resume_continues_exactly(corpus, tmp_path):
    """Ten steps, stop, resume for ten more == twenty steps in one go (fp32 CPU; dropout on, so the RNG
    state must come back too)."""
    common = ["--dropout=0.1", "--lr_decay_iters=20", "--eval_interval=5"]
    assert run(corpus, tmp_path / "whole", *common, "--max_iters=20") == 0
    assert run(corpus, tmp_path / "split", *common, "--max_iters=10") == 0
    assert run(corpus, tmp_path / "split", "--resume", "--max_iters=20") == 0
    whole = events(tmp_path / "whole" / "out", "train")
    split = events(tmp_path / "split" / "out", "train")
    assert [e["step"] for e in split] == list(range(1, 21))
    assert [e["loss"] for e in split] == [e["loss"] for e in whole]
    whole_eval = events(tmp_path / "whole" / "out", "eval")
    split_eval = events(tmp_path / "split" / "out", "eval")
    assert [(e["step"], e["val_loss"]) for e in split_eval] == [(e["step"], e["val_loss"]) for e in whole_eval]


def test_a_run_never_replaces_another_unless_told(corpus, tmp_path, capsys):
    assert run(corpus, tmp_path, "--max_iters=3", "--eval_interval=3") == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    capsys.readouterr()
    assert run(corpus, tmp_path, "--max_iters=2", "--eval_interval=2") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--resume" in err and "--overwrite" in err
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before
    assert run(corpus, tmp_path, "--max_iters=2", "--eval_interval=2", "--overwrite") == 0
    assert [e["step"] for e in events(tmp_path / "out", "train")] == [1, 2]  # a new log
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["ckpt-2.pt", "ckpt.pt", "config.json", "log.jsonl",
                                                                   "run.lock"]


def test_resume_refuses_to_change_the_model(corpus, tmp_path, capsys):
    assert run(corpus, tmp_path, "--max_iters=2", "--eval_interval=2") == 0
    assert run(corpus, tmp_path, "--resume", "--n_layer=3") == 2
    assert "--n_layer differ from the checkpoint" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mixed_precision_trains_on_cpu(corpus, tmp_path, dtype):
    assert run(corpus, tmp_path, f"--dtype={dtype}", "--max_iters=8", "--eval_interval=8") == 0
    losses = [e["loss"] for e in events(tmp_path / "out", "train")]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    scaler = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["scaler"]
    assert bool(scaler) == (dtype == "float16")  # a GradScaler only for float16


@pytest.mark.slow
def test_a_diverged_run_keeps_the_last_good_checkpoint(corpus, tmp_path, monkeypatch, capsys):
    assert run(corpus, tmp_path, "--max_iters=4", "--eval_interval=2") == 0
    good = (tmp_path / "out" / "ckpt.pt").read_bytes()
    forward = model.GPT.forward

    def poisoned(self, idx, targets=None):
        logits, loss = forward(self, idx, targets)
        return logits, loss * float("nan")

    monkeypatch.setattr(model.GPT, "forward", poisoned)
    assert run(corpus, tmp_path, "--resume", "--max_iters=8") == 3
    assert "the last good checkpoint is kept" in capsys.readouterr().out
    assert (tmp_path / "out" / "ckpt.pt").read_bytes() == good
    events = [json.loads(line) for line in open(tmp_path / "out" / "log.jsonl")]
    assert [e["step"] for e in events if e["event"] == "diverged"] == [4]


@pytest.mark.parametrize("flags, expected", [
    (["--dataset=/no/such/corpus"], "/no/such/corpus"),
    (["--block_size=100000"], "block"),
    (["--resume"], "no checkpoint"),
    (["--grad_accum=0"], "--grad_accum=0 must be a positive integer"),
    (["--vocab_size=100"], "smaller than the tokenizer's 256"),
    (["--device=tpu"], "--device=tpu is not a device"),
    (["--lr=-1"], "--lr=-1.0 must be > 0"),
])
def test_bad_input_is_one_line_and_exit_code_2(corpus, tmp_path, capsys, flags, expected):
    code = train.main([f"--dataset={corpus}", f"--data_dir={tmp_path / 'data'}", f"--out_dir={tmp_path / 'out'}",
                       *TINY, "--max_iters=2", *flags])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("train.py: ") and expected in err


def test_a_damaged_checkpoint_is_one_line(corpus, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "ckpt.pt").write_bytes(b"not a checkpoint")
    assert run(corpus, tmp_path, "--resume") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read" in err


def test_empty_corpus_and_unloadable_tokenizer(tmp_path, capsys, monkeypatch):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert train.main([f"--dataset={empty}", f"--data_dir={tmp_path / 'data'}"]) == 2
    assert capsys.readouterr().err.startswith("train.py: ")
    text = tmp_path / "some.txt"
    text.write_text("some text " * 100)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "no-ranks-here"))
    monkeypatch.setattr("tiktoken.load.read_file", lambda *a, **k: (_ for _ in ()).throw(OSError("offline")))
    monkeypatch.setattr("tiktoken.registry.ENCODINGS", {})
    assert train.main([f"--dataset={text}", "--tokenizer=gpt2", f"--data_dir={tmp_path / 'data'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "TIKTOKEN_CACHE_DIR" in err


def test_a_bad_choice_is_one_line_naming_every_allowed_value(capsys):
    assert train.main(["--norm=groupnorm"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "train.py: --norm=groupnorm is not allowed; choose one of layernorm, rmsnorm, cogview, dyt, batchnorm, "
        "pnv, powernorm, none"]


@pytest.mark.slow
@pytest.mark.parametrize("norm", NORMS)
def test_every_norm_trains(corpus, tmp_path, norm):
    """Every --norm value fills every norm slot and trains; PowerNorm switches out of warmup mid-run."""
    assert run(corpus, tmp_path, f"--norm={norm}", "--max_iters=12", "--eval_interval=12", "--pn_warmup=4") == 0
    losses = [e["loss"] for e in events(tmp_path / "out", "train")]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]


@pytest.mark.slow
@pytest.mark.parametrize("norm", ["batchnorm", "powernorm"])
def test_two_process_ddp_keeps_ranks_identical(corpus, tmp_path, norm):
    """torchrun with 2 gloo processes: training proceeds, and the weights and (batch-statistic) buffers of
    both ranks agree after the steps (rank 0's running statistics win)."""
    result = torchrun(2, *train_argv(corpus, tmp_path / "data", tmp_path / "out", *TINY, f"--norm={norm}",
                                     "--grad_accum=2", "--max_iters=6", "--eval_interval=3", "--pn_warmup=8"))
    assert result.returncode == 0, result.stderr[-2000:]
    evals = events(tmp_path / "out", "eval")
    assert [e["step"] for e in evals] == [0, 3, 6]
    assert all(e["rank_spread"] == 0.0 for e in evals)
    losses = [e["loss"] for e in events(tmp_path / "out", "train")]
    assert losses[-1] < losses[0]


DRIFTED_RANK = """
import sys
sys.path.insert(0, sys.argv[2])
import torch, torch.distributed as dist
from engine import runtime
dist.init_process_group("gloo")
torch.manual_seed(0)
layer = torch.nn.Linear(4, 3)
if dist.get_rank() == 1:
    with torch.no_grad():
        layer.weight[0, 0] += 0.5  # as a gradient that skipped the all-reduce would leave it
spread = runtime.rank_spread(layer)
with open(sys.argv[1] + str(dist.get_rank()), "w") as f:
    f.write(repr(spread))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_rank_spread_sees_one_rank_drift(tmp_path):
    """rank_spread is 0 in every DDP eval above; here rank 1's weights differ by 0.5 in one entry, and both ranks
    report it."""
    script = tmp_path / "drift.py"
    script.write_text(DRIFTED_RANK)
    result = torchrun(2, str(tmp_path / "spread"), ROOT, script=script)
    assert result.returncode == 0, result.stderr[-2000:]
    assert [float((tmp_path / f"spread{rank}").read_text()) for rank in (0, 1)] == [0.5, 0.5]


@pytest.mark.parametrize("device_type, local_rank, processes, gpus, expected", [
    ("cpu", 1, 2, 0, ("cpu", "gloo")), ("cuda", 1, 2, 2, ("cuda:1", "nccl")), ("cuda", 3, 4, 8, ("cuda:3", "nccl")),
    ("cuda", 1, 2, 1, ("cuda:0", "gloo")), ("cuda", 3, 4, 2, ("cuda:1", "gloo")),
])
def test_ddp_processes_share_the_gpus_when_there_are_fewer(monkeypatch, device_type, local_rank, processes, gpus,
                                                           expected):
    """NCCL refuses two processes on one GPU: with more processes than GPUs they take the GPUs in turn over gloo."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    assert runtime.ddp_device(device_type, local_rank, processes) == expected


@pytest.mark.parametrize("name, flag, expected", [
    ("NVIDIA H100 80GB HBM3", None, 989e12), ("NVIDIA H100 PCIe", None, 756e12),
    ("NVIDIA A100-SXM4-40GB", None, 312e12),
    ("NVIDIA H200", None, 989e12), ("NVIDIA H100 NVL", None, 835e12), ("NVIDIA L40", None, 181e12),
    ("NVIDIA L40S", None, 362e12), ("NVIDIA L4", None, 121e12), ("NVIDIA GH200 480GB", None, 989e12),
    ("Some Future GPU", None, None), ("Some Future GPU", 500.0, 500e12),
])
def test_mfu_peak_is_the_gpus_own(monkeypatch, name, flag, expected):
    """nanoGPT issue #182: MFU against a hard-coded A100 peak is wrong on every other GPU."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert runtime.gpu_peak_flops(configs.TrainConfig(gpu_peak_tflops=flag), "cuda") == expected


def test_compile_default_is_per_device():
    assert runtime.resolve_device(configs.TrainConfig(device="cpu"))[1].compile is False
    assert runtime.resolve_device(configs.TrainConfig(device="cpu", compile=True))[1].compile is True
    assert configs.parse_flags(["--compile"]) == {"compile": True}


TRAINING_STEP_FAULTS = """
import resource
import statistics
import sys
import torch
import model
from engine import runtime
import configs
import train
keep = sys.argv[1] == "keep" and runtime.keep_freed_memory()
torch.manual_seed(0)
# The logits and their gradient, 16 x 128 x 8192 floats, are 64 MiB each: above 32 MiB, the most glibc's adaptive
# mmap threshold rises to, so by default every step maps them afresh. The quickstart's own blocks (1-8 MiB) fault
# too, but how often depends on the order of frees that moved the threshold (476 to 5,700 a step measured).
gpt = model.GPT(model.GPTConfig(vocab_size=8192, n_layer=1))
optimizer = train.configure_optimizer(gpt, configs.TrainConfig(), "cpu")
x = torch.randint(0, 8192, (16, gpt.config.block_size))
def step():
    gpt(x, x)[1].backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
for _ in range(3):  # the first steps allocate the gradients and AdamW's states for good
    step()
faults = []
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(keep, statistics.median(faults))  # the median: a kept heap still grows now and then, in one step
"""


def faults_per_training_step(setting):
    """Median minor page faults per training step, in a fresh process (the setting is process-wide and cannot be
    undone), after the steps that allocate gradients and optimizer states."""
    out = subprocess.run([sys.executable, "-c", TRAINING_STEP_FAULTS, setting], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.split()
    return out[0] == "True", float(out[1])


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
                    reason="glibc's allocator only")
def test_keep_freed_memory_stops_the_page_faults_of_each_training_step():
    """By default glibc gives the large blocks a step frees back to the OS, and the next step's activations
    page-fault on first touch; after keep_freed_memory a step reuses the memory of the one before."""
    _, default = faults_per_training_step("default")
    kept, after = faults_per_training_step("keep")
    assert kept
    assert default > 64, default  # 64 MiB is 16,384 pages of 4 KiB, or 32 where transparent huge pages are always on
    assert after < default / 10, (default, after)
