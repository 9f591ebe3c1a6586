"""The training math of train.py, pinned against expectations computed independently of it.

- get_lr: the warmup shape, the step where the decay reaches min_lr, cosine and linear values written
  out from their formulas, constant, and the ramp of NormFormer §4.
- AdamW groups: weight decay on every weight matrix (Linear, Embedding) and on nothing else: not on
  biases, norm gains and shifts, HeadScale, ResScale or LayerScale.
- Gradient accumulation: one optimizer step over k micro-batches equals one step on their concatenation
  (the loss is divided by the number of micro-steps).
- Clipping: the logged gradient norm is taken before clipping, the applied gradient is clipped to
  --grad_clip, and under float16 the GradScaler unscales before clipping; a loss-scale overflow skips the
  update and halves the scale, and only an overflow at every scale down to 1e-4 is a divergence.
- Evaluation: in eval mode (no dropout, running statistics, no running-statistic update) over the same
  windows in every run (whatever the seed, the variant or the number of processes), the model trains again
  afterwards; batch-statistic norms also log the loss with batch statistics; PowerNorm's warmup default
  counts training forward calls.
- The objective: the logged losses are the plain cross-entropy, written out here in float64.

Most tests run train.main in this process for one to three steps of a tiny model and read what it left
behind: log.jsonl, config.json, and ckpt.pt, whose AdamW state holds the applied gradient after one step
(exp_avg = (1 - beta1) * g, Loshchilov & Hutter 2019, Alg. 2).
"""

import json
import math
import os
import typing

import numpy as np
import pytest
import torch
import torch.nn as nn

import data
import model
import norms
import configs
import train
from model import GPT, GPTConfig
from conftest import prepared, run_train, tiny, torchrun, train_argv

TINY = tiny(n_layer=1, block_size=16, eval_interval=1, warmup_iters=0, lr="1e-3", min_lr="1e-4")


def run(corpus, out_dir, *flags):
    """train.main in this process; returns out_dir after checking the run finished."""
    code = run_train(corpus, prepared(corpus), out_dir, *TINY, *flags)
    assert code == 0
    return out_dir


def events(out_dir, kind):
    with open(out_dir / "log.jsonl") as f:
        return [e for e in map(json.loads, f) if e["event"] == kind]


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


# get_lr: lr 1, min_lr 0.1, 10 warmup steps, decay over steps 10..110; every expectation is the formula.

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
    """NormFormer §4: LR = lr * step / max_iters, 0 at step 0 and lr at max_iters, ignoring the warmup."""
    schedules = typing.get_args(typing.get_type_hints(configs.TrainConfig)["lr_schedule"])
    if "ramp" not in schedules:
        pytest.skip(f"--lr_schedule=ramp is not implemented yet (allowed: {', '.join(schedules)})")
    tc = schedule(lr_schedule="ramp", max_iters=100)
    assert [train.get_lr(s, tc) for s in (0, 5, 10, 50, 100)] == pytest.approx([0.0, 0.05, 0.1, 0.5, 1.0], abs=1e-12)


# AdamW groups

@pytest.mark.parametrize("tie", [True, False])
def test_weight_decay_on_weight_matrices_only(tie):
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, bias=True, tie_embeddings=tie,
                    scale_heads=True, scale_attn=True, scale_fc=True, scale_resids=True, layer_scale=True,
                    qkv_norm=True, embed_norm=True, ffn_out_norm=True)
    gpt = GPT(cfg)
    tc = configs.TrainConfig(weight_decay=0.07, lr=3e-4, beta1=0.8, beta2=0.95)
    optimizer = train.configure_optimizer(gpt, tc, "cpu")
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


# gradient accumulation, clipping, float16

@pytest.mark.slow
def test_accumulated_step_equals_one_step_on_the_concatenated_batch(corpus, tmp_path, monkeypatch):
    """grad_accum=2 with 2 sequences per micro-step == grad_accum=1 with those 4 sequences at once: the same
    logged loss (their mean) and gradient norm, and the same applied gradient in AdamW's state."""
    drawn = record_batches(monkeypatch)
    accumulated = run(corpus, tmp_path / "accumulated", "--grad_accum=2", "--batch_size=2", "--max_iters=1",
                      "--grad_clip=0")
    micro = [(x, y) for training, _, x, y in drawn if training]
    assert len(micro) == 2 and all(x.size(0) == 2 for x, _ in micro)
    concatenated = torch.cat([x for x, _ in micro]), torch.cat([y for _, y in micro])
    record_batches(monkeypatch, training_batch=concatenated)
    whole = run(corpus, tmp_path / "whole", "--grad_accum=1", "--batch_size=4", "--max_iters=1", "--grad_clip=0")
    (a,), (b,) = events(accumulated, "train"), events(whole, "train")
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    for g_a, g_b in zip(adam_first_moments(accumulated), adam_first_moments(whole), strict=True):
        torch.testing.assert_close(g_a, g_b, rtol=1e-5, atol=1e-9)


@pytest.fixture(scope="module")
def unclipped(corpus, tmp_path_factory):
    """One float32 step without clipping: its logged norm is the true gradient norm of step 0."""
    return run(corpus, tmp_path_factory.mktemp("unclipped"), "--max_iters=1", "--grad_clip=0")


