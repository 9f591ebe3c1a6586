"""Verdicts that replicate: the pilot sd's upper bound behind every a-priori power, the fresh-seed replicate of
every tested claim (lab/recipes.Replication, sweep.py --replicate, lab/replication.py), a flat pilot said so, and the
rules whose mutants the fast tests once let live (a NaN at initialization is a failure, the pick is the median's, a
loss at exactly ln V is a failure, the design hash covers the claims)."""

import dataclasses
import json
import math

import pytest

import sweep
from lab import claims
from lab import recipes
from lab import rejudge
from lab import replication
from lab import results_page
from lab import stats
from lab.recipes import Claim
from tests.test_claims import record


def test_the_sd_bound_is_the_chi_square_one():
    # chi-square with 2 degrees of freedom has cdf 1 - exp(-x / 2): its 0.2 quantile is -2 ln 0.8, so 3 values'
    # 80% bound is sqrt(2 / (-2 ln 0.8)) = 2.117 x the estimate; with 1 degree of freedom chi2 is z^2
    assert stats.sd_upper_bound(1.0, 3) == pytest.approx(math.sqrt(2 / (-2 * math.log(0.8))))
    assert stats.sd_upper_bound(2.0, 3) == pytest.approx(2 * 2.1170, abs=1e-3)
    z = 0.2533471031357997  # the 0.6 quantile of the standard normal: P(z^2 <= z_0.6^2) = 0.2
    assert stats.sd_upper_bound(1.0, 2) == pytest.approx(1 / z)
    assert stats.sd_upper_bound(1.0, 16) < stats.sd_upper_bound(1.0, 6) < stats.sd_upper_bound(1.0, 3)
    assert stats.sd_upper_bound(1.0, 1) is None and stats.sd_upper_bound(None, 5) is None


def lr_runs(variant, seeds, losses):
    return [record(variant, s, lr, final=loss) for s in seeds for lr, loss in losses.items()]


def test_a_priori_power_rests_on_the_bound_and_the_tested_pairs_power_is_kept():
    # 3 pilot pairs with an sd of 0.01 and 6 tested ones: the power at the bound (2.1x the sd) is below the power
    # at the estimate, and the power at the tested pairs' own sd is the same test's at their spread
    pilot = [0.02, 0.03, 0.04]
    tested = [0.01, 0.05, 0.0, 0.06, 0.02, 0.04]
    records = [record("ref", s, final=3.0) for s in range(9)]
    records += [record("v", s, final=3.0 - d) for s, d in enumerate(pilot + tested)]
    [result] = claims.judge(records, [Claim("v", "final_loss@1e-2", "better", "", 0.02, "", "paper")], "ref",
                            ["1e-2"], pilot=3)
    bound = stats.sd_upper_bound(0.01, 3)
    assert result["pilot_sd_bound"] == pytest.approx(bound)
    assert result["power"] == stats.sign_flip_power(6, 0.02, bound, 0.05) < result["power_at_estimate"]
    assert result["power_at_estimate"] == stats.sign_flip_power(6, 0.02, result["pilot_sd"], 0.05)
    assert result["power_tested"] == stats.sign_flip_power(6, 0.02, result["sd"], 0.05)
    assert result["pairs_for_power"] == claims.pairs_for_power(0.02, bound, 0.05)


def test_a_nan_loss_at_initialization_is_a_failure_even_when_the_run_ended():
    assert claims.failed({**record("v", 0, final=2.0), "init_loss": math.nan})
    assert not claims.failed(record("v", 0, final=2.0))
    assert claims.failed(record("v", 0, diverged=True))


def test_an_arms_lr_is_the_lowest_median_not_the_lowest_mean():
    # at 1e-2 two seeds of three are best and one is far worse: the median picks 1e-2, the mean would pick 3e-3
    runs = [record("v", s, "1e-2", final=loss) for s, loss in enumerate([2.0, 2.0, 5.0])]
    runs += [record("v", s, "3e-3", final=2.5) for s in range(3)]
    assert claims.best_lr(runs, ["3e-3", "1e-2"], {0, 1, 2}) == "1e-2"
    assert claims.median_losses(runs, ["3e-3", "1e-2"]) == {"3e-3": 2.5, "1e-2": 2.0}


def test_a_loss_at_exactly_ln_v_counts_as_a_failure_in_the_lr_sensitivity():
    # v's optimum (2.0) is above ref's (1.0), so the failure excess E = F - 1.0 is larger than F - 2.0: a loss of
    # exactly F counts as E (a failure), where "> F" would have counted it as F - 2.0
    failure = 5.0
    records = [record("ref", 0, "1e-2", final=1.0, failure=failure), record("ref", 0, "1e-1", final=1.5,
                                                                            failure=failure),
               record("v", 0, "1e-2", final=2.0, failure=failure), record("v", 0, "1e-1", final=failure,
                                                                          failure=failure)]
    found = claims.paired_sensitivities(records, ["v", "ref"], ["1e-2", "1e-1"], 0)
    assert found["v"] == pytest.approx((0 + (failure - 1.0)) / 2)
    assert found["ref"] == pytest.approx(0.25)


