"""lab/claims.py and the per-seed metrics of lab/summary.run_record, by hand: the gradient ratios from a hand-made
telemetry log, the failure rule (a failed run's loss at ln(V), its other metrics at the worst value, a NaN at
initialization, a seed on which every LR failed), the LR sensitivity of one seed, the contrast's sign convention and
an interaction, Holm within a recipe, the verdicts, and the numbers the power and MDE are asked for."""

import dataclasses
import json
import math
import os

import pytest

import lab.runs
import lab.summary
from lab import claims
from lab import stats
from lab import tables
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


def write_run(folder, events, entropy=None, vocab=256, variant="v", seed=0):
    """A run folder: its log and, with a vocab, a config.json whose data section names it (and the entropy)."""
    os.makedirs(folder)
    with open(folder / "log.jsonl", "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in events)
    data = {k: v for k, v in (("unigram_entropy", entropy), ("vocab_size", vocab)) if v is not None}
    if data:
        config = {"model": {}, "train": {}, "data": data}  # as train.py writes it
        (folder / "config.json").write_text(json.dumps(config))
    return lab.runs.Run(variant, "1e-2", seed, str(folder))


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


def test_a_diverged_run_counts_at_ln_vocab_and_is_flagged(tmp_path):
    events = [{"event": "eval", "lr": 1e-2, "step": 0, "val_loss": 5.9},
              {"event": "eval", "lr": 1e-2, "step": 10, "val_loss": 4.0},
              {"event": "diverged", "step": 15, "steps_survived": 15, "lr": 1e-2, "reason": "loss bound"}]
    record = lab.summary.run_record(write_run(tmp_path / "run", events))
    assert record["diverged"] and record["status"] == "diverged"
    # a uniform guess over 256 byte tokens, not the run's own L_0 of 5.9
    assert record["final_loss"] == math.inf and record["final_loss_capped"] == math.log(256) == record["failure_loss"]
    assert record["left_plateau"] is None  # no unigram entropy in config.json: nothing to compare with
    # without a config.json there is no V, so no counted loss
    assert lab.summary.run_record(write_run(tmp_path / "bare", events, vocab=None))["final_loss_capped"] is None


def test_a_finished_run_above_ln_vocab_is_capped_there(tmp_path):
    events = [{"event": "eval", "lr": 1e-2, "step": 0, "val_loss": 5.9},
              {"event": "eval", "lr": 1e-2, "step": 10, "val_loss": 5.7},
              {"event": "done", "step": 10, "val_loss": 5.7}]
    record = lab.summary.run_record(write_run(tmp_path / "run", events))
    assert record["status"] == "done" and record["final_loss_capped"] == math.log(256)


def diverging_run(init_loss):
    return [{"event": "eval", "lr": 1e-2, "step": 0, "val_loss": init_loss},
            {"event": "train", "step": 1, "lr": 1e-2, "loss": init_loss},
            {"event": "diverged", "step": 5, "steps_survived": 5, "lr": 1e-2, "reason": "loss bound"}]


def test_a_pair_whose_arms_both_diverge_from_different_initial_losses_has_d_zero(tmp_path):
    # normformer_lr's arms start apart (nf_baseline 5.63-5.95, nf_normformer 5.12-5.73): both failing is no
    # difference, not the gap between their initial losses
    runs = [write_run(tmp_path / f"{variant}{seed}", diverging_run(init), variant=variant, seed=seed)
            for seed in range(2) for variant, init in (("ref", 5.9), ("v", 5.2))]
    records = [lab.summary.run_record(run) for run in runs]
    claim = Claim("v", "final_loss@1e-2", "better", "", 0.1, "", "paper")
    seeds, raw, d, _ = claims.contrast(records, claim, "ref", [])
    assert seeds == [0, 1] and raw == [0.0, 0.0] and d == [0.0, 0.0]


def test_a_nan_loss_at_initialization_is_a_failed_run_not_a_crash(tmp_path):
    # a loss that is NaN from the first evaluation on, as an init that overflows gives
    events = [{"event": "eval", "lr": 1e-2, "step": 0, "val_loss": math.nan},
              {"event": "train", "step": 1, "lr": 1e-2, "loss": math.nan},
              {"event": "eval", "lr": 1e-2, "step": 10, "val_loss": math.nan}]
    nan_run = lab.summary.run_record(write_run(tmp_path / "nan", events, variant="v", seed=0))
    assert nan_run["status"] == "diverged" and nan_run["final_loss_capped"] == math.log(256)
    assert claims.failed(nan_run)
    records = [nan_run, record("ref", 0, final=2.0, failure=math.log(256))]
    [result] = claims.judge(records, [Claim("v", "final_loss@1e-2", "better", "", 0.1, "", "paper")], "ref", ["1e-2"])
    assert result["differences"] == [pytest.approx(math.log(256) - 2.0)] and result["diverged"] == {"v": 1, "ref": 0}
    # its spikes, ratios and logits are no measurement either: NaN or not, it counts at the worst value
    spiky = {**nan_run, "spikes": 0, "attn_logit_max": math.nan}
    finished = [record("ref", 0, final=2.0, spikes=3, attn_logit_max=9.0)]
    assert claims.seed_values([spiky, *finished], "v", "spikes@1e-2", []) == {0: 3}
    assert claims.seed_values([spiky, *finished], "v", "attn_logit_max@1e-2", []) == {0: 9.0}
    # nor is a finished run's value that is not a finite number
    done_nan = record("v", 1, final=2.0, attn_logit_max=math.nan)
    assert claims.seed_values([done_nan, *finished], "v", "attn_logit_max@1e-2", []) == {1: 9.0}


@pytest.mark.parametrize("final, batch, entropy, left", [(2.0, 1.5, 3.0, True), (2.8, 2.9, 3.0, False)])
def test_leakage_and_the_unigram_plateau(tmp_path, final, batch, entropy, left):
    events = [{"event": "eval", "lr": 1e-2, "step": 0, "val_loss": 5.5},
              {"event": "eval", "lr": 1e-2, "step": 10, "val_loss": final, "val_loss_batch_stats": batch},
              {"event": "done", "step": 10, "val_loss": final}]
    record = lab.summary.run_record(write_run(tmp_path / "run", events, entropy=entropy))
    assert record["leakage"] == pytest.approx(final - batch, abs=1e-15)
    assert record["val_loss_batch_stats"] == batch and record["left_plateau"] is left  # 0.9 x 3.0 = 2.7


def record(variant, seed, lr="1e-2", final=None, init=5.0, failure=4.0, diverged=False, **values):
    """A run record as lab/summary.run_record makes it, with the fields the claims read; failure stands for
    ln(V)."""
    loss = math.inf if diverged else final
    return {"variant": variant, "lr": lr, "seed": seed, "status": "diverged" if diverged else "done",
            "diverged": diverged, "init_loss": init, "final_loss": loss, "failure_loss": failure,
            "final_loss_capped": None if loss is None else min(loss, failure), **values}


def test_lr_sensitivity_of_one_seed_by_hand():
    # the failure loss F = 4; L* = 2.5; min(L, F): 3.0, 2.5, 4.0 (4.5 capped), 4.0 (diverged)
    lrs = ["1e-3", "1e-2", "1e-1", "1"]
    runs = [record("v", 0, lr, final) for lr, final in zip(lrs[:3], (3.0, 2.5, 4.5))]
    runs.append(record("v", 0, "1", diverged=True))
    expected = ((3.0 - 2.5) + 0.0 + (4.0 - 2.5) + (4.0 - 2.5)) / 4
    assert claims.seed_lr_sensitivity(runs, lrs) == pytest.approx(expected, abs=1e-15)
    assert claims.seed_lr_sensitivity(runs[:3], lrs) is None  # an LR of the grid missing
    # seed 1 has every LR at 2.0 but one at 3.0: (3.0 - 2.0) / 4
    runs += [record("v", 1, lr, 3.0 if lr == "1" else 2.0) for lr in lrs]
    assert claims.seed_values(runs, "v", "lr_sensitivity", lrs) == {0: pytest.approx(expected), 1: 0.25}


def test_a_seed_on_which_every_lr_diverged_stays_in_the_pairs_at_the_worst_sensitivity():
    # seed 0 of v failed at every LR: each LR counts as the failure excess E = F - the lower optimum of the two arms
    # on the seed (ref's 2.0): 4 - 2 = 2, the most any arm can have on it; seed 1 of v and both of ref trained.
    # Without it the pairs would be seed 1 alone.
    lrs = ["1e-2", "1e-1"]
    runs = [record("v", 0, lr, diverged=True) for lr in lrs]
    runs += [record("v", 1, lr, final) for lr, final in zip(lrs, (2.0, 3.0))]
    runs += [record("ref", seed, lr, final) for seed in (0, 1) for lr, final in zip(lrs, (2.0, 2.5))]
    assert claims.seed_lr_sensitivity(runs[:2], lrs) == 4.0
    [result] = claims.judge(runs, [Claim("v", "lr_sensitivity", "better", "", 0.1, "", "paper")], "ref", lrs)
    # ref: (0 + 0.5) / 2 = 0.25 on both seeds; v: E = 2.0 on seed 0, (0 + 1) / 2 = 0.5 on seed 1
    assert result["seeds"] == [0, 1] and result["differences"] == [2.0 - 0.25, 0.5 - 0.25]
    # a seed whose runs all finished at or above F learned nothing either: F as well
    assert claims.seed_lr_sensitivity([record("v", 2, lr, 4.5) for lr in lrs], lrs) == 4.0


PAIRS = 8


def claim_records(values):
    """{variant: [value per seed]} as final_loss@1e-2 records."""
    return [record(variant, seed, final=value) for variant, per_seed in values.items()
            for seed, value in enumerate(per_seed)]


@pytest.mark.parametrize("expect, signed", [("better", 0.5), ("worse", -0.5)])
def test_the_contrast_is_signed_so_that_positive_is_the_papers_direction(expect, signed):
    # lower loss is better: the variant's 2.0 against the reference's 2.5 is +0.5 in the direction "better"
    records = claim_records({"ref": [2.5] * PAIRS, "v": [2.0] * PAIRS})
    seeds, raw, d, _ = claims.contrast(records, Claim("v", "final_loss@1e-2", expect, "", 0.1, "", "paper"), "ref", [])
    assert seeds == list(range(PAIRS)) and raw == [-0.5] * PAIRS and d == [signed] * PAIRS
    # a higher-is-better metric: no flip for "better"
    records = [{**r, "steps_survived": 500 if r["variant"] == "v" else 400} for r in records]
    _, _, d, _ = claims.contrast(records, Claim("v", "steps_survived@1e-2", expect, "", 0.1, "", "paper"), "ref", [])
    assert d == [100 * (1 if expect == "better" else -1)] * PAIRS


def test_an_interaction_subtracts_the_second_contrast_per_seed_on_the_seeds_every_arm_ran():
    records = claim_records({"post36": [3.1, 3.2, 3.0], "deep36": [2.4, 2.6, 2.5],
                             "post6": [2.3, 2.4, 2.2], "deep6": [2.2, 2.35, 2.25]})
    records = [r for r in records if not (r["variant"] == "deep6" and r["seed"] == 1)]  # seed 1 unfinished
    claim = Claim("deep36", "final_loss@1e-2", "better", "", 0.25, "", "paper", reference="post36",
                  minus=("deep6", "post6"))
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
    two = [Claim("a", "final_loss@1e-2", "better", "", 0.1, "", "paper"),
           Claim("b", "final_loss@1e-2", "better", "", 0.1, "", "paper")]
    a, b = claims.judge(records, two, "ref", ["1e-2"])
    assert (a["p"], b["p"]) == (pytest.approx(2 / 256), pytest.approx(18 / 256))
    assert (a["p_holm"], b["p_holm"]) == (pytest.approx(4 / 256), pytest.approx(18 / 256))
    assert a["verdict"] == "agrees" and b["verdict"].startswith("not detected (observed minimum detectable effect")
    assert a["family"] == 2 and a["alpha_first_step"] == 0.025
    # the same claim b alone: its own family, p = 18/256 = 0.07 still not below 0.05
    [alone] = claims.judge(records, two[1:], "ref", ["1e-2"])
    assert alone["p_holm"] == pytest.approx(18 / 256)
    # four claims: a's 2/256 x 4 = 0.031 still agrees; c against the paper at 2/256 x 3 disagrees
    four = [*two, Claim("c", "final_loss@1e-2", "better", "", 0.1, "", "paper"),
            Claim("a", "final_loss@1e-2", "worse", "", 0.1, "", "paper")]
    results = claims.judge(records, four, "ref", ["1e-2"])
    assert [r["p_holm"] for r in results] == pytest.approx([8 / 256, 18 / 256, 8 / 256, 8 / 256])
    assert [r["verdict"].split(" (")[0] for r in results] == ["agrees", "not detected", "disagrees", "disagrees"]


def test_effect_interval_power_and_mde_are_asked_with_the_designs_numbers(monkeypatch):
    asked = {"power": [], "mde": []}
    monkeypatch.setattr(stats, "sign_flip_power",
                        lambda n, delta, sd, alpha: asked["power"].append((n, sd, delta, alpha)) or 0.5)
    monkeypatch.setattr(stats, "minimum_detectable_effect",
                        lambda n, sd, alpha, power: asked["mde"].append((n, sd, alpha, power)) or 0.3)
    # 3 pilot seeds (0-2): differences +1, +2, +4 in the paper's direction, the reference's median 4.0 there; then
    # 8 tested seeds whose differences (variant - reference) of a lower-is-better loss are -0.1 .. -0.8, i.e.
    # +0.1 .. +0.8 in the paper's direction, the reference's median 2.0. The a-priori power is the pilot's: its sd,
    # the target relative to its reference median (25% of 4.0: 1.0 nats), the 8 planned pairs; the observed MDE
    # is the tested pairs' own
    pilot = [1.0, 2.0, 4.0]
    diffs = [0.1 * (k + 1) for k in range(PAIRS)]
    records = claim_records({"ref": [4.0] * 3 + [2.0] * PAIRS,
                             "v": [4.0 - x for x in pilot] + [2.0 - x for x in diffs]})
    claim = Claim("v", "final_loss@1e-2", "better", "", 0.25, "", "paper", relative=True)
    worse = Claim("v", "final_loss@1e-2", "worse", "", 0.1, "", "paper")
    [result] = claims.judge(records, [claim, worse], "ref", [], pilot=3)[:1]
    # planned at the pilot sd's 80% upper bound (3 values: sqrt(2 / chi2_0.2(2)), chi2_0.2(2) = -2 ln 0.8), and
    # at the estimate beside it
    bound = stats_sd(pilot) * math.sqrt(2 / (-2 * math.log(0.8)))
    assert asked["power"][0] == (PAIRS, pytest.approx(bound), pytest.approx(1.0), 0.025)  # 0.05 / 2
    assert asked["power"][1] == (PAIRS, pytest.approx(stats_sd(pilot)), pytest.approx(1.0), 0.025)
    assert asked["mde"][0] == (PAIRS, pytest.approx(stats_sd(diffs)), 0.025, 0.8)
    assert result["pilot_seeds"] == [0, 1, 2] and result["seeds"] == list(range(3, 3 + PAIRS))
    assert (result["power"], result["mde"], result["effect_to_detect"]) == (0.5, 0.3, pytest.approx(1.0))
    # the mean of 0.1 .. 0.8 is 0.45, inside its interval (the subset means of 0.1 .. 0.8 are symmetric about it);
    # the metric's own sign (variant - reference) flips it and its interval
    assert result["effect"] == pytest.approx(0.45) and result["difference"] == pytest.approx(-0.45)
    low, high = result["effect_ci"]
    assert low < 0.45 < high and result["difference_ci"] == pytest.approx([-high, -low])


def stats_sd(values):
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def test_a_variant_that_diverges_on_every_seed_is_never_better_on_spikes():
    # the variant died before it could spike (0 spikes logged) on all 8 seeds; the reference trained and spiked 1-3
    # times. Its spikes count at the worst any finished run had at the LR, 3: never fewer than the reference's
    spikes = [1, 2, 1, 3, 2, 1, 2, 1]
    records = [record("ref", s, final=2.0, spikes=n) for s, n in enumerate(spikes)]
    records += [record("v", s, diverged=True, spikes=0) for s in range(PAIRS)]
    [result] = claims.judge(records, [Claim("v", "spikes@1e-2", "better", "", 1.0, "", "paper")], "ref", ["1e-2"])
    assert result["differences"] == [3 - n for n in spikes]  # variant - reference, in spikes
    assert result["effect"] < 0 and result["reading"] == "disagrees" and result["diverged"] == {"v": 8, "ref": 0}
    # every pair holds a failed run: without them no pair is left, so the verdict rests on the failure rule
    assert result["verdict"].endswith("; rests on the failure rule (without the failed runs: no pair is left)")
    # both arms failing on every seed: every d is 0, whatever spikes they logged
    both = [{**r, "status": "diverged", "diverged": True} if r["variant"] == "ref" else r for r in records]
    both.append(record("other", 0, final=2.0, spikes=7))  # another arm's finished run sets the worst value
    [result] = claims.judge(both, [Claim("v", "spikes@1e-2", "better", "", 1.0, "", "paper")], "ref", ["1e-2"])
    assert result["differences"] == [0] * PAIRS and result["p"] == 1.0 and result["reading"] != "agrees"


def test_the_diverged_runs_counted_per_claim_are_its_arms_at_its_lr_on_its_seeds():
    records = claim_records({"ref": [2.5] * PAIRS, "v": [2.0] * PAIRS})
    records = [record(r["variant"], r["seed"], diverged=True) if (r["variant"], r["seed"]) in
               (("v", 0), ("v", 3), ("ref", 5)) else r for r in records]
    records += [record("v", 1, "1e-1", diverged=True),  # another LR: not this claim's
                record("other", 2, diverged=True),  # another arm
                record("ref", 9, diverged=True)]  # a seed v did not run: not among the pairs, but missing for v
    [result] = claims.judge(records, [Claim("v", "final_loss@1e-2", "better", "", 0.1, "", "paper")], "ref", ["1e-2"])
    assert result["diverged"] == {"v": 2, "ref": 1}
    assert result["missing"] == {"v": 1, "ref": 0} and result["n"] == PAIRS


def test_a_claim_without_pairs_stays_in_holms_family():
    # claim a: better on all 8 seeds, p = 2/256; claim b's variant never ran: it enters Holm as p = 1, so a's
    # adjusted p is 2 x 2/256, not 2/256
    records = claim_records({"ref": [2.5] * PAIRS, "a": [2.0] * PAIRS})
    two = [Claim("a", "final_loss@1e-2", "better", "", 0.1, "", "paper"),
           Claim("b", "final_loss@1e-2", "better", "", 0.1, "", "paper")]
    a, b = claims.judge(records, two, "ref", ["1e-2"])
    assert a["p_holm"] == pytest.approx(4 / 256) and (b["n"], b["p"], b["p_holm"]) == (0, None, None)
    assert b["verdict"] == "not run yet" and b["missing"] == {"b": PAIRS, "ref": 0}


def test_best_loss_takes_each_arm_at_its_own_best_lr():
    # v: median 2.0 at 1e-2, 3.0 at 1e-1; its best LR is 1e-2, whatever the reference's is
    records = [record("v", s, "1e-2", 2.0 + s / 100) for s in range(3)]
    records += [record("v", s, "1e-1", 3.0 - s / 100) for s in range(3)]
    assert claims.seed_values(records, "v", "best_loss", ["1e-2", "1e-1"]) == {0: 2.0, 1: 2.01, 2: 2.02}
    # a diverged run at the best LR counts at F = 4 there; the median still picks 1e-2 (2.0, 2.01, 4 against 3)
    records[2] = record("v", 2, "1e-2", diverged=True)
    assert claims.seed_values(records, "v", "best_loss", ["1e-2", "1e-1"]) == {0: 2.0, 1: 2.01, 2: 4.0}


def test_one_pair_detects_nothing_and_says_so():
    records = claim_records({"ref": [2.5], "v": [2.0]})
    [result] = claims.judge(records, [Claim("v", "final_loss@1e-2", "better", "", 0.1, "", "paper")], "ref", ["1e-2"])
    # no pilot: no a-priori power
    assert (result["n"], result["p"], result["sd"], result["power"], result["mde"]) == (1, 1.0, None, None, math.inf)
    assert result["verdict"] == "not detected (no effect is detectable with these seeds)"
    assert result["ci_coverage"] == 0.0 and result["effect_ci"] == [0.5, 0.5]  # 1 - 2/2: [min, max] covers nothing


def test_smaller_than_the_target_and_whose_target_it_is():
    # d = 0.005 .. 0.012 on 8 seeds: agrees in direction, but the interval ends below the paper's 0.024
    records = claim_records({"ref": [2.5] * PAIRS, "v": [2.5 - 0.001 * (5 + k) for k in range(PAIRS)]})
    paper = Claim("v", "final_loss@1e-2", "better", "", 0.024, "Table 7: ln(16.37 / 15.98) = 0.024 nats", "paper")
    [result] = claims.judge(records, [paper], "ref", ["1e-2"])
    assert result["target_origin"] == "paper" and result["reading"] == "smaller" and result["p"] < 0.05
    assert result["verdict"].startswith("smaller than the paper's (detected in its direction; the interval ends")
    assert result["ci_coverage"] == 1 - 12 / 256 and result["effect_ci"][1] < 0.024
    # the same effect on 5 seeds: its interval, [min, max], covers 1 - 2/32 = 93.8% only, so it excludes nothing
    [result] = claims.judge([r for r in records if r["seed"] < 5], [paper], "ref", ["1e-2"])
    assert result["ci_coverage"] == 1 - 2 / 32 and result["effect_ci"][1] < 0.024
    assert result["verdict"] == "not detected (no effect is detectable with these seeds)"
    ours = Claim("v", "final_loss@1e-2", "better", "", 0.001, "a quarter, fixed before the runs", "nanonorm")
    [result] = claims.judge(records, [ours], "ref", ["1e-2"])
    assert (result["target_origin"], result["reading"], result["verdict"]) == ("nanonorm", "agrees", "agrees")


def test_a_tested_claims_interval_is_at_the_familys_level_and_smaller_than_rests_on_it():
    # the same d = 0.005 .. 0.012 on 8 seeds as above, alone and in a family of three: Bonferroni's 1 - 0.05/3
    # takes the 2nd order statistic of the 255 subset means, 1 - 4/256 = 98.4%: the target 0.011 lies past the 95.3%
    # interval's end (0.0107), inside the family's (0.0115)
    d = [0.001 * (5 + k) for k in range(PAIRS)]
    records = claim_records({"ref": [2.5] * PAIRS, "v": [2.5 - x for x in d], "w": [2.6] * PAIRS})
    claim = Claim("v", "final_loss@1e-2", "better", "", 0.011, "", "paper")
    [alone] = claims.judge(records, [claim], "ref", ["1e-2"])
    assert alone["ci_coverage"] == 1 - 12 / 256 and alone["effect_ci"][1] < 0.011
    assert alone["verdict"].startswith("smaller than the paper's")
    others = [Claim("w", "final_loss@1e-2", "worse", "", 0.1, "", "paper")] * 2
    first, *_ = claims.judge(records, [claim, *others], "ref", ["1e-2"])
    means = sorted(sum(x for x, bit in zip(d, range(PAIRS)) if mask >> bit & 1) / bin(mask).count("1")
                   for mask in range(1, 2 ** PAIRS))
    assert first["ci_coverage"] == 1 - 4 / 256 and first["effect_ci"] == pytest.approx([means[1], means[-2]])
    assert means[-2] > 0.011 > alone["effect_ci"][1]
    assert first["verdict"] == "agrees"  # p = 2/256, x 3 = 0.023: detected, and the interval reaches the target
    # a descriptive claim is outside the family: its interval stays at 95%
    descriptive, *_ = claims.judge(records, [dataclasses.replace(claim, tested=False), *others], "ref", ["1e-2"])
    assert descriptive["ci_coverage"] == 1 - 12 / 256


def test_pairs_whose_arms_all_failed_were_not_measured_and_detect_nothing():
    # every run of both arms diverged at the LR: the failure rule gives d = 0 on every seed, which alone would read
    # as "smaller than the paper's" with an interval of [0, 0]
    failing = [record(v, s, diverged=True) for v in ("ref", "v") for s in range(PAIRS)]
    claim = Claim("v", "final_loss@1e-2", "better", "", 0.05, "", "paper")
    [result] = claims.judge(failing, [claim], "ref", ["1e-2"])
    assert result["differences"] == [0.0] * PAIRS and result["unmeasured"] == PAIRS
    assert result["verdict"].startswith("not detected (every run behind both arms' values failed")
    # two seeds measured on both arms: those pairs count as measured, and the verdict comes from the numbers
    mixed = [r for r in failing if r["seed"] >= 2] + claim_records({"ref": [2.5, 2.5], "v": [2.49, 2.51]})
    [result] = claims.judge(mixed, [claim], "ref", ["1e-2"])
    assert result["unmeasured"] == PAIRS - 2 and not result["verdict"].startswith("not detected (every run")
    # one arm finished on a seed: that pair measured something (the other arm's failure against a loss)
    one_side = [r for r in failing if not (r["variant"] == "v" and r["seed"] == 0)] + [record("v", 0, final=2.0)]
    [result] = claims.judge(one_side, [claim], "ref", ["1e-2"])
    assert result["unmeasured"] == PAIRS - 1
    # steps survived: a failure is what it measures, so nothing is unmeasured
    survived = [{**r, "steps_survived": 100} for r in failing]
    [result] = claims.judge(survived, [dataclasses.replace(claim, metric="steps_survived@1e-2")], "ref", ["1e-2"])
    assert result["unmeasured"] == 0


def test_whose_target_it_is_comes_from_the_claims_own_field_not_its_text():
    records = claim_records({"ref": [2.5] * PAIRS, "v": [2.5 - 0.001 * (5 + k) for k in range(PAIRS)]})
    worded = Claim("v", "final_loss@1e-2", "better", "", 0.024, "not nanonorm's choice: the paper's", "paper")
    [result] = claims.judge(records, [worded], "ref", ["1e-2"])
    assert result["target_origin"] == "paper" and result["verdict"].startswith("smaller than the paper's")
    worded = Claim("v", "final_loss@1e-2", "better", "", 0.024, "Table 7", "nanonorm")
    [result] = claims.judge(records, [worded], "ref", ["1e-2"])
    assert result["verdict"].startswith("smaller than nanonorm's target")
    with pytest.raises(ValueError, match="target_origin"):
        Claim("v", "final_loss@1e-2", "better", "", 0.024, "Table 7", "theirs")


def test_gradient_evenness_is_the_absolute_log_ratio():
    """A ratio of 1/4 is as uneven as one of 4: a variant that overshoots below 1 must not score as a win."""
    ratios = {"ref": [2.0] * PAIRS, "over": [0.25] * PAIRS, "even": [1.0 + 0.01 * k for k in range(PAIRS)]}
    records = [{**record(arm, s, final=2.0), "grad_ratio": value} for arm, values in ratios.items()
               for s, value in enumerate(values)]
    values = claims.seed_values(records, "over", "grad_ratio@1e-2", ["1e-2"])
    assert values == {s: pytest.approx(math.log(4)) for s in range(PAIRS)}
    over, even = claims.judge(records, [Claim(arm, "grad_ratio@1e-2", "better", "", 0.25, "", "nanonorm",
                                              relative=True) for arm in ("over", "even")], "ref", ["1e-2"])
    assert over["reading"] == "disagrees" and over["effect"] == pytest.approx(math.log(2) - math.log(4))
    assert even["reading"] == "agrees"


def test_a_descriptive_claim_stays_out_of_holms_family():
    records = claim_records({"ref": [2.5] * PAIRS, "a": [2.4] * PAIRS, "b": [2.4] * PAIRS})
    tested = Claim("a", "final_loss@1e-2", "better", "", 0.01, "", "nanonorm")
    shown = Claim("b", "final_loss@1e-2", "better", "", 0.01, "", "nanonorm", tested=False)
    alone, beside = claims.judge(records, [tested, shown], "ref", ["1e-2"])
    assert alone["p_holm"] == alone["p"] == 2 / 2 ** PAIRS and alone["family"] == 1
    assert (beside["p"], beside["p_holm"], beside["verdict"]) == (2 / 2 ** PAIRS, None, "descriptive")


def test_best_loss_with_a_pilot_chooses_each_arms_lr_on_the_pilot_seeds_and_tests_the_others():
    # the arm's LR 1e-2 is best on the pilot seeds 0-1 and worst on the others: the pilot's choice holds
    records = [{**record("v", s, final=2.0 if s < 2 else 3.0), "lr": "1e-2"} for s in range(6)]
    records += [{**record("v", s, final=2.5), "lr": "3e-3"} for s in range(6)]
    records += [{**record("ref", s, final=2.5 if lr == "3e-3" else 2.6), "lr": lr} for s in range(6)
                for lr in ("1e-2", "3e-3")]
    values = claims.seed_values(records, "v", "best_loss", ["3e-3", "1e-2"], pilot=2)
    assert values == {s: 2.0 if s < 2 else 3.0 for s in range(6)}
    [result] = claims.judge(records, [Claim("v", "best_loss", "better", "", 0.1, "", "paper")], "ref",
                            ["3e-3", "1e-2"], pilot=2)
    assert result["seeds"] == [2, 3, 4, 5] and result["effect"] == -0.5
    # the page says which LR each arm was read at
    assert result["chosen_lr"] == {"v": "1e-2", "ref": "3e-3"}
    assert "| final val loss, each at its best LR (read at: v 1e-2, ref 3e-3) |" in tables.claims_table([result])


def test_a_binary_endpoint_is_the_exact_mcnemar_test_on_the_pairs():
    # left the plateau: the variant on 7 of 8 seeds, the reference on none (one reference run diverged: it did not
    # leave). Discordant pairs 7 to 0: p = 2 / 2^7 = 1/64, as scipy's binomial test of 7 of 7
    records = [record("v", s, final=2.0, left_plateau=s != 3) for s in range(PAIRS)]
    records += [record("ref", s, final=3.0, left_plateau=False) for s in range(PAIRS - 1)]
    records.append(record("ref", PAIRS - 1, diverged=True, left_plateau=None))
    [result] = claims.judge(records, [Claim("v", "left_plateau@1e-2", "better", "", 0.5, "", "paper")], "ref", ["1e-2"])
    assert result["endpoint"] == "binary" and result["discordant"] == [7, 0] and result["p"] == 1 / 64
    assert result["effect"] == 7 / 8 and result["effect_ci"] is None and result["verdict"] == "agrees"
    survived = claims.seed_values(records, "ref", "survived@1e-2", [])
    assert survived == {**{s: 1 for s in range(PAIRS - 1)}, PAIRS - 1: 0}


def lr_records(variant, losses, seeds, failed_lrs=()):
    """{lr: loss} per seed as records; an LR of failed_lrs diverged."""
    return [record(variant, s, lr, final=loss, diverged=lr in failed_lrs) if lr not in failed_lrs
            else record(variant, s, lr, diverged=True) for s in seeds for lr, loss in losses.items()]


BRACKET_GRID = ["1e-3", "2e-3", "4e-3"]


@pytest.mark.parametrize("v_losses, problem", [
    ({"1e-3": 2.5, "2e-3": 2.2, "4e-3": 2.4}, None),  # the optimum, 2e-3, inside a 2x grid
    ({"1e-3": 2.5, "2e-3": 2.4, "4e-3": 2.2}, "v: its best LR, 4e-3, is the grid's highest"),
    ({"1e-3": 2.2, "2e-3": 2.4, "4e-3": 2.5}, "v: its best LR, 1e-3, is the grid's lowest")])
def test_a_best_lr_at_the_grids_edge_is_not_bracketed_and_gets_no_verdict(v_losses, problem):
    # pilot seeds 0-2 choose the LRs; seeds 3-10 are tested; v is 0.3 below ref at every LR, ref best at 2e-3
    ref = {"1e-3": 2.8, "2e-3": 2.5, "4e-3": 2.7}
    records = lr_records("ref", ref, range(11)) + lr_records("v", {lr: x for lr, x in v_losses.items()}, range(11))
    other = Claim("v", "final_loss@2e-3", "better", "", 0.1, "", "paper")
    best, at_lr = claims.judge(records, [Claim("v", "best_loss", "better", "", 0.1, "", "paper"), other], "ref",
                               BRACKET_GRID, pilot=3)
    assert best["seeds"] == list(range(3, 11)) and best["pilot_seeds"] == [0, 1, 2]
    if problem is None:
        assert best["unbracketed"] == {} and best["reading"] == "agrees"
        assert at_lr["p_holm"] == pytest.approx(2 * 2 / 256)
    else:
        assert best["unbracketed"] == {"v": problem.partition(": ")[2]}
        assert best["verdict"] == f"optimum not bracketed ({problem}): no verdict"
        assert best["reading"] == "not bracketed"
        # it stays in Holm's family as p = 1: the other claim pays for it as fixed before the runs
        assert at_lr["p_holm"] == pytest.approx(2 * 2 / 256)


def test_a_best_lr_whose_neighbours_are_more_than_2x_away_is_not_bracketed():
    grid = ["1e-3", "3e-3", "1e-2"]
    records = lr_records("ref", {"1e-3": 2.8, "3e-3": 2.5, "1e-2": 2.7}, range(5))
    records += lr_records("v", {"1e-3": 2.5, "3e-3": 2.2, "1e-2": 2.4}, range(5))
    [best] = claims.judge(records, [Claim("v", "best_loss", "better", "", 0.1, "", "paper")], "ref", grid, pilot=3)
    assert best["unbracketed"] == {"v": "its best LR, 3e-3, has a neighbour (1e-3) more than 2x away",
                                   "ref": "its best LR, 3e-3, has a neighbour (1e-3) more than 2x away"}
    # the LR sensitivity is defined on its grid (Wortsman et al.'s 3x steps): only an edge optimum unbrackets it
    [sensitivity] = claims.judge(records, [Claim("v", "lr_sensitivity", "better", "", 0.1, "", "paper")], "ref",
                                 grid, pilot=3)
    assert sensitivity["unbracketed"] == {}


def test_lr_sensitivity_does_not_charge_an_arm_for_a_better_optimum():
    # Wortsman et al. compare each arm with its own optimum. v is 0.1 nats better than ref at every LR where they
    # train, and fails at the same 3 of 8 LRs. Counting a failure as ln V - the arm's own L* charged v 0.1 nats
    # more at each failed LR (d = -0.1 x 3 / 8 on every seed: "disagrees"); the failure excess is one number for
    # both arms, so d is 0 on every seed
    lrs = ["3e-4", "1e-3", "3e-3", "1e-2", "3e-2", "1e-1", "3e-1", "1"]
    ref = dict(zip(lrs, [3.0, 2.6, 2.3, 2.2, 2.4, 0, 0, 0]))
    records = []
    for seed in range(8):
        jitter = seed / 100
        records += lr_records("ref", {lr: x + jitter for lr, x in ref.items()}, [seed], failed_lrs=lrs[5:])
        records += lr_records("v", {lr: x + jitter - 0.1 for lr, x in ref.items()}, [seed], failed_lrs=lrs[5:])
    [result] = claims.judge(records, [Claim("v", "lr_sensitivity", "better", "", 0.1, "", "paper")], "ref", lrs)
    assert result["differences"] == pytest.approx([0.0] * 8, abs=1e-12)
    assert result["p"] == 1.0 and result["reading"] == "smaller"  # [0, 0] excludes the target: never "disagrees"
    # v on seed 0: its excess over its own optimum 2.1 at the trained LRs, E = 4 - 2.1 at the 3 failed ones
    assert result["arm_medians"]["v"] == pytest.approx((0.8 + 0.4 + 0.1 + 0 + 0.2 + 3 * 1.9) / 8 - 0.035 * 3 / 8)


def test_a_verdict_that_only_the_failure_rule_gives_says_it_rests_on_it():
    # ref failed on seeds 0-6 (counted at F = 4 by the failure rule); on seed 7, the one pair without a failed run,
    # v is 0.01 worse. The failure rule: d = +2 on 7 seeds, -0.01 on one, p = 4 / 256 -> agrees; without the failed
    # runs one pair is left, which detects nothing
    records = [record("ref", s, diverged=True) if s < 7 else record("ref", s, final=2.0) for s in range(PAIRS)]
    records += [record("v", s, final=2.0 if s < 7 else 2.01) for s in range(PAIRS)]
    [result] = claims.judge(records, [Claim("v", "final_loss@1e-2", "better", "", 0.1, "", "paper")], "ref",
                            ["1e-2"])
    assert result["p"] == pytest.approx(4 / 256) and result["reading"] == "agrees"
    second = result["second_rule"]
    assert second["seeds"] == [7] and second["differences"] == pytest.approx([0.01])
    assert result["verdict"] == ("agrees; rests on the failure rule (without the failed runs: not detected)")
    # no failed run: no second rule to compare with
    clean = [r for r in records if r["seed"] == 7] + [record(v, s, final=2.0) for v in ("ref", "v") for s in range(7)]
    [result] = claims.judge(clean, [Claim("v", "final_loss@1e-2", "better", "", 0.1, "", "paper")], "ref", ["1e-2"])
    assert "second_rule" not in result and "rests on" not in result["verdict"]


def test_the_second_rule_is_judged_against_the_target_fixed_before_the_runs():
    # a relative target, a quarter of the pilot reference's LR sensitivity: 0.25 x 5.7 / 8 with the failed LRs
    # counted, 0.25 x 2.1 / 6 without them. v trains 0.15 lower at 3e-2 and about 0.55 lower at 1e-1: d about 0.089
    # a seed under the failure rule and 0.119 without the failed runs, both short of the target fixed before the
    # runs (0.178). Judged against a target recomputed without the failed runs (0.0875), the second rule read
    # "agrees", and qk_norm_lr's verdict "rests on the failure rule" when it did not
    lrs = ["3e-4", "1e-3", "3e-3", "1e-2", "3e-2", "1e-1", "3e-1", "1"]
    ref = dict(zip(lrs, [3.0, 2.6, 2.3, 2.2, 2.4, 2.8, 0, 0]))
    records = []
    for seed in range(11):
        lower = dict(zip(lrs, [0, 0, 0, 0, 0.15, 0.55 + 0.005 * seed, 0, 0]))
        records += lr_records("ref", ref, [seed], failed_lrs=lrs[6:])
        records += lr_records("v", {lr: x - lower[lr] for lr, x in ref.items()}, [seed], failed_lrs=lrs[6:])
    claim = Claim("v", "lr_sensitivity", "better", "", 0.25, "", "nanonorm", relative=True)
    [result] = claims.judge(records, [claim], "ref", lrs, pilot=3)
    assert result["effect_to_detect"] == pytest.approx(0.25 * 5.7 / 8)
    assert result["effect"] == pytest.approx((0.7 + 0.005 * 6.5) / 8, abs=1e-9)  # seeds 3-10: mean 6.5
    assert result["second_rule"]["effect"] == pytest.approx((0.7 + 0.005 * 6.5) / 6, abs=1e-9)
    assert result["reading"] == result["second_rule"]["reading"] == "smaller"
    assert "rests on" not in result["verdict"]


def test_a_failed_runs_worst_value_is_the_worst_at_the_claims_lr_only():
    # at 1e-2 the finished runs spiked 1 and 3 times; at 1e-1 a finished run spiked 9 times. The failed run at 1e-2
    # counts as 3, the worst at its own LR, not 9
    records = [record("ref", 0, final=2.0, spikes=1), record("ref", 1, final=2.0, spikes=3),
               record("ref", 0, "1e-1", final=2.5, spikes=9), record("v", 0, diverged=True, spikes=0),
               record("v", 1, final=2.0, spikes=2)]
    assert claims.seed_values(records, "v", "spikes@1e-2", []) == {0: 3, 1: 2}
    assert claims.seed_values(records, "v", "spikes@1e-1", []) == {}  # v ran nothing there


def test_log_z_and_the_max_attention_logit_are_read_at_the_last_telemetry_step_as_the_max_over_layers(tmp_path):
    def step(n, logits, log_z):
        return {"event": "telemetry", "step": n, "weights": [], "logits": {"mean_log_z": log_z},
                "attn_logit_max": [{"layer": layer, "value": value} for layer, value in enumerate(logits)]}
    events = [{"event": "eval", "lr": 1e-2, "step": 0, "val_loss": 5.5},
              step(10, [1.0, 7.0, 2.0], -0.5),  # the first step: |log Z| 0.5, max logit 7
              step(20, [4.0, 3.0, 6.0], 2.5),  # the last: |log Z| 2.5, max over layers 6 (min 3, layer 0 4)
              {"event": "eval", "lr": 1e-2, "step": 20, "val_loss": 2.0},
              {"event": "done", "step": 20, "val_loss": 2.0}]
    run = lab.summary.run_record(write_run(tmp_path / "run", events))
    assert (run["log_z"], run["attn_logit_max"]) == (2.5, 6.0)
    assert run["logit_curve"] == [[10, 7.0, 0.5], [20, 6.0, 2.5]]


def test_a_sweep_rows_direction_is_the_mean_differences_not_the_median():
    # per-seed differences -1, -1, -1, +10 of a lower-is-better loss: the median leans better, the mean (the
    # statistic the sign-flip p is about) worse
    theirs = {s: 2.0 for s in range(4)}
    ours = {s: 2.0 + d for s, d in zip(range(4), (-1.0, -1.0, -1.0, 10.0))}
    row = lab.summary.paired(ours, theirs, "lower", "better")
    assert row["observed"] == "worse" and row["median_difference"] == -1.0
