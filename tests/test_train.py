"""train.py end to end on a tiny corpus: exact resume, DDP, mixed precision, checkpoints, bad input."""

import copy
import dataclasses
import json
import math
import os
import subprocess
import sys
import typing

import numpy as np
import pytest
import torch
import torch.nn as nn

import data
from diagnostics import leakage
import model
import norms
from engine import runtime
import configs
import train
from model import GPT, GPTConfig
from norms import NORMS
from conftest import ROOT, TINY, events, prepared, run, run_train, tiny, torchrun, train_argv, without


def test_run_writes_config_log_and_checkpoint(corpus, tmp_path):
    assert run(corpus, tmp_path, *TINY, "--max_iters=6", "--eval_interval=3", "--preset=normformer",
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
    assert run(corpus, tmp_path, *TINY, "--max_iters=6", "--eval_interval=6", "--log_interval=3") == 0
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


def test_a_bpe_tokenizer_pads_the_model_vocab(corpus, tmp_path, small_bpe):
    """The model's vocab is the tokenizer's padded to a multiple of 64 (GPT-2's 50257 to 50304, nanoGPT's; the small
    BPE's 301 to 320)."""
    assert run(corpus, tmp_path, *TINY, "--tokenizer=gpt2", "--max_iters=2", "--eval_interval=2") == 0
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["data"]["vocab_size"] == 301 and config["model"]["vocab_size"] == 320  # 64 * 5


@pytest.mark.slow
def test_resume_continues_exactly(corpus, tmp_path):
    """Ten steps, stop, resume for ten more == twenty steps in one go (fp32 CPU; dropout on, so the RNG
    state must come back too)."""
    common = ["--dropout=0.1", "--lr_decay_iters=20", "--eval_interval=5"]
    assert run(corpus, tmp_path / "whole", *TINY, *common, "--max_iters=20") == 0
    assert run(corpus, tmp_path / "split", *TINY, *common, "--max_iters=10") == 0
    assert run(corpus, tmp_path / "split", *TINY, "--resume", "--max_iters=20") == 0
    whole = events(tmp_path / "whole" / "out", "train")
    split = events(tmp_path / "split" / "out", "train")
    assert [e["step"] for e in split] == list(range(1, 21))
    assert [e["loss"] for e in split] == [e["loss"] for e in whole]
    whole_eval = events(tmp_path / "whole" / "out", "eval")
    split_eval = events(tmp_path / "split" / "out", "eval")
    assert [(e["step"], e["val_loss"]) for e in split_eval] == [(e["step"], e["val_loss"]) for e in whole_eval]


def test_a_run_never_replaces_another_unless_told(corpus, tmp_path, capsys):
    assert run(corpus, tmp_path, *TINY, "--max_iters=3", "--eval_interval=3") == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    capsys.readouterr()
    assert run(corpus, tmp_path, *TINY, "--max_iters=2", "--eval_interval=2") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--resume" in err and "--overwrite" in err
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before
    assert run(corpus, tmp_path, *TINY, "--max_iters=2", "--eval_interval=2", "--overwrite") == 0
    assert [e["step"] for e in events(tmp_path / "out", "train")] == [1, 2]  # a new log
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["ckpt-2.pt", "ckpt.pt", "config.json", "log.jsonl",
                                                                   "run.lock"]


def test_resume_refuses_to_change_the_model(corpus, tmp_path, capsys):
    assert run(corpus, tmp_path, *TINY, "--max_iters=2", "--eval_interval=2") == 0
    assert run(corpus, tmp_path, *TINY, "--resume", "--n_layer=3") == 2
    assert "--n_layer differ from the checkpoint" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mixed_precision_trains_on_cpu(corpus, tmp_path, dtype):
    assert run(corpus, tmp_path, *TINY, f"--dtype={dtype}", "--max_iters=8", "--eval_interval=8") == 0
    losses = [e["loss"] for e in events(tmp_path / "out", "train")]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    scaler = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["scaler"]
    assert bool(scaler) == (dtype == "float16")  # a GradScaler only for float16


@pytest.mark.slow
def test_a_diverged_run_keeps_the_last_good_checkpoint(corpus, tmp_path, monkeypatch, capsys):
    assert run(corpus, tmp_path, *TINY, "--max_iters=4", "--eval_interval=2") == 0
    good = (tmp_path / "out" / "ckpt.pt").read_bytes()
    forward = model.GPT.forward

    def poisoned(self, idx, targets=None):
        logits, loss = forward(self, idx, targets)
        return logits, loss * float("nan")

    monkeypatch.setattr(model.GPT, "forward", poisoned)
    assert run(corpus, tmp_path, *TINY, "--resume", "--max_iters=8") == 3
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
    (["--lr=-1"], "--lr=-1.0 must be in [1e-07, 1000]"),
])
def test_bad_input_is_one_line_and_exit_code_2(corpus, tmp_path, capsys, flags, expected):
    code = train.main([f"--dataset={corpus}", f"--data_dir={tmp_path / 'data'}", f"--out_dir={tmp_path / 'out'}",
                       *without([*TINY, "--max_iters=2"], flags), *flags])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("train.py: ") and expected in err