@pytest.mark.parametrize("change", [dict(effect=0.5), dict(metric="final_loss@1e-2"), dict(expect="worse"),
                                    dict(tested=False), dict(target_origin="nanonorm")])
def test_the_design_hash_covers_each_claims_target_metric_and_direction(monkeypatch, change):
    before = recipes.design_hash("powernorm")
    recipe = recipes.RECIPES["powernorm"]
    changed = [dataclasses.replace(recipe.claims[0], **change), *recipe.claims[1:]]
    monkeypatch.setitem(recipes.RECIPES, "powernorm", dataclasses.replace(recipe, claims=changed))
    assert recipes.design_hash("powernorm") != before


def test_the_pilot_and_the_replicate_have_hashes_of_their_own():
    for name, recipe in recipes.RECIPES.items():
        if recipe.replication:
            assert recipes.design_hash(name, stage=recipes.REPLICATION) != recipes.design_hash(name)


def test_every_tested_claim_has_a_fresh_seed_replicate_fixed_in_the_recipes():
    replicated = {replication.key(vars(c) | {"reference": c.reference or recipes.RECIPES[name].reference,
                                             "minus": c.minus})
                  for name, recipe in recipes.RECIPES.items() if recipe.replication
                  for c in recipes.replication_settings(name)["claims"]}
    used = set()
    for name, recipe in recipes.RECIPES.items():
        used |= set(range(recipe.first_seed, recipe.first_seed + recipe.seeds))
        for c in recipe.claims:
            if c.tested:
                key = replication.key(vars(c) | {"reference": c.reference or recipe.reference, "minus": c.minus})
                assert key in replicated, f"{name}: {c.variant} {c.metric} has no replicate"
    for name, recipe in recipes.RECIPES.items():
        rep = recipe.replication
        if rep:  # fresh: no replicate seed is an original's, and the original's number of tested seeds
            assert not used & set(range(rep.first_seed, rep.first_seed + rep.seeds))
            assert rep.seeds >= recipe.tested_seeds


def replicate_plan(name):
    return sweep.parse_args([f"--recipe={name}", "--replicate"])


def test_a_replicate_runs_each_arm_at_its_chosen_lr_and_the_grid_check_on_its_first_seeds():
    plan = replicate_plan("normformer_loss")
    runs = sweep.grid(plan)
    assert plan.out_dir.endswith("normformer_loss_replication") and plan.first_seed == recipes.REPLICATE_SEED
    by_arm = {}
    for run in runs:
        by_arm.setdefault((run.variant, run.lr), set()).add(run.seed)
    seeds = set(range(300, 308))
    for arm, lr in recipes.NF_CHOSEN.items():
        assert by_arm[(arm, lr)] == seeds
        for neighbour in recipes.NF_NEIGHBOURS[arm]:
            assert by_arm[(arm, neighbour)] == {300, 301, 302}
    assert by_arm[(recipes.NF_NORMFORMER, "1.2e-2")] == seeds  # the gradient-ratio claim's LR
    assert len(runs) == 4 * 8 + 8 + 4 * 2 * 3


def test_a_replicate_is_refused_where_the_recipe_has_none_or_at_gpu_scale(capsys):
    assert sweep.main(["--recipe=normformer_loss_wide", "--replicate", "--dry_run"]) == 2
    assert "replicated in normformer_loss" in capsys.readouterr().err
    assert sweep.main(["--recipe=powernorm", "--replicate", "--scale=gpu", "--dry_run"]) == 2
    assert sweep.main(["--replicate", "--dry_run", "--variants=baseline", "--lrs=1e-2"]) == 2
    assert sweep.main(["--recipe=powernorm", "--replicate", "--pilot", "--dry_run"]) == 2


def test_a_replicate_reads_each_arm_at_the_fixed_lr_even_where_another_is_better():
    # v's other LR (1e-2) is better on every seed, but the original's pilot chose 3e-3: the replicate reads 3e-3
    records = lr_runs("v", range(4), {"3e-3": 2.5, "1e-2": 2.0}) + lr_runs("ref", range(4), {"3e-3": 2.6})
    claim = Claim("v", "best_loss", "better", "", 0.01, "", "paper")
    [result] = claims.judge(records, [claim], "ref", ["3e-3", "1e-2"], 0, 4, fixed_lrs={"v": "3e-3", "ref": "3e-3"})
    assert result["differences"] == pytest.approx([-0.1] * 4) and not result["unbracketed"]
    assert result["chosen_lr"] == {"v": "3e-3", "ref": "3e-3"}


