"""lab/claims.py and the per-seed metrics of lab/summary.run_record, by hand: the gradient ratios from a hand-made
telemetry log, a diverged run's loss at L_0, the LR sensitivity of one seed, the contrast's sign convention and an
interaction, Holm within a recipe, and the numbers the power and MDE are asked for."""

import json
import math
import os

import pytest

import lab.summary
from lab import claims
from lab import stats
from lab.recipes import Claim


def weight_row(layer, op, name, grad_l2=1.0, grad_mean_abs=1.0):
    return {"layer": layer, "op": op, "name": name, "grad_l2": grad_l2, "grad_mean_abs": grad_mean_abs,
            "update_ratio": None}


def telemetry(step, first_l2, last_l2, first_fc2, last_fc2):
    """A 3-layer model's weight rows: layer 0's L2 norm over its parameters is sqrt(sum of squares) of first_l2,
    layer 2's of last_l2; fc2's weight mean |grad| first_fc2 and last_fc2. Rows outside the blocks (layer None),
    fc2's bias and the middle layer must not count."""
    weights = [weight_row(None, "wte", "wte.weight", grad_l2=1e6, grad_mean_abs=1e6),
               weight_row(1, "fc2", "blocks.1.mlp.proj.weight", grad_l2=1e6, grad_mean_abs=1e6)]
    for layer, l2s, fc2 in ((0, first_l2, first_fc2), (2, last_l2, last_fc2)):
        weights += [weight_row(layer, "qkv", f"blocks.{layer}.attn.qkv.weight", grad_l2=g) for g in l2s[:-1]]
        weights.append(weight_row(layer, "fc2", f"blocks.{layer}.mlp.proj.weight", grad_l2=l2s[-1],
                                  grad_mean_abs=fc2))
        weights.append(weight_row(layer, "fc2", f"blocks.{layer}.mlp.proj.bias", grad_l2=0.0, grad_mean_abs=1e3))
    return {"event": "telemetry", "step": step, "weights": weights, "attn_logit_max": [], "logits": {"mean_log_z": 0.0}}