def test_a_damaged_checkpoint_is_one_line(corpus, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "ckpt.pt").write_bytes(b"not a checkpoint")
    assert run(corpus, tmp_path, *TINY, "--resume") == 2
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
    assert run(corpus, tmp_path, *TINY, f"--norm={norm}", "--max_iters=12", "--eval_interval=12", "--pn_warmup=4") == 0
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


def test_host_read_averages_over_the_processes_and_carries_a_stop_request(monkeypatch):
    """A step's one read of the device: the loss and z-loss term averaged over the processes, this process's
    gradient norm, and a stop request from any process (here the other one's, which all_reduce adds in)."""
    means, grad_norm, stop = torch.tensor([2.5, 0.25]), torch.tensor(1.5, dtype=torch.float64), runtime.StopRequest()
    alone = runtime.host_read(means, grad_norm, stop, runtime.Machine())
    assert alone == runtime.StepRead(loss=2.5, z_loss=0.25, grad_norm=1.5, stop=False)
    stop.requested = True
    assert runtime.host_read(means, grad_norm, stop, runtime.Machine()).stop is True
    other_process = torch.tensor([3.5, 0.75, 1.0])  # its loss, its z-loss term, its stop request
    monkeypatch.setattr(runtime.dist, "all_reduce", lambda tensor: tensor.add_(other_process))
    stop.requested = False
    shared = runtime.host_read(means, grad_norm, stop, runtime.Machine(ddp=True, world_size=2))
    assert shared == runtime.StepRead(loss=3.0, z_loss=0.5, grad_norm=1.5, stop=True)


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
tc = configs.TrainConfig()
optimizer = model.configure_optimizer(gpt, tc.weight_decay, tc.lr, (tc.beta1, tc.beta2), "cpu")
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


# The training math of train.py, pinned against expectations computed independently of it.
#
# - get_lr: the warmup shape, the step where the decay reaches min_lr, cosine and linear values written
#   out from their formulas, constant, and the ramp of NormFormer arXiv v1 §4 (final §6).
# - AdamW groups: weight decay on every weight matrix (Linear, Embedding) and on nothing else: not on
#   biases, norm gains and shifts, HeadScale, ResScale or LayerScale.
# - Gradient accumulation: one optimizer step over k micro-batches equals one step on their concatenation
#   (the loss is divided by the number of micro-steps).
# - Clipping: the logged gradient norm is taken before clipping, the applied gradient is clipped to
#   --grad_clip, and under float16 the GradScaler unscales before clipping; a loss-scale overflow skips the
#   update and halves the scale, and only an overflow at every scale down to 1e-4 is a divergence.
# - Evaluation: in eval mode (no dropout, running statistics, no running-statistic update) over the same
#   windows in every run (whatever the seed, the variant or the number of processes), the model trains again
#   afterwards; batch-statistic norms also log the loss with batch statistics; PowerNorm's warmup default
#   counts training forward calls.
# - The objective: the logged losses are the plain cross-entropy, written out here in float64.
#
# Most tests run train.main in this process for one to three steps of a tiny model and read what it left
# behind: log.jsonl, config.json, and ckpt.pt, whose AdamW state holds the applied gradient after one step
# (exp_avg = (1 - beta1) * g, Loshchilov & Hutter 2019, Alg. 2).

MATH_TINY = tiny(n_layer=1, block_size=16, eval_interval=1, warmup_iters=0, lr="1e-3", min_lr="1e-4")


def finished_run(corpus, out_dir, *flags):
    """train.main in this process; returns out_dir after checking the run finished."""
    code = run_train(corpus, prepared(corpus), out_dir, *MATH_TINY, *flags)
    assert code == 0
    return out_dir


def checkpoint(out_dir):
    return torch.load(out_dir / "ckpt.pt", weights_only=True)


def adam_first_moments(out_dir):
    """exp_avg of every parameter, in the optimizer's order: (1 - beta1) * the gradient of the first step."""
    state = checkpoint(out_dir)["optimizer"]["state"]
    return [state[i]["exp_avg"] for i in sorted(state)]


