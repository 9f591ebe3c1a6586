"""The GPU path: mixed precision, torch.compile, exact resume, DDP over NCCL, MFU and sampling on a CUDA GPU.
Every test here is skipped where PyTorch sees no GPU; `python -m lab.device_check` runs them on one. The norms'
forwards and backwards on CUDA against the papers' formulas are in test_norms.py (its `cuda` cases)."""
import copy
import json
import math
import os

import pytest
import torch

import sample
from conftest import ROOT, TINY_CONFIG, prepared, run_train, tiny, torchrun, train_argv
from model import GPT, GPTConfig
from presets import PRESETS
from norms import NORMS

pytestmark = pytest.mark.cuda  # skipped without a GPU (conftest.py)

# the tiny run on the GPU, eager: each test turns on what it is about (a dtype, a compile, torchrun)
GPU_TINY = tiny(device="cuda", compile="False", max_iters=8, eval_interval=4)


def train_losses(out):
    with open(os.path.join(out, "log.jsonl")) as f:
        return [e["loss"] for e in map(json.loads, f) if e["event"] == "train"]


def batch(generator):
    shape = (4, TINY_CONFIG["block_size"])
    return [torch.randint(0, TINY_CONFIG["vocab_size"], shape, generator=generator).cuda() for _ in range(2)]


def loss_and_gradient(model, x, y, dtype):
    """The loss and every parameter's gradient, flattened into one vector, under autocast to dtype."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        loss = model(x, y)[1]
    loss.backward()
    return loss.float(), torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])


def relative_error(got, want):
    return ((got - want).norm() / want.norm()).item()


def test_a_bfloat16_autocast_step_is_finite_and_close_to_float32():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY_CONFIG)).cuda()
    x, y = batch(torch.Generator().manual_seed(1))
    loss32, grad32 = loss_and_gradient(model, x, y, torch.float32)
    loss16, grad16 = loss_and_gradient(model, x, y, torch.bfloat16)
    assert torch.isfinite(loss16) and torch.isfinite(grad16).all()
    # bf16 operands round to 8 bits of mantissa: about 1e-3 to 1e-2 relative error in products and sums
    assert abs(loss16 - loss32).item() / loss32.item() < 1e-2
    assert relative_error(grad16, grad32) < 5e-2


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mixed_precision_runs_are_finite_and_track_float32(corpus, tmp_path, dtype):
    """train.py's bfloat16 autocast, and float16 with its GradScaler, against the same run in float32."""
    data_dir = prepared(corpus)
    assert run_train(corpus, data_dir, tmp_path / "f32", *GPU_TINY, "--dtype=float32") == 0
    assert run_train(corpus, data_dir, tmp_path / dtype, *GPU_TINY, f"--dtype={dtype}") == 0
    ours, reference = train_losses(tmp_path / dtype), train_losses(tmp_path / "f32")
    assert len(ours) == len(reference) == 8 and all(math.isfinite(v) for v in ours)
    assert max(abs(a - b) for a, b in zip(ours, reference)) < 0.05


VARIANTS = [{"norm": kind} for kind in NORMS] + [{"preset": name} for name in PRESETS]


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "=".join(next(iter(v.items()))))
def test_every_norm_and_preset_compiles_on_cuda_to_the_eager_function(variant):
    """torch.compile (inductor, the CUDA default) gives the eager model's loss and gradients, float32."""
    flags = PRESETS[variant["preset"]] if "preset" in variant else variant
    torch.manual_seed(0)
    eager = GPT(GPTConfig(**{**TINY_CONFIG, **flags})).cuda()
    compiled = torch.compile(copy.deepcopy(eager))  # its own buffers: batch-statistic norms update theirs
    x, y = batch(torch.Generator().manual_seed(2))
    loss, grad = loss_and_gradient(eager, x, y, torch.float32)
    compiled_loss, compiled_grad = loss_and_gradient(compiled, x, y, torch.float32)
    assert torch.isfinite(compiled_loss)
    torch.testing.assert_close(compiled_loss, loss, rtol=1e-4, atol=1e-5)
    assert relative_error(compiled_grad, grad) < 1e-3


@pytest.fixture
def deterministic():
    """CUDA kernels that give the same bits on every run (torch.use_deterministic_algorithms; cuBLAS's fixed
    workspace is set in conftest.py, before any cuBLAS call)."""
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


@pytest.mark.slow
def test_resume_on_cuda_reproduces_the_uninterrupted_run_exactly(corpus, tmp_path, deterministic):
    """Exact on CUDA with float32, eager, deterministic algorithms and cuBLAS's fixed workspace; bfloat16 and
    compiled runs resume from the same state but their kernels may sum in another order."""
    data_dir, run = prepared(corpus), [*GPU_TINY, "--dtype=float32", "--lr_decay_iters=8"]
    assert run_train(corpus, data_dir, tmp_path / "whole", *run) == 0
    assert run_train(corpus, data_dir, tmp_path / "parts", *run, "--max_iters=4") == 0
    assert run_train(corpus, data_dir, tmp_path / "parts", *run, "--resume") == 0
    assert train_losses(tmp_path / "parts") == train_losses(tmp_path / "whole")


@pytest.mark.slow
def test_one_process_ddp_runs_over_nccl_and_prints_mfu(corpus, tmp_path):
    script = tmp_path / "say_backend.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {ROOT!r})\n"
        "import torch.distributed as dist\n"
        "import train\n"
        "join = dist.init_process_group\n"
        "def say(*args, **kwargs):\n"
        "    print('backend', kwargs.get('backend'), flush=True)\n"
        "    return join(*args, **kwargs)\n"
        "dist.init_process_group = say\n"
        "sys.exit(train.main(sys.argv[1:]))\n")
    argv = train_argv(corpus, prepared(corpus), tmp_path / "out", *GPU_TINY, "--gpu_peak_tflops=100")
    result = torchrun(1, *argv, script=script)
    assert result.returncode == 0, result.stderr
    assert "backend nccl" in result.stdout
    assert "| MFU " in result.stdout  # train.py's progress line, over the peak given


@pytest.mark.slow
def test_sample_runs_on_cuda_and_repeats_with_its_seed(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_train(corpus, prepared(corpus), out, *GPU_TINY) == 0
    capsys.readouterr()
    argv = [f"--out_dir={out}", "--device=cuda", "--start=norm", "--max_new_tokens=40", "--seed=3"]
    assert sample.main(argv) == 0
    first = capsys.readouterr().out
    assert sample.main(argv) == 0
    assert capsys.readouterr().out == first and len(first) > 40