def write_run(folder, events, entropy=None):
    os.makedirs(folder)
    with open(folder / "log.jsonl", "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in events)
    if entropy is not None:
        config = {"model": {}, "train": {}, "data": {"unigram_entropy": entropy}}  # as train.py writes it
        (folder / "config.json").write_text(json.dumps(config))
    return lab.summary.Run("v", "1e-2", 0, str(folder))


def test_gradient_ratios_from_a_hand_made_telemetry_log(tmp_path):
    events = [{"event": "eval", "lr": 1e-2, "step": 0, "val_loss": 5.5},
              # outside steps 10-100: left out of the average
              telemetry(0, [300.0, 400.0], [1.0, 0.0], 50.0, 1.0),
              # layer 0: sqrt(3^2 + 4^2) = 5 over layer 2's 1: ratio 5; fc2 0.3 / 0.1 = 3
              telemetry(10, [3.0, 4.0], [1.0, 0.0], 0.3, 0.1),
              # sqrt(12^2 + 16^2) = 20 over 1: ratio 20; fc2 0.4 / 0.2 = 2
              telemetry(100, [12.0, 16.0], [0.6, 0.8], 0.4, 0.2),
              telemetry(110, [1.0, 0.0], [100.0, 0.0], 1.0, 50.0),
              {"event": "eval", "lr": 1e-2, "step": 120, "val_loss": 2.0},
              {"event": "done", "step": 120, "val_loss": 2.0}]
    record = lab.summary.run_record(write_run(tmp_path / "run", events))
    assert record["grad_ratio"] == pytest.approx(math.sqrt(5 * 20), rel=1e-12)  # the geometric mean
    assert record["fc2_grad_ratio"] == pytest.approx(math.sqrt(3 * 2), rel=1e-12)
    assert [step for step, _ in record["ratio_curve"]] == [0, 10, 100, 110]  # the figure shows every step
    assert record["ratio_curve"][1][1] == pytest.approx(5.0, rel=1e-12)


def test_a_diverged_run_counts_as_its_loss_at_initialization_and_is_flagged(tmp_path):
    events = [{"event": "eval", "lr": 1e-2, "step": 0, "val_loss": 5.5},
              {"event": "eval", "lr": 1e-2, "step": 10, "val_loss": 4.0},
              {"event": "diverged", "step": 15, "steps_survived": 15, "lr": 1e-2, "reason": "loss bound"}]
    record = lab.summary.run_record(write_run(tmp_path / "run", events))
    assert record["diverged"] and record["status"] == "diverged"
    assert record["final_loss"] == math.inf and record["final_loss_capped"] == 5.5
    assert record["left_plateau"] is None  # no config.json: no entropy to compare with


@pytest.mark.parametrize("final, batch, entropy, left", [(2.0, 1.5, 3.0, True), (2.8, 2.9, 3.0, False)])
def test_leakage_and_the_unigram_plateau(tmp_path, final, batch, entropy, left):
    events = [{"event": "eval", "lr": 1e-2, "step": 0, "val_loss": 5.5},
              {"event": "eval", "lr": 1e-2, "step": 10, "val_loss": final, "val_loss_batch_stats": batch},
              {"event": "done", "step": 10, "val_loss": final}]
    record = lab.summary.run_record(write_run(tmp_path / "run", events, entropy=entropy))
    assert record["leakage"] == pytest.approx(final - batch, abs=1e-15)
    assert record["val_loss_batch_stats"] == batch and record["left_plateau"] is left  # 0.9 x 3.0 = 2.7


def record(variant, seed, lr="1e-2", final=None, init=4.0, diverged=False, **values):
    """A run record as lab/summary.run_record makes it, with the fields the claims read."""
    loss = math.inf if diverged else final
    return {"variant": variant, "lr": lr, "seed": seed, "status": "diverged" if diverged else "done",
            "diverged": diverged, "init_loss": init, "final_loss": loss,
            "final_loss_capped": None if loss is None else min(loss, init), **values}


def test_lr_sensitivity_of_one_seed_by_hand():
    # L_0 = 4; L* = 2.5; min(L, L_0): 3.0, 2.5, 4.0 (4.5 capped), 4.0 (diverged)
    lrs = ["1e-3", "1e-2", "1e-1", "1"]
    runs = [record("v", 0, lr, final) for lr, final in zip(lrs[:3], (3.0, 2.5, 4.5))]
    runs.append(record("v", 0, "1", diverged=True))
    expected = ((3.0 - 2.5) + 0.0 + (4.0 - 2.5) + (4.0 - 2.5)) / 4
    assert claims.seed_lr_sensitivity(runs, lrs) == pytest.approx(expected, abs=1e-15)
    assert claims.seed_lr_sensitivity(runs[:3], lrs) is None  # an LR of the grid missing
    # seed 1 has every LR at 2.0 but one at 3.0: (3.0 - 2.0) / 4
    runs += [record("v", 1, lr, 3.0 if lr == "1" else 2.0) for lr in lrs]
    assert claims.seed_values(runs, "v", "lr_sensitivity", lrs) == {0: pytest.approx(expected), 1: 0.25}


PAIRS = 8


def claim_records(values):
    """{variant: [value per seed]} as final_loss@1e-2 records."""
    return [record(variant, seed, final=value) for variant, per_seed in values.items()
            for seed, value in enumerate(per_seed)]


@pytest.mark.parametrize("expect, signed", [("better", 0.5), ("worse", -0.5)])
def test_the_contrast_is_signed_so_that_positive_is_the_papers_direction(expect, signed):
    # lower loss is better: the variant's 2.0 against the reference's 2.5 is +0.5 in the direction "better"
    records = claim_records({"ref": [2.5] * PAIRS, "v": [2.0] * PAIRS})
    seeds, raw, d, _ = claims.contrast(records, Claim("v", "final_loss@1e-2", expect, "", 0.1, ""), "ref", [])
    assert seeds == list(range(PAIRS)) and raw == [-0.5] * PAIRS and d == [signed] * PAIRS
    # a higher-is-better metric: no flip for "better"
    records = [{**r, "steps_survived": 500 if r["variant"] == "v" else 400} for r in records]
    _, _, d, _ = claims.contrast(records, Claim("v", "steps_survived@1e-2", expect, "", 0.1, ""), "ref", [])
    assert d == [100 * (1 if expect == "better" else -1)] * PAIRS


def test_an_interaction_subtracts_the_second_contrast_per_seed_on_the_seeds_every_arm_ran():
    records = claim_records({"post36": [3.1, 3.2, 3.0], "deep36": [2.4, 2.6, 2.5],
                             "post6": [2.3, 2.4, 2.2], "deep6": [2.2, 2.35, 2.25]})
    records = [r for r in records if not (r["variant"] == "deep6" and r["seed"] == 1)]  # seed 1 unfinished
    claim = Claim("deep36", "final_loss@1e-2", "better", "", 0.25, "", reference="post36", minus=("deep6", "post6"))
    seeds, raw, d, _ = claims.contrast(records, claim, "post6", [])
    # (deep36 - post36) - (deep6 - post6): seed 0: (2.4 - 3.1) - (2.2 - 2.3) = -0.6; seed 2: -0.5 - 0.05 = -0.55
    assert seeds == [0, 2]
    assert raw == pytest.approx([-0.6, -0.55], abs=1e-12) and d == pytest.approx([0.6, 0.55], abs=1e-12)


def test_holm_within_a_recipe_and_the_verdicts():
    # claim a: better on all 8 seeds, p = 2/256; claim b: better on 7 of 8 by the same amount, |sum| = 6 x 0.5:
    # the sign assignments with at most one or at least seven negatives, 2 x (1 + 8) = 18 of 256.
    # Holm with m = 2: a's 2/256 x 2 = 4/256, then b's 18/256 x 1 (already above). Claim c: worse on all 8.
    records = claim_records({"ref": [2.5] * PAIRS, "a": [2.0] * PAIRS, "b": [2.0] * 7 + [3.0],
                             "c": [3.0] * PAIRS})
    two = [Claim("a", "final_loss@1e-2", "better", "", 0.1, ""), Claim("b", "final_loss@1e-2", "better", "", 0.1, "")]
    a, b = claims.judge(records, two, "ref", ["1e-2"])
    assert (a["p"], b["p"]) == (pytest.approx(2 / 256), pytest.approx(18 / 256))
    assert (a["p_holm"], b["p_holm"]) == (pytest.approx(4 / 256), pytest.approx(18 / 256))
    assert a["verdict"] == "agrees" and b["verdict"].startswith("not detected (minimum detectable effect")
    assert a["family"] == 2 and a["alpha_first_step"] == 0.025
    # the same claim b alone: its own family, p = 18/256 = 0.07 still not below 0.05
    [alone] = claims.judge(records, two[1:], "ref", ["1e-2"])
    assert alone["p_holm"] == pytest.approx(18 / 256)
    # four claims: a's 2/256 x 4 = 0.031 still agrees; c against the paper at 2/256 x 3 disagrees
    four = [*two, Claim("c", "final_loss@1e-2", "better", "", 0.1, ""), Claim("a", "final_loss@1e-2", "worse", "",
                                                                              0.1, "")]
    results = claims.judge(records, four, "ref", ["1e-2"])
    assert [r["p_holm"] for r in results] == pytest.approx([8 / 256, 18 / 256, 8 / 256, 8 / 256])
    assert [r["verdict"].split(" (")[0] for r in results] == ["agrees", "not detected", "disagrees", "disagrees"]


def test_effect_interval_power_and_mde_are_asked_with_the_designs_numbers(monkeypatch):
    asked = {"power": [], "mde": []}
    monkeypatch.setattr(stats, "sign_flip_power",
                        lambda n, delta, sd, alpha: asked["power"].append((n, sd, delta, alpha)) or 0.5)
    monkeypatch.setattr(stats, "minimum_detectable_effect",
                        lambda n, sd, alpha, power: asked["mde"].append((n, sd, alpha, power)) or 0.3)
    # differences (variant - reference) of a lower-is-better loss: -0.1 .. -0.8, i.e. +0.1 .. +0.8 in the paper's
    # direction; the reference's median 2.0 (relative effect: 25% of it, 0.5 nats)
    diffs = [0.1 * (k + 1) for k in range(PAIRS)]
    records = claim_records({"ref": [2.0] * PAIRS, "v": [2.0 - x for x in diffs]})
    claim = Claim("v", "final_loss@1e-2", "better", "", 0.25, "", relative=True)
    [result] = claims.judge(records, [claim, Claim("v", "final_loss@1e-2", "worse", "", 0.1, "")], "ref", [])[:1]
    sd = stats_sd(diffs)
    assert asked["power"][0] == (PAIRS, pytest.approx(sd), pytest.approx(0.5), 0.025)  # alpha = 0.05 / 2 claims
    assert asked["mde"][0] == (PAIRS, pytest.approx(sd), 0.025, 0.8)
    assert (result["power"], result["mde"], result["effect_to_detect"]) == (0.5, 0.3, pytest.approx(0.5))
    # the Hodges-Lehmann estimate of 0.1 .. 0.8 is 0.45 (the Walsh averages are symmetric about it); the metric's
    # own sign (variant - reference) flips it and its interval
    assert result["effect"] == pytest.approx(0.45) and result["difference"] == pytest.approx(-0.45)
    low, high = result["effect_ci"]
    assert low < 0.45 < high and result["difference_ci"] == pytest.approx([-high, -low])


def stats_sd(values):
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