def total_norm(tensors):
    return math.sqrt(sum(t.double().square().sum().item() for t in tensors))


def record_batches(monkeypatch, training_batch=None):
    """Wraps data.get_batch and returns the list of (training, split, x, y) that train.py draws, in order.
    training: drawn for an optimizer step (with gradients on), not for a divergence report.
    training_batch: an (x, y) handed out instead of every training batch."""
    drawn, get_batch = [], data.get_batch

    def recording(folder, split, batch_size, block_size, generator, device):
        x, y = get_batch(folder, split, batch_size, block_size, generator, device)
        training = torch.is_grad_enabled()
        if training and training_batch:
            x, y = training_batch
        drawn.append((training, split, x, y))
        return x, y

    monkeypatch.setattr(data, "get_batch", recording)
    return drawn


def cross_entropy_by_hand(logits, targets):
    """-mean log softmax(logits)[target], in float64: log p = z - max - log sum exp(z - max)."""
    z = logits.double().reshape(-1, logits.size(-1))
    z = z - z.max(dim=-1, keepdim=True).values
    log_p = z - z.exp().sum(dim=-1, keepdim=True).log()
    return -log_p.gather(1, targets.reshape(-1, 1)).mean().item()


def schedule(**overrides):
    return configs.TrainConfig(**{"lr": 1.0, "min_lr": 0.1, "warmup_iters": 10, "max_iters": 110, **overrides})


def test_warmup_rises_linearly_from_the_first_step_to_lr():
    tc = schedule()
    # lr * (step + 1) / (warmup + 1): the first step already trains, the step after warmup is at lr
    assert train.get_lr(0, tc) == pytest.approx(1 / 11, rel=1e-12)
    assert train.get_lr(4, tc) == pytest.approx(5 / 11, rel=1e-12)
    assert train.get_lr(9, tc) == pytest.approx(10 / 11, rel=1e-12)
    assert train.get_lr(10, tc) == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize("kind, quarter, half, three_quarters", [
    # cosine: min + (lr - min) * (1 + cos(pi * r)) / 2, r the fraction of the decay done
    ("cosine", 0.1 + 0.9 * (2 + math.sqrt(2)) / 4, 0.55, 0.1 + 0.9 * (2 - math.sqrt(2)) / 4),
    # linear: min + (lr - min) * (1 - r)
    ("linear", 0.775, 0.55, 0.325),
])
def test_decay_values(kind, quarter, half, three_quarters):
    tc = schedule(lr_schedule=kind)
    assert train.get_lr(35, tc) == pytest.approx(quarter, rel=1e-12)
    assert train.get_lr(60, tc) == pytest.approx(half, rel=1e-12)
    assert train.get_lr(85, tc) == pytest.approx(three_quarters, rel=1e-12)
    assert train.get_lr(109, tc) > 0.1


@pytest.mark.parametrize("kind", ["cosine", "linear"])
def test_decay_reaches_min_lr_at_lr_decay_iters_and_stays(kind):
    full = schedule(lr_schedule=kind)
    assert [train.get_lr(s, full) for s in (110, 111, 200)] == pytest.approx([0.1] * 3, rel=1e-12)
    shorter = schedule(lr_schedule=kind, lr_decay_iters=60)
    assert train.get_lr(59, shorter) > 0.1
    assert [train.get_lr(s, shorter) for s in (60, 61, 110)] == pytest.approx([0.1] * 3, rel=1e-12)
    assert train.get_lr(35, shorter) == pytest.approx(0.55, rel=1e-12)  # halfway through the shorter decay


def test_constant_schedule_holds_lr_after_warmup():
    tc = schedule(lr_schedule="constant")
    assert train.get_lr(0, tc) == pytest.approx(1 / 11, rel=1e-12)
    assert [train.get_lr(s, tc) for s in (10, 35, 109, 110)] == pytest.approx([1.0] * 4, rel=1e-12)


def test_ramp_is_lr_times_step_over_max_iters():
    """NormFormer arXiv v1 §4 (final §6): LR = lr * step / max_iters, 0 at step 0 and lr at max_iters, ignoring the
    warmup."""
    schedules = typing.get_args(typing.get_type_hints(configs.TrainConfig)["lr_schedule"])
    if "ramp" not in schedules:
        pytest.skip(f"--lr_schedule=ramp is not implemented yet (allowed: {', '.join(schedules)})")
    tc = schedule(lr_schedule="ramp", max_iters=100)
    assert [train.get_lr(s, tc) for s in (0, 5, 10, 50, 100)] == pytest.approx([0.0, 0.05, 0.1, 0.5, 1.0], abs=1e-12)