def judged(effect, p_holm):
    return {"effect": effect, "p_holm": p_holm, "reading": "x"}


@pytest.mark.parametrize("original, replicate, reading", [
    (judged(0.5, 0.01), judged(0.4, 0.02), "replicates"),
    (judged(-0.5, 0.01), judged(-0.1, 0.03), "replicates"),
    (judged(0.5, 0.01), judged(0.4, 0.2), "same direction, not significant"),
    (judged(0.5, 0.01), judged(-0.4, 0.2), "does not replicate"),
    (judged(0.5, 0.01), judged(-0.4, 0.01), "does not replicate"),
    (judged(0.1, 0.3), judged(-0.2, 0.4), "replicates"),  # neither detects it
    (judged(0.1, 0.3), judged(0.3, 0.01), "does not replicate"),  # the replicate detects what the original did not
    (judged(0.5, 0.01), judged(0.4, None), "not run"),
    (judged(0.5, 0.01), None, "not run")])
def test_the_replicates_reading(original, replicate, reading):
    assert replication.reading(original, replicate) == reading


def test_the_replicates_power_comes_from_the_originals_tested_pairs_bound():
    original = {"sd": 0.02, "n": 8, "effect_to_detect": 0.03, "endpoint": "continuous"}
    replicate = {"planned_pairs": 8, "alpha_first_step": 0.0125}
    bound = stats.sd_upper_bound(0.02, 8)
    assert replication.power(original, replicate) == stats.sign_flip_power(8, 0.03, bound, 0.0125)
    assert replication.power({**original, "sd": None}, replicate) is None


def test_a_flat_pilot_is_found_and_a_sloped_one_is_not():
    # the arm's medians over three LRs lie within 0.006 of each other, and its seeds spread by 0.02 at each LR
    flat = [record("v", s, lr, final=3.19 + 0.01 * s + shift)
            for s in range(3) for lr, shift in (("1e-3", 0.0), ("2e-3", -0.004), ("4e-3", 0.002))]
    found = claims.flat_pilot(flat, ["1e-3", "2e-3", "4e-3"], {0, 1, 2})
    assert found["range"] == pytest.approx(0.006) and found["noise"] == pytest.approx(0.02)
    sloped = [record("v", s, lr, final=loss + 0.01 * s) for s in range(3)
              for lr, loss in (("1e-3", 2.6), ("2e-3", 2.4), ("4e-3", 2.5))]
    assert claims.flat_pilot(sloped, ["1e-3", "2e-3", "4e-3"], {0, 1, 2}) is None


def test_a_flat_pilot_is_said_on_the_page():
    runs = [record("v", s, lr, final=3.19 + 0.01 * s + shift)
            for s in range(5) for lr, shift in (("1e-3", 0.0), ("2e-3", -0.004), ("4e-3", 0.002))]
    runs += [record("ref", s, lr, final=2.5 + 0.01 * s + abs(float(lr) - 2e-3) * 100)
             for s in range(5) for lr in ("1e-3", "2e-3", "4e-3")]
    [result] = claims.judge(runs, [Claim("v", "best_loss", "better", "", 0.1, "", "paper")], "ref",
                            ["1e-3", "2e-3", "4e-3"], pilot=3)
    assert list(result["flat_pilot"]) == ["v"]
    summary = {"claims": [result], "recipe": {"name": "x"}}
    assert any("v's pilot is flat" in line for line in results_page.claim_lines(summary, "data.json"))


def committed(name):
    with open(f"docs/experiments/records/{name}.json") as f:
        return json.load(f)


def test_rejudging_a_committed_record_reproduces_its_tests_numbers():
    summary = committed("normformer_lr")
    again = rejudge.rejudge(summary)
    for old, new in zip(summary["claims"], again["claims"]):
        for key in ("differences", "seeds", "p", "p_holm", "effect", "effect_ci", "power", "verdict"):
            assert new[key] == old[key], key


def test_the_page_pairs_each_claim_with_its_replicate_by_what_it_compares():
    original = committed("normformer_stability")
    fresh = committed("normformer_stability.replication")
    rows = results_page.headline_rows(original, (), replication.replicates_by_key([fresh]))
    for row, claim, again in zip(rows, original["claims"], fresh["claims"]):
        found = replication.reading(claim, again)
        assert row.endswith(f"{found} |")
        if found != "replicates":
            assert f"on fresh seeds: {found}" in row
