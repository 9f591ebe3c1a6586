"""recipes.py: the exact permutation p-value against cases enumerated by hand, the verdicts, every recipe's dry-run
commands through train.py's own parser, and the results page generated from a tiny real sweep."""

import json
import math
import os
import shlex
from fractions import Fraction

import pytest

import plot
from lab import recipes
import sweep
import train
from model import PRESETS
from conftest import SWEEP_TINY, check_png


def test_p_value_complete_separation_three_a_side():
    # 1, 2, 3 against 4, 5, 6: of the C(6, 3) = 20 relabelings only {1, 2, 3} and {4, 5, 6} are as far from the
    # mean rank sum as the observed one, so p = 2/20 = 1/10: three seeds a side can never reach 0.05
    assert recipes.permutation_p([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == Fraction(1, 10)
    assert recipes.permutation_p([6.0, 5.0, 4.0], [3.0, 1.0, 2.0]) == Fraction(1, 10)
    assert recipes.smallest_p(3, 3) == Fraction(1, 10)


def test_p_value_complete_separation_four_a_side():
    # 2 of C(8, 4) = 70 relabelings: 1/35 < 0.05, the least number of seeds a recipe may run
    assert recipes.permutation_p([5.0, 6.0, 7.0, 8.0], [1.0, 2.0, 3.0, 4.0]) == Fraction(1, 35)


def test_p_value_with_a_three_way_tie():
    # a = 3, 5, 5 and b = 1, 2, 5. Pooled and sorted: 1, 2, 3, 5, 5, 5; the three 5s share ranks 4, 5, 6, mean 5.
    # Doubled ranks: 1 -> 2, 2 -> 4, 3 -> 6, each 5 -> 10. a's doubled rank sum is 6 + 10 + 10 = 26; with no
    # difference it is 3 x (6 + 1) = 21 on average, so the observed distance is 5: count the 3-subsets of
    # {2, 4, 6, 10, 10, 10} (the 10s are three distinct runs) whose sum S has |S - 21| >= 5, i.e. S >= 26 or <= 16:
    #   three 10s:                 S = 30                      1 subset, counts
    #   two 10s (3 ways) + one of 2, 4, 6:   S = 22, 24, 26    only + 6 counts: 3 subsets
    #   one 10 (3 ways) + two of 2, 4, 6:    S = 16, 18, 20    only + 2 + 4 counts: 3 subsets
    #   no 10:                     S = 12                      1 subset, counts
    # 8 of C(6, 3) = 20: p = 2/5
    assert recipes.permutation_p([3.0, 5.0, 5.0], [1.0, 2.0, 5.0]) == Fraction(2, 5)


def test_p_value_with_diverged_runs_as_inf():
    # losses, a diverged run counted as inf: a = 2.0, 2.1, inf, inf and b = inf, inf, inf, 3.0.
    # Sorted: 2.0, 2.1, 3.0, then five infs sharing ranks 4..8 (mean 6). Doubled ranks: 2, 4, 6 and 12 for each inf.
    # a's sum 2 + 4 + 12 + 12 = 30; the mean is 4 x (8 + 1) = 36, distance 6: count the 4-subsets with S <= 30 or
    # S >= 42, choosing j of {2, 4, 6} and 4 - j of the five 12s (C(5, 4 - j) ways):
    #   j = 0: S = 48                       C(5, 4) = 5 subsets, count
    #   j = 1: S = 36 + 2, 4 or 6           only 6 (S = 42): C(5, 3) = 10
    #   j = 2: S = 24 + 6, 8 or 10          only 2 + 4 (S = 30): C(5, 2) = 10
    #   j = 3: S = 12 + 12 = 24             C(5, 1) = 5
    # 30 of C(8, 4) = 70: p = 3/7
    assert recipes.permutation_p([2.0, 2.1, math.inf, math.inf], [math.inf, math.inf, math.inf, 3.0]) == Fraction(3, 7)


def test_p_value_of_identical_sides_is_one_and_nan_is_refused():
    assert recipes.permutation_p([7.0, 7.0, 7.0, 7.0], [7.0, 7.0, 7.0, 7.0]) == 1
    with pytest.raises(ValueError, match="NaN"):
        recipes.permutation_p([1.0, math.nan], [2.0, 3.0])


@pytest.mark.parametrize("values, reference, better, expect, verdict, observed", [
    ([500, 520, 540, 560, 580], [300, 310, 320, 330, 340], "higher", "better", "agrees", "better"),
    ([500, 520, 540, 560, 580], [300, 310, 320, 330, 340], "higher", "worse", "disagrees", "better"),
    ([2.0, 2.1, 2.2, 2.3, 2.4], [1.0, 1.1, 1.2, 1.3, 1.4], "lower", "better", "disagrees", "worse"),
    ([1.0, 1.1, 1.2, 1.3, 1.4], [math.inf] * 5, "lower", "better", "agrees", "better"),
    ([1.0, 1.2, 1.4], [1.1, 1.3, 1.5], "lower", "better", "inconclusive at this scale", "better"),
    ([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], "lower", "better", "inconclusive at this scale", "better"),  # p = 0.1
])
def test_verdicts(values, reference, better, expect, verdict, observed):
    result = recipes.compare(values, reference, better, expect)
    assert (result["verdict"], result["observed"]) == (verdict, observed)
    assert result["variant_values"]["n"] == len(values) and result["reference_values"]["n"] == len(reference)


def test_compare_reports_medians_spread_and_the_exact_p():
    result = recipes.compare([2.0, 2.1, math.inf, math.inf], [math.inf, math.inf, math.inf, 3.0], "lower")
    assert result["variant_values"] == {"median": math.inf, "min": 2.0, "max": math.inf, "n": 4}
    assert result["reference_values"] == {"median": math.inf, "min": 3.0, "max": math.inf, "n": 4}
    assert result["median_difference"] is None  # inf - inf
    assert (result["p_exact"], result["p"]) == ("3/7", pytest.approx(3 / 7))
    result = recipes.compare([1.0, 2.0, 4.0, 5.0], [3.0, 6.0, 7.0, 8.0], "lower")
    assert result["median_difference"] == 3.0 - 6.5 and result["smallest_p"] == pytest.approx(1 / 35)


def test_every_recipe_can_reach_significance():
    for name, recipe in recipes.RECIPES.items():
        assert recipe.seeds >= 4 and recipes.smallest_p(recipe.seeds, recipe.seeds) < recipes.ALPHA, name
        assert all(claim.variant in recipe.variants for claim in recipe.claims), name
        assert recipe.reference in recipe.variants and recipe.mode in ("ramp", "lr"), name
        assert all(claim.metric.split("@")[0] in recipes.BETTER for claim in recipe.claims), name


def recipe_args(argv):
    """sweep.py's plan for a command line, as its main() makes it."""
    return sweep.parse_args(argv)


def train_configs(argv):
    """train.py's own parser and config checks, as it runs them on its command line."""
    return train.build_configs(train.parse_flags(argv))


@pytest.mark.parametrize("scale", ["cpu", "gpu"])
@pytest.mark.parametrize("name", list(recipes.RECIPES))
def test_recipe_dry_run_commands_parse_with_train_parser(name, scale, tmp_path, capsys):
    assert sweep.main([f"--recipe={name}", "--dry_run", f"--out_dir={tmp_path}", f"--scale={scale}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    settings = recipes.settings(name, scale)
    assert len(lines) == len(settings["variants"]) * len(settings["lrs"]) * settings["seeds"]
    seen = set()
    for line in lines:
        argv = shlex.split(line)[2:]
        model_cfg, tc = train_configs(argv)
        variant, lr, seed = os.path.relpath(tc.out_dir, tmp_path).split(os.sep)
        assert (tc.lr, tc.seed, lr) == (float(lr), int(seed), settings["lrs"][settings["lrs"].index(lr)])
        assert (tc.lr_schedule == "ramp") == (settings["mode"] == "ramp")
        assert tc.dtype == ("float16" if scale == "gpu" and settings["mode"] == "ramp" else "auto")
        given = train.parse_flags(argv)
        head, *overrides = variant.split("+")
        for key, value in PRESETS.get(head, {}).items():  # the context preset, where no explicit flag replaces it
            assert key in given or getattr(model_cfg, key) == value, (variant, key)
        for key, text in (part.split("=") for part in overrides):
            assert given[key] == train.parse_flags([f"--{key}={text}"])[key]
        seen.add((variant, lr, seed))
    assert {v for v, _, _ in seen} == set(settings["variants"]) and len(seen) == len(lines)


def tiny_recipe(mode, figure, variants, flags, claims):
    return recipes.Recipe(title=f"tiny {mode} recipe", paper="A Paper (v2) §1, Table 9", quote="It is better.",
                          mode=mode, variants=variants, reference=variants[0], claims=claims, lrs=["0.5"], seeds=4,
                          flags=flags, gpu_lrs=["0.5"], gpu_flags=flags, deviations="tiny", figure=figure)


@pytest.fixture(scope="module")
def tiny_experiments(corpus, tmp_path_factory):
    """Two tiny recipes run for real (train.py in this process, 4 steps a run, 4 seeds a variant), summarized by
    sweep.py as `python sweep.py --recipe=NAME` does: a ramp and an lr sweep with telemetry."""
    root = tmp_path_factory.mktemp("experiments")
    common = [*SWEEP_TINY, f"--dataset={corpus}", f"--data_dir={root / 'data'}"]
    tiny = {
        "tiny_ramp": tiny_recipe("ramp", "ramp", ["baseline", "norm=rmsnorm"], [*common, "--attn_impl=manual"],
                                 [recipes.Claim("norm=rmsnorm", "steps_survived@0.5", "better", "94 vs 200 steps")]),
        "tiny_logits": tiny_recipe("lr", "logits", ["baseline", "qk_norm=True"],
                                   [*common, "--attn_impl=manual", "--telemetry_interval=2"],
                                   [recipes.Claim("qk_norm=True", "attn_logit_max@0.5", "better", "none")])}
    patch = pytest.MonkeyPatch()
    for name, recipe in tiny.items():
        patch.setitem(recipes.RECIPES, name, recipe)
    for name in tiny:
        args = recipe_args([f"--recipe={name}", f"--out_dir={root / 'sweeps' / name}"])
        runs = sweep.grid(args)
        for run in runs:
            os.makedirs(os.path.dirname(run.dir), exist_ok=True)
            with open(run.dir + ".exit", "w") as f:
                f.write(f"{train.main(sweep.train_flags(run, args))}\n")
        sweep.write_summary(args, runs, wall_s=90.0)
    yield root
    patch.undo()


@pytest.mark.slow
def test_results_page_from_a_tiny_real_sweep(tiny_experiments, capsys):
    root = tiny_experiments
    # summarizing again with nothing run (the command re-run on a finished sweep) keeps the runs' time and machine
    args = recipe_args(["--recipe=tiny_ramp", f"--out_dir={root / 'sweeps' / 'tiny_ramp'}"])
    with open(root / "sweeps" / "tiny_ramp" / "summary.json") as f:
        before = json.load(f)
    sweep.write_summary(args, sweep.grid(args))
    with open(root / "sweeps" / "tiny_ramp" / "summary.json") as f:
        after = json.load(f)
    assert (after["wall_s"], after["machine"]) == (90.0, before["machine"])
    assert plot.main([f"--experiments={root / 'sweeps'}", f"--out={root / 'docs'}"]) == 0
    page = (root / "docs" / "experiments.md").read_text()
    assert str(root) not in page and "/tmp" not in page  # no machine paths
    for name, metric in (("tiny_ramp", "steps_survived@0.5"), ("tiny_logits", "attn_logit_max@0.5")):
        with open(root / "sweeps" / name / "summary.json") as f:
            summary = json.load(f)
        [row] = [r for r in summary["comparisons"] if r["claim"]]
        assert row["metric"] == metric and row["variant_values"]["n"] == row["reference_values"]["n"] == 4
        section = page[page.index(f'<a id="{name}"></a>'):]
        section = section[:section.index("![")]
        # the page's numbers are the summary's: the claim's row of the headline and of its section
        ours = (f"{plot.side_text(row['variant_values'])} vs {plot.side_text(row['reference_values'])}")
        cells = f"{ours} | {plot.p_text(row)} | {row['verdict']} |"
        assert cells in section and page.count(cells) == 2
        assert "It is better." in section and "A Paper (v2) §1, Table 9" in section and "Deviations" in section
        assert f"`python sweep.py --recipe={name}`" in section and "1.5 min on " in section
        check_png(root / "docs" / "experiments" / f"{name}.png")
    assert page.index("## Headline") < page.index('<a id="tiny_ramp">') < page.index('<a id="tiny_logits">')