@pytest.mark.parametrize("tie", [True, False])
def test_weight_decay_on_weight_matrices_only(tie):
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, bias=True, tie_embeddings=tie,
                    scale_heads=True, scale_attn=True, scale_fc=True, scale_resids=True, layer_scale=True,
                    qkv_norm=True, embed_norm=True, ffn_out_norm=True)
    gpt = GPT(cfg)
    tc = configs.TrainConfig(weight_decay=0.07, lr=3e-4, beta1=0.8, beta2=0.95)
    optimizer = model.configure_optimizer(gpt, tc.weight_decay, tc.lr, (tc.beta1, tc.beta2), "cpu")
    # the decision from the module a parameter belongs to, not from its shape
    decayed, names = {}, {}
    for module_name, module in gpt.named_modules():
        for name, p in module.named_parameters(recurse=False):
            decayed[id(p)] = isinstance(module, (nn.Linear, nn.Embedding)) and name == "weight"
            names[id(p)] = f"{module_name}.{name}"
    for kind in ("head_scale", "resid_scale", "attn_layer_scale", "ffn_layer_scale", "proj.bias", "norm.weight",
                 "norm.bias"):
        assert any(kind in n and not decayed[i] for i, n in names.items()), kind  # the model has each kind
    seen = {}
    for group in optimizer.param_groups:
        assert group["lr"] == 3e-4 and group["betas"] == (0.8, 0.95)
        for p in group["params"]:
            assert id(p) not in seen, names[id(p)]
            seen[id(p)] = group["weight_decay"]
    assert set(seen) == set(decayed)
    for i, weight_decay in seen.items():
        assert weight_decay == (0.07 if decayed[i] else 0.0), names[i]


@pytest.mark.slow
def test_accumulated_step_equals_one_step_on_the_concatenated_batch(corpus, tmp_path, monkeypatch):
    """grad_accum=2 with 2 sequences per micro-step == grad_accum=1 with those 4 sequences at once: the same
    logged loss (their mean) and gradient norm, and the same applied gradient in AdamW's state."""
    drawn = record_batches(monkeypatch)
    accumulated = finished_run(corpus, tmp_path / "accumulated", "--grad_accum=2", "--batch_size=2", "--max_iters=1",
                      "--grad_clip=0")
    micro = [(x, y) for training, _, x, y in drawn if training]
    assert len(micro) == 2 and all(x.size(0) == 2 for x, _ in micro)
    concatenated = torch.cat([x for x, _ in micro]), torch.cat([y for _, y in micro])
    record_batches(monkeypatch, training_batch=concatenated)
    whole = finished_run(corpus, tmp_path / "whole", "--grad_accum=1", "--batch_size=4", "--max_iters=1",
                         "--grad_clip=0")
    (a,), (b,) = events(accumulated, "train"), events(whole, "train")
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    for g_a, g_b in zip(adam_first_moments(accumulated), adam_first_moments(whole), strict=True):
        torch.testing.assert_close(g_a, g_b, rtol=1e-5, atol=1e-9)


@pytest.fixture(scope="module")
def unclipped(corpus, tmp_path_factory):
    """One float32 step without clipping: its logged norm is the true gradient norm of step 0."""
    return finished_run(corpus, tmp_path_factory.mktemp("unclipped"), "--max_iters=1", "--grad_clip=0")


def test_grad_clip_logs_the_norm_before_and_applies_the_clipped_gradient(corpus, tmp_path, unclipped):
    (step,) = events(unclipped, "train")
    norm = step["grad_norm"]
    beta1 = json.loads((unclipped / "config.json").read_text())["train"]["beta1"]
    assert total_norm(adam_first_moments(unclipped)) / (1 - beta1) == pytest.approx(norm, rel=1e-5)
    clip = round(norm / 3, 4)
    clipped = finished_run(corpus, tmp_path / "clipped", "--max_iters=1", f"--grad_clip={clip}")
    (step,) = events(clipped, "train")
    assert step["grad_norm"] == pytest.approx(norm, rel=1e-6)  # logged before clipping
    assert total_norm(adam_first_moments(clipped)) / (1 - beta1) == pytest.approx(clip, rel=1e-5)
    for g, g_true in zip(adam_first_moments(clipped), adam_first_moments(unclipped), strict=True):
        torch.testing.assert_close(g, g_true * (clip / norm), rtol=1e-4, atol=1e-10)  # same direction
    loose = finished_run(corpus, tmp_path / "loose", "--max_iters=1", f"--grad_clip={2 * norm}")
    for g, g_true in zip(adam_first_moments(loose), adam_first_moments(unclipped), strict=True):
        torch.testing.assert_close(g, g_true, rtol=1e-6, atol=0.0)  # below the threshold: untouched


