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
- Evaluation: in eval mode (no dropout, running statistics, no running-statistic update), the model
  trains again afterwards, and under DDP the eval loss is the mean over the ranks; PowerNorm's warmup
  default counts training forward calls.
- The objective: the logged losses are the plain cross-entropy, written out here in float64.

Most tests run train.main in this process for one to three steps of a tiny model and read what it left
behind: log.jsonl, config.json, and ckpt.pt, whose AdamW state holds the applied gradient after one step
(exp_avg = (1 - beta1) * g, Loshchilov & Hutter 2019, Alg. 2).
"""

import json
import math
import typing

import pytest
import torch
import torch.nn as nn

import data
import model
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
    training: drawn for an optimizer step, not for evaluate(), which runs under torch.no_grad().
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
    return train.TrainConfig(**{"lr": 1.0, "min_lr": 0.1, "warmup_iters": 10, "max_iters": 110, **overrides})


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
    schedules = typing.get_args(typing.get_type_hints(train.TrainConfig)["lr_schedule"])
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
    tc = train.TrainConfig(weight_decay=0.07, lr=3e-4, beta1=0.8, beta2=0.95)
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

@pytest.mark.parametrize("norm", ["layernorm", "batchnorm"])
def test_eval_loss_is_the_eval_mode_loss(corpus, tmp_path, monkeypatch, norm):
    """The eval event after the last step == the mean loss of the saved model in eval mode (no dropout,
    running statistics) on the batches evaluate() drew."""
    drawn = record_batches(monkeypatch)
    out = run(corpus, tmp_path, "--max_iters=1", "--dropout=0.3", f"--norm={norm}")
    saved = checkpoint(out)
    gpt = GPT(GPTConfig(**json.loads((out / "config.json").read_text())["model"]))
    gpt.load_state_dict(saved["model"])
    gpt.eval()
    last_eval = [d for d in drawn[::-1] if not d[0]][:4]  # eval_iters=2 per split, after the only step
    with torch.no_grad():
        expected = {split: sum(gpt(x, y)[1].item() for _, s, x, y in last_eval if s == split) / 2
                    for split in ("train", "val")}
    final = events(out, "eval")[-1]
    assert final["step"] == 1
    assert final["train_loss"] == pytest.approx(expected["train"], rel=1e-5)
    assert final["val_loss"] == pytest.approx(expected["val"], rel=1e-5)


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
def test_ddp_eval_averages_over_ranks(corpus, tmp_path):
    """torchrun, 2 processes: each draws its own eval batches (batch_generator(seed, rank, EVAL_STREAM, i));
    the logged eval loss is the mean over both ranks' eval-mode losses, not rank 0's alone."""
    result = torchrun(2, *train_argv(corpus, prepared(corpus), tmp_path, *TINY, "--max_iters=1", "--grad_accum=2",
                                     "--dropout=0.3"))
    assert result.returncode == 0, result.stderr[-2000:]
    config = json.loads((tmp_path / "config.json").read_text())
    gpt = GPT(GPTConfig(**config["model"]))
    gpt.load_state_dict(checkpoint(tmp_path)["model"])
    gpt.eval()
    folder = data.prepare(corpus, "byte", prepared(corpus))
    seed, batch_size, block_size = config["train"]["seed"], config["train"]["batch_size"], config["model"]["block_size"]
    per_rank = []
    with torch.no_grad():
        for rank in (0, 1):
            batches = [data.get_batch(folder, "val", batch_size, block_size,
                                      train.batch_generator(seed, rank, train.EVAL_STREAM, i), "cpu") for i in range(2)]
            per_rank.append(sum(gpt(x, y)[1].item() for x, y in batches) / 2)
    assert abs(per_rank[0] - per_rank[1]) > 1e-3  # the ranks saw different batches
    assert events(tmp_path, "eval")[-1]["val_loss"] == pytest.approx(sum(per_rank) / 2, rel=1e-5)