def test_grad_clip_logs_the_norm_before_and_applies_the_clipped_gradient(corpus, tmp_path, unclipped):
    (step,) = events(unclipped, "train")
    norm = step["grad_norm"]
    beta1 = json.loads((unclipped / "config.json").read_text())["train"]["beta1"]
    assert total_norm(adam_first_moments(unclipped)) / (1 - beta1) == pytest.approx(norm, rel=1e-5)
    clip = round(norm / 3, 4)
    clipped = run(corpus, tmp_path / "clipped", "--max_iters=1", f"--grad_clip={clip}")
    (step,) = events(clipped, "train")
    assert step["grad_norm"] == pytest.approx(norm, rel=1e-6)  # logged before clipping
    assert total_norm(adam_first_moments(clipped)) / (1 - beta1) == pytest.approx(clip, rel=1e-5)
    for g, g_true in zip(adam_first_moments(clipped), adam_first_moments(unclipped), strict=True):
        torch.testing.assert_close(g, g_true * (clip / norm), rtol=1e-4, atol=1e-10)  # same direction
    loose = run(corpus, tmp_path / "loose", "--max_iters=1", f"--grad_clip={2 * norm}")
    for g, g_true in zip(adam_first_moments(loose), adam_first_moments(unclipped), strict=True):
        torch.testing.assert_close(g, g_true, rtol=1e-6, atol=0.0)  # below the threshold: untouched


def test_float16_clips_the_unscaled_gradient(corpus, tmp_path, unclipped):
    """GradScaler multiplies the loss by 65536 before backward; unscale_ must come before the norm is taken
    and the gradient clipped, or both see the scaled gradient."""
    (step,) = events(unclipped, "train")
    norm = step["grad_norm"]
    half = run(corpus, tmp_path / "half", "--max_iters=1", "--dtype=float16", "--grad_clip=0")
    (step,) = events(half, "train")
    assert step["grad_norm"] == pytest.approx(norm, rel=1e-2)  # float16 activations: close, not equal
    clip = round(norm / 3, 4)
    half_clipped = run(corpus, tmp_path / "half_clipped", "--max_iters=1", "--dtype=float16", f"--grad_clip={clip}")
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
    out = run(corpus, tmp_path, "--max_iters=10", "--dtype=float16", "--always_save_checkpoint")
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
    code = run_train(corpus, prepared(corpus), tmp_path, *TINY, "--max_iters=5", "--dtype=float16")
    assert code == 3
    assert [(e["step"], e["loss_scale"]) for e in events(tmp_path, "overflow")] == [(1, 2.0 ** -13)]
    (diverged,) = events(tmp_path, "diverged")
    assert diverged["step"] == 1 and "overflow" in diverged["reason"]


# evaluation

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
    out = run(corpus, tmp_path, "--max_iters=1", "--dropout=0.3", f"--norm={norm}")
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
        run(corpus, out, "--max_iters=2", "--eval_interval=1", *more)
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
    out = run(corpus, tmp_path, "--max_iters=1", "--dropout=0.3", "--norm=batchnorm")
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
    final = events(run(corpus, tmp_path, "--max_iters=1", "--norm=rmsnorm"), "eval")[-1]
    assert set(final) == {"event", "step", "train_loss", "val_loss", "lr", "rank_spread"}


def test_eval_does_not_update_running_statistics(corpus, tmp_path):
    """batchnorm: more eval batches change nothing in the checkpoint (weights and running statistics)."""
    few = checkpoint(run(corpus, tmp_path / "few", "--max_iters=1", "--norm=batchnorm", "--eval_iters=1"))
    many = checkpoint(run(corpus, tmp_path / "many", "--max_iters=1", "--norm=batchnorm", "--eval_iters=3"))
    assert any("running_mean" in name for name in few["model"])
    for name, tensor in few["model"].items():
        torch.testing.assert_close(many["model"][name], tensor, rtol=0, atol=0, msg=name)


@pytest.mark.slow
def test_powernorm_counts_training_forward_calls(corpus, tmp_path):
    """PowerNorm's warmup default is the LR warmup in training forward calls (warmup_iters x micro-steps,
    one process), and only training forward calls count: the evals at steps 0 and 3 add none, and the
    model trains again after the eval at step 0."""
    out = run(corpus, tmp_path, "--norm=powernorm", "--warmup_iters=2", "--max_iters=3", "--grad_accum=2",
              "--eval_interval=3")
    assert json.loads((out / "config.json").read_text())["model"]["pn_warmup"] == 2 * 2
    calls = {name: t.item() for name, t in checkpoint(out)["model"].items() if name.endswith(".calls")}
    assert calls and set(calls.values()) == {3 * 2}


# the objective

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
    out = run(corpus, tmp_path, "--max_iters=1")
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
    result = torchrun(2, *train_argv(corpus, prepared(corpus), tmp_path, *TINY, "--max_iters=1", "--grad_accum=2",
                                     "--dropout=0.3", "--batch_size=3", "--eval_iters=3"))
    assert result.returncode == 0, result.stderr[-2000:]
    gpt = saved_model(tmp_path)
    final = events(tmp_path, "eval")[-1]
    with torch.no_grad():
        for split in ("train", "val"):
            per_window = [gpt(x, y)[1].item() for x, y in eval_windows(corpus, tmp_path, split)]
            assert final[f"{split}_loss"] == pytest.approx(sum(per_window) / len(per_window), rel=1e-5)