def test_float16_clips_the_unscaled_gradient(corpus, tmp_path, unclipped):
    """GradScaler multiplies the loss by 65536 before backward; unscale_ must come before the norm is taken
    and the gradient clipped, or both see the scaled gradient."""
    (step,) = events(unclipped, "train")
    norm = step["grad_norm"]
    half = finished_run(corpus, tmp_path / "half", "--max_iters=1", "--dtype=float16", "--grad_clip=0")
    (step,) = events(half, "train")
    assert step["grad_norm"] == pytest.approx(norm, rel=1e-2)  # float16 activations: close, not equal
    clip = round(norm / 3, 4)
    half_clipped = finished_run(corpus, tmp_path / "half_clipped", "--max_iters=1", "--dtype=float16",
                                f"--grad_clip={clip}")
    beta1 = json.loads((half_clipped / "config.json").read_text())["train"]["beta1"]
    assert total_norm(adam_first_moments(half_clipped)) / (1 - beta1) == pytest.approx(clip, rel=1e-4)


class ScaledFrom(torch.amp.GradScaler):
    """GradScaler starting at 2^23 instead of 2^16: the first steps' float16 gradients overflow for real."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, init_scale=2.0 ** 23, **kwargs)


def test_float16_overflow_skips_the_update_and_halves_the_scale(corpus, tmp_path, monkeypatch):
    """A loss-scale overflow is routine under float16, not a divergence: GradScaler skips that update and halves
    its scale (Micikevicius et al. 2018 §3.2), and the run goes on. At 2^23 the gradient of the mean cross-entropy
    at the float16 logits, scale * (1 - p) / 64 tokens, is above 65504, so step 1 overflows; at the default 2^16
    it does not (test_float16_clips_the_unscaled_gradient), so the run updates again within 10 steps."""
    monkeypatch.setattr(torch.amp, "GradScaler", ScaledFrom)
    out = finished_run(corpus, tmp_path, "--max_iters=10", "--dtype=float16", "--always_save_checkpoint")
    overflows = events(out, "overflow")
    assert overflows[0]["step"] == 1 and len(overflows) < 10
    assert [e["loss_scale"] for e in overflows] == [2.0 ** (23 - k) for k in range(1, len(overflows) + 1)]
    skipped = [e["step"] for e in overflows]
    assert [e["step"] for e in events(out, "train") if e["grad_norm"] is None] == skipped
    assert all(math.isfinite(e["grad_norm"]) for e in events(out, "train") if e["step"] not in skipped)
    assert not events(out, "diverged") and not events(out, "spike")
    # every skipped update is one AdamW step fewer
    steps = {int(s["step"]) for s in checkpoint(out)["optimizer"]["state"].values()}
    assert steps == {10 - len(overflows)}


class AlwaysOverflowing(torch.amp.GradScaler):
    """A GradScaler that finds an infinite gradient at any scale, as when an op overflows float16 unscaled."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, init_scale=2.0 ** -12, **kwargs)

    def unscale_(self, optimizer):
        optimizer.param_groups[0]["params"][0].grad.fill_(math.inf)
        super().unscale_(optimizer)


def test_float16_overflow_at_any_scale_is_a_divergence(corpus, tmp_path, monkeypatch):
    """The scale halves at each overflow; once the next one would be below instruments.MIN_LOSS_SCALE (1e-4, fairseq's
    minimum) the run has diverged: 2^-12 -> 2^-13 = 1.2e-4 at step 1, and at step 2 the next, 6.1e-5, is below."""
    monkeypatch.setattr(torch.amp, "GradScaler", AlwaysOverflowing)
    code = run_train(corpus, prepared(corpus), tmp_path, *MATH_TINY, "--max_iters=5", "--dtype=float16")
    assert code == 3
    assert [(e["step"], e["loss_scale"]) for e in events(tmp_path, "overflow")] == [(1, 2.0 ** -13)]
    (diverged,) = events(tmp_path, "diverged")
    assert diverged["step"] == 1 and "overflow" in diverged["reason"]


def saved_model(out):
    gpt = GPT(GPTConfig(**json.loads((out / "config.json").read_text())["model"]))
    gpt.load_state_dict(checkpoint(out)["model"])
    return gpt.eval()


def eval_windows(corpus, out, split):
    """(x, y) of each of the run's evaluation windows, read from the split's file with numpy, one window a row."""
    config = json.loads((out / "config.json").read_text())
    folder = data.prepare(str(corpus), "byte", prepared(corpus))
    tokens = np.fromfile(os.path.join(folder, f"{split}.bin"), dtype=np.uint16).astype(np.int64)
    T = config["model"]["block_size"]
    starts = data.eval_starts(len(tokens), T, config["train"]["eval_iters"] * config["train"]["batch_size"])
    return [(torch.from_numpy(tokens[i:i + T])[None], torch.from_numpy(tokens[i + 1:i + 1 + T])[None])
            for i in starts]


@pytest.mark.parametrize("norm", ["layernorm", "batchnorm"])
def test_eval_loss_is_the_eval_mode_loss_over_the_fixed_windows(corpus, tmp_path, norm):
    """The eval event after the last step == the mean over the evaluation windows (data.eval_starts) of the saved
    model's eval-mode loss (no dropout, running statistics), each window on its own."""
    out = finished_run(corpus, tmp_path, "--max_iters=1", "--dropout=0.3", f"--norm={norm}")
    gpt = saved_model(out)
    final = events(out, "eval")[-1]
    assert final["step"] == 1
    with torch.no_grad():
        for split in ("train", "val"):
            per_window = [gpt(x, y)[1].item() for x, y in eval_windows(corpus, out, split)]
            assert len(per_window) == 2 * 4  # eval_iters x batch_size
            assert final[f"{split}_loss"] == pytest.approx(sum(per_window) / len(per_window), rel=1e-5)


@pytest.mark.parametrize("flags", [["--seed=7"], ["--norm=rmsnorm", "--seed=7"], ["--norm=batchnorm"]])
def test_eval_windows_do_not_depend_on_the_seed_or_the_variant(corpus, tmp_path, monkeypatch, flags):
    """Every run is scored on the same windows: the starts each evaluation reads, per split, are those of a run
    with the default seed and norm."""
    def eval_reads(out, *more):
        reads, windows = [], data.windows

        def recording(folder, split, starts, block_size, device):
            if not torch.is_grad_enabled():
                reads.append((split, list(starts)))
            return windows(folder, split, starts, block_size, device)

        monkeypatch.setattr(data, "windows", recording)
        finished_run(corpus, out, "--max_iters=2", "--eval_interval=1", *more)
        monkeypatch.undo()
        return reads

    reference = eval_reads(tmp_path / "reference")
    assert len(reference) == 3 * 2 * 2  # 3 evaluations, 2 splits, eval_iters batches
    assert [split for split, _ in reference[:4]] == ["train", "train", "val", "val"]
    assert reference[:4] == reference[4:8] == reference[8:]  # the same at every evaluation
    assert eval_reads(tmp_path / "other", *flags) == reference


def test_eval_with_batch_statistics_is_logged_for_batchnorm_on_the_same_windows(corpus, tmp_path):
    """batchnorm: the eval event also holds the loss of the same windows, in the same batches of batch_size, with
    the norms in training mode (batch statistics; no dropout), and PowerNorm §3's distance ||s_B - s|| / d between
    each val batch's mean and biased variance and the running ones, averaged over norms and batches; all by hand
    here (float64 statistics) from the saved model."""
    out = finished_run(corpus, tmp_path, "--max_iters=1", "--dropout=0.3", "--norm=batchnorm")
    gpt = saved_model(out)
    running = {name: (m.running_mean.clone(), m.running_var.clone()) for name, m in gpt.named_modules()
               if isinstance(m, norms.BatchNorm)}
    seen = []
    for name, m in gpt.named_modules():
        if name in running:
            m.train()
            m.register_forward_pre_hook(lambda m, args, name=name: seen.append((name, args[0].detach().double())))
    final = events(out, "eval")[-1]
    with torch.no_grad():
        for split in ("train", "val"):
            windows = eval_windows(corpus, out, split)
            batches = [windows[b:b + 4] for b in range(0, len(windows), 4)]  # batch_size 4, in order
            seen.clear()
            losses = [gpt(torch.cat([x for x, _ in batch]), torch.cat([y for _, y in batch]))[1].item()
                      for batch in batches]
            assert final[f"{split}_loss_batch_stats"] == pytest.approx(sum(losses) / len(losses), rel=1e-5)
            assert abs(final[f"{split}_loss_batch_stats"] - final[f"{split}_loss"]) > 1e-4
    assert len(seen) == len(running) * 2
    mean_distance = var_distance = 0.0
    for name, x in seen:
        u = x.reshape(-1, x.shape[-1])
        mu = u.mean(0)
        var = ((u - mu) ** 2).mean(0)
        d = u.shape[1]
        mean_distance += (mu - running[name][0].double()).norm().item() / d / len(seen)
        var_distance += (var - running[name][1].double()).norm().item() / d / len(seen)
    assert final["batch_stat_dist"]["mean"] == pytest.approx(mean_distance, rel=1e-4)
    assert final["batch_stat_dist"]["var"] == pytest.approx(var_distance, rel=1e-4)


def test_eval_of_a_per_token_norm_logs_no_batch_statistics(corpus, tmp_path):
    final = events(finished_run(corpus, tmp_path, "--max_iters=1", "--norm=rmsnorm"), "eval")[-1]
    assert set(final) == {"event", "step", "train_loss", "val_loss", "lr", "rank_spread"}


def running_statistics(module):
    """A batch-statistic norm's running statistics, in its STATISTICS' order, as float64 copies."""
    if isinstance(module, norms.BatchNorm):
        return [module.running_mean.double().clone(), module.running_var.double().clone()]
    return [module.running_psi2.double().clone()]


def batch_statistics(module, x):
    """The batch's statistics of x by hand in float64: BatchNorm's mean and biased variance per channel,
    PowerNorm's quadratic mean psi_B^2 (its eq. (8) before the update)."""
    u = x.double().reshape(-1, x.shape[-1])
    if isinstance(module, norms.BatchNorm):
        return [u.mean(0), u.var(0, unbiased=False)]
    return [u.square().mean(0)]


@pytest.mark.parametrize("norm", ["batchnorm", "powernorm"])
def test_leakage_measures_with_batch_statistics_and_gives_the_norms_back_as_they_were(norm):
    """diagnostics.leakage on a model in eval mode (PowerNorm in warmup, so it normalizes with the batch's
    psi_B; no group scaling, so psi_B is of the norm's input): L_B is the loss of a copy whose batch-statistic
    norms train and whose dropout does not, each distance PowerNorm §3's ||s_B - s|| / d written out here,
    averaged over the norms; afterwards every buffer is the same tensor with the same values (PowerNorm replaces
    its buffers by new ones in training, BatchNorm updates its own in place) and every module is in eval mode."""
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(n_layer=2, n_embd=16, n_head=2, block_size=8, vocab_size=32, norm=norm, pn_warmup=5,
                        pn_group_scaling=False, dropout=0.3)).eval()
    x, y = torch.randint(0, 32, (3, 8)), torch.randint(0, 32, (3, 8))
    buffers = {name: (buffer, buffer.clone()) for name, buffer in gpt.named_buffers()}
    reference, seen = copy.deepcopy(gpt), []
    for module in reference.modules():
        if isinstance(module, leakage.BATCH_STATISTIC_NORMS):
            module.train()
            module.register_forward_pre_hook(lambda module, args: seen.append(
                (batch_statistics(module, args[0]), running_statistics(module))))
    with torch.no_grad():
        expected_loss = reference(x, y)[1].item()
        measured = leakage.Leakage(gpt).measure(x, y).tolist()
    d = gpt.config.n_embd
    distances = [[(s_b - s).norm().item() / d for s_b, s in zip(batch, running)] for batch, running in seen]
    assert len(seen) == 2 * 2 + 1  # two per block and the final norm
    assert measured[0] == pytest.approx(expected_loss, rel=1e-6)
    assert measured[1:] == pytest.approx(np.mean(distances, axis=0).tolist(), rel=1e-5)
    for name, buffer in gpt.named_buffers():
        assert buffer is buffers[name][0] and torch.equal(buffer, buffers[name][1]), name
    assert not any(module.training for module in gpt.modules())


def test_leakage_names_the_eval_events_keys():
    """The means over a split's batches become <split>_loss_batch_stats, and on val batch_stat_dist; a model
    without a batch-statistic norm measures and names nothing."""
    batchnorm = leakage.Leakage(GPT(GPTConfig(n_layer=1, n_embd=16, n_head=2, block_size=8, vocab_size=32,
                                              norm="batchnorm")))
    assert len(batchnorm) == 3
    assert batchnorm.named("train", [2.5, 0.1, 0.2]) == {"train_loss_batch_stats": 2.5}
    assert batchnorm.named("val", [2.5, 0.1, 0.2]) == {"val_loss_batch_stats": 2.5,
                                                       "batch_stat_dist": {"mean": 0.1, "var": 0.2}}
    per_token = leakage.Leakage(GPT(GPTConfig(n_layer=1, n_embd=16, n_head=2, block_size=8, vocab_size=32)))
    assert len(per_token) == 0 and per_token.named("val", []) == {}
    assert per_token.measure(torch.zeros(2, 8, dtype=torch.long), torch.zeros(2, 8, dtype=torch.long)).numel() == 0


def test_eval_does_not_update_running_statistics(corpus, tmp_path):
    """batchnorm: more eval batches change nothing in the checkpoint (weights and running statistics)."""
    few = checkpoint(finished_run(corpus, tmp_path / "few", "--max_iters=1", "--norm=batchnorm", "--eval_iters=1"))
    many = checkpoint(finished_run(corpus, tmp_path / "many", "--max_iters=1", "--norm=batchnorm", "--eval_iters=3"))
    assert any("running_mean" in name for name in few["model"])
    for name, tensor in few["model"].items():
        torch.testing.assert_close(many["model"][name], tensor, rtol=0, atol=0, msg=name)


@pytest.mark.slow
def test_powernorm_counts_training_forward_calls(corpus, tmp_path):
    """PowerNorm's warmup default is the LR warmup in training forward calls (warmup_iters x micro-steps,
    one process), and only training forward calls count: the evals at steps 0 and 3 add none, and the
    model trains again after the eval at step 0."""
    out = finished_run(corpus, tmp_path, "--norm=powernorm", "--warmup_iters=2", "--max_iters=3", "--grad_accum=2",
              "--eval_interval=3")
    assert json.loads((out / "config.json").read_text())["model"]["pn_warmup"] == 2 * 2
    calls = {name: t.item() for name, t in checkpoint(out)["model"].items() if name.endswith(".calls")}
    assert calls and set(calls.values()) == {3 * 2}


def test_model_loss_is_cross_entropy_by_hand():
    """Large logits (init_std=1) so that any change to the objective (label smoothing, a z-loss) shows."""
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64, init_std=1.0))
    x, y = torch.randint(64, (4, 16)), torch.randint(64, (4, 16))
    logits, loss = gpt(x, y)
    assert loss.item() == pytest.approx(cross_entropy_by_hand(logits, y), rel=1e-6)
    assert loss.item() > 5.0  # far from uniform (ln 64 = 4.16): the logits are large


def test_logged_losses_are_cross_entropy_by_hand(corpus, tmp_path, monkeypatch):
    """The logged training loss of step 0 and the eval losses at step 0 are the cross-entropy of the logits
    of the initial model; at init (logits near 0) the loss is near ln(vocab)."""
    forwards, forward = [], model.GPT.forward

    def recording(self, idx, targets=None):
        logits, loss = forward(self, idx, targets)
        forwards.append((self.training, cross_entropy_by_hand(logits.detach(), targets)))
        return logits, loss

    monkeypatch.setattr(model.GPT, "forward", recording)
    out = finished_run(corpus, tmp_path, "--max_iters=1")
    vocab = json.loads((out / "config.json").read_text())["model"]["vocab_size"]
    first_eval, (training,) = forwards[:4], [loss for is_training, loss in forwards if is_training]
    assert not any(is_training for is_training, _ in first_eval)
    (step,) = events(out, "train")
    assert step["loss"] == pytest.approx(training, rel=1e-6)
    at_init = events(out, "eval")[0]
    assert (at_init["train_loss"] + at_init["val_loss"]) / 2 == pytest.approx(
        sum(loss for _, loss in first_eval) / 4, rel=1e-6)
    assert abs(step["loss"] - math.log(vocab)) < 0.05


@pytest.mark.slow
def test_ddp_eval_is_the_one_process_eval_over_the_same_windows(corpus, tmp_path):
    """torchrun, 2 processes: each evaluates its share of the windows (data.eval_batches), and the logged loss is
    the mean over all of them, as one process computes it: the same windows whatever the number of processes.
    3 x 3 windows: the shares (5 and 4) end in short batches (2 and 1), which count for their windows alone."""
    result = torchrun(2, *train_argv(corpus, prepared(corpus), tmp_path, *MATH_TINY, "--max_iters=1", "--grad_accum=2",
                                     "--dropout=0.3", "--batch_size=3", "--eval_iters=3"))
    assert result.returncode == 0, result.stderr[-2000:]
    gpt = saved_model(tmp_path)
    final = events(tmp_path, "eval")[-1]
    with torch.no_grad():
        for split in ("train", "val"):
            per_window = [gpt(x, y)[1].item() for x, y in eval_windows(corpus, tmp_path, split)]
            assert final[f"{split}_loss"] == pytest.approx(sum(per_window) / len(per_window), rel=1e-5)
