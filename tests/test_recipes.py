"""recipes.py: the verdicts (the exact p-values are test_stats.py's), every recipe's design (reachable at Holm's
first step) and dry-run commands through train.py's own parser, and the summary and results page of tiny real recipe
sweeps."""

import json
import math
import os
import shlex

import matplotlib.image
import pytest

import lab.results_page
import lab.summary
import lab.tables
import plot
from lab import recipes
from lab import stats
import sweep
import configs
import train
from presets import PRESETS
from conftest import SWEEP_TINY, check_png, last_of_each


def test_every_recipe_can_reach_significance_at_holms_first_step():
    """With n pairs the sign-flip test's smallest p is 2 / 2^n; Holm's first step asks p < 0.05 / m, m the recipe's
    claims, so every recipe's seeds must reach it. Every arm a claim involves is one of the recipe's variants."""
    for name, recipe in recipes.RECIPES.items():
        tested = sum(claim.tested for claim in recipe.claims)
        assert 2 / 2 ** recipe.tested_seeds < stats.ALPHA / tested, name  # the pilot seeds are not tested
        for claim in recipe.claims:
            assert claim.target_origin in ("paper", "nanonorm"), (name, claim)
            arms = [claim.variant, claim.reference or recipe.reference, *(claim.minus or ())]
            assert all(arm in recipe.variants for arm in arms), (name, claim)
            assert claim.metric.split("@")[0] in recipes.BETTER and claim.expect in ("better", "worse"), name
            assert claim.effect > 0 and claim.effect_source, name
            lr = claim.metric.partition("@")[2]
            assert not lr or lr in recipe.lrs, (name, claim.metric)  # the claim is read at an LR the recipe runs
        assert recipe.reference in recipe.variants and recipe.mode in ("ramp", "lr"), name
        assert recipe.figure in lab.results_page.FIGURES, name


PAPERS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "papers")


@pytest.mark.skipif(not os.path.isdir(PAPERS), reason="the papers' text is in ../shared/papers")
def test_the_bytes_per_token_and_word_the_targets_are_converted_with_are_measured(gpt2_ranks):
    """recipes.BYTES_PER_GPT2_TOKEN and BYTES_PER_WORD, measured again: GPT-2's BPE (r50k_base) on NormFormer's two
    versions, whitespace-separated words on all five papers."""
    import data
    encoding = data.get_tokenizer("gpt2")
    texts = {name: open(os.path.join(PAPERS, name), encoding="utf-8").read() for name in os.listdir(PAPERS)
             if name.endswith(".txt")}
    normformer = [texts[name] for name in recipes.NORMFORMER_PAPERS]
    per_token = sum(len(t.encode()) for t in normformer) / sum(len(encoding.encode_ordinary(t)) for t in normformer)
    per_word = sum(len(t.encode()) for t in texts.values()) / sum(len(t.split()) for t in texts.values())
    assert per_token == pytest.approx(recipes.BYTES_PER_GPT2_TOKEN, abs=0.005)
    assert per_word == pytest.approx(recipes.BYTES_PER_WORD, abs=0.005)
    nf_loss = recipes.RECIPES["normformer_loss"].claims[0]
    assert nf_loss.effect == pytest.approx(math.log(16.37 / 15.88) / per_token, abs=1e-4)


def recipe_args(argv):
    """sweep.py's plan for a command line, as its main() makes it."""
    return sweep.parse_args(argv)


def train_configs(argv):
    """train.py's own parser and config checks, as it runs them on its command line."""
    return configs.build_configs(configs.parse_flags(argv))


@pytest.mark.parametrize("scale", ["cpu", "gpu"])
@pytest.mark.parametrize("name", list(recipes.RECIPES))
def test_recipe_dry_run_commands_parse_with_train_parser(name, scale, tmp_path, capsys):
    assert sweep.main([f"--recipe={name}", "--dry_run", f"--out_dir={tmp_path}", f"--scale={scale}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    settings = recipes.settings(name, scale)
    recipe = recipes.RECIPES[name]
    # the pilot seeds run every LR; the tested ones every LR, or those the pilot chose (tested_lrs)
    tested = settings["tested_lrs"] or {v: settings["lrs"] for v in settings["variants"]}
    assert len(lines) == (len(settings["variants"]) * len(settings["lrs"]) * recipe.pilot
                          + sum(len(lrs) for lrs in tested.values()) * recipe.tested_seeds)
    seen = set()
    for line in lines:
        argv = shlex.split(line)[2:]
        model_cfg, tc = train_configs(argv)
        variant, lr, seed = os.path.relpath(tc.out_dir, tmp_path).split(os.sep)
        assert (tc.lr, tc.seed, lr) == (float(lr), int(seed), settings["lrs"][settings["lrs"].index(lr)])
        assert (tc.lr_schedule == "ramp") == (settings["mode"] == "ramp")
        assert tc.dtype == configs.parse_flags(settings["train_argv"]).get("dtype", "auto")  # the recipe's own
        given = configs.parse_flags(argv)
        head, *overrides = variant.split("+")
        for key, value in PRESETS.get(head, {}).items():  # the context preset, where no explicit flag replaces it
            assert key in given or getattr(model_cfg, key) == value, (variant, key)
        for key, text in (part.split("=") for part in overrides):
            assert given[key] == configs.parse_flags([f"--{key}={text}"])[key]
        seen.add((variant, lr, seed))
    assert {v for v, _, _ in seen} == set(settings["variants"]) and len(seen) == len(lines)
    first = recipes.RECIPES[name].first_seed
    assert {int(seed) for _, _, seed in seen} == set(range(first, first + settings["seeds"]))


def tiny_recipe(mode, figure, variants, flags, claims, lrs=("0.5",)):
    return recipes.Recipe(title=f"tiny {mode} recipe with a {figure} figure", paper="A Paper (v2) §1, Table 9",
                          quote="It is better.", mode=mode, variants=variants, reference=variants[0], claims=claims,
                          lrs=list(lrs), tested_seeds=2, pilot=0, first_seed=3, flags=flags, gpu_lrs=list(lrs),
                          gpu_flags=flags,
                          deviations="tiny", figure=figure)


def tiny_claim(variant, metric, **options):
    return recipes.Claim(variant, metric, "better", "94 vs 200 steps", effect=0.25, effect_source="a guess",
                         target_origin="nanonorm", **options)


@pytest.fixture(scope="module")
def tiny_experiments(corpus, tmp_path_factory):  # noqa: F811 (the fixture imported above)
    """Four tiny recipes run for real (train.py in this process, a few steps a run, seeds 3 and 4), summarized by
    sweep.py as `python sweep.py --recipe=NAME` does: a ramp, an LR curve, a depth and a gradient-ratio recipe."""
    root = tmp_path_factory.mktemp("experiments")
    common = [*SWEEP_TINY, f"--dataset={corpus}", f"--data_dir={root / 'data'}"]
    depths = ["baseline+n_layer=1", "norm=rmsnorm+n_layer=1", "baseline+n_layer=2", "norm=rmsnorm+n_layer=2"]
    tiny = {
        "tiny_ramp": tiny_recipe("ramp", "ramp", ["baseline", "norm=rmsnorm"], [*common, "--attn_impl=manual"],
                                 [tiny_claim("norm=rmsnorm", "steps_survived@0.5", relative=True)]),
        "tiny_curve": tiny_recipe("lr", "loss_vs_lr", ["baseline", "qk_norm=True"], common,
                                  [tiny_claim("qk_norm=True", "lr_sensitivity", relative=True),
                                   tiny_claim("qk_norm=True", "final_loss@0.5")], lrs=("1e-2", "0.5")),
        "tiny_depth": tiny_recipe("lr", "depth", depths, common,
                                  [tiny_claim("norm=rmsnorm+n_layer=2", "final_loss@0.5",
                                              reference="baseline+n_layer=2",
                                              minus=("norm=rmsnorm+n_layer=1", "baseline+n_layer=1"))]),
        "tiny_ratio": tiny_recipe("lr", "grad_ratio", ["baseline", "norm=rmsnorm"],
                                  last_of_each([*common, "--n_layer=2", "--max_iters=12", "--eval_interval=12",
                                                "--telemetry_interval=5"]),
                                  [tiny_claim("norm=rmsnorm", "grad_ratio@1e-2"),
                                   tiny_claim("norm=rmsnorm", "fc2_grad_ratio@1e-2")], lrs=("1e-2",))}
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
        lab.summary.write_summary(args, runs, wall_s=90.0)
    yield root
    patch.undo()


def read_json(path):
    with open(path) as f:
        return json.load(f)


@pytest.mark.slow
def test_a_recipes_summary_records_its_design_and_claims_from_the_runs(tiny_experiments):
    summary = read_json(tiny_experiments / "sweeps" / "tiny_depth" / "summary.json")
    design = summary["recipe"]["design"]
    # TINY: --eval_iters=1, --batch_size=4, --block_size=16: 4 windows of 16 tokens
    assert design["eval_windows"] == {"eval_iters": 1, "batch_size": 4, "windows": 4, "block_size": 16, "tokens": 64}
    assert (design["seeds"], design["steps"], design["lrs"]) == ([3, 4], 4, ["0.5"])
    assert "sign-flip" in design["test"] and "1 tested claim," in design["family"]
    assert design["effects"][0]["source"] == "a guess"
    [claim] = summary["claims"]
    # the interaction recomputed from the runs' records: (deep 2 - base 2) - (deep 1 - base 1), loss capped at L_0
    loss = {(r["variant"], r["seed"]): r["final_loss_capped"] for r in summary["runs"]}
    by_hand = [(loss["norm=rmsnorm+n_layer=2", s] - loss["baseline+n_layer=2", s])
               - (loss["norm=rmsnorm+n_layer=1", s] - loss["baseline+n_layer=1", s]) for s in (3, 4)]
    assert claim["seeds"] == [3, 4] and claim["differences"] == pytest.approx(by_hand, abs=1e-12)
    # two pairs: p is 1 (equal magnitudes) or 1/2; 2/4 can never reach 0.05, so nothing is detected
    assert claim["p"] in (0.5, 1.0) and claim["verdict"].startswith("not detected") and claim["mde"] == math.inf


@pytest.mark.slow
def test_results_page_from_a_tiny_real_sweep(tiny_experiments, capsys):
    root = tiny_experiments
    # summarizing again with nothing run (the command re-run on a finished sweep) keeps the runs' time and machine
    args = recipe_args(["--recipe=tiny_ramp", f"--out_dir={root / 'sweeps' / 'tiny_ramp'}"])
    before = read_json(root / "sweeps" / "tiny_ramp" / "summary.json")
    lab.summary.write_summary(args, sweep.grid(args))
    after = read_json(root / "sweeps" / "tiny_ramp" / "summary.json")
    assert (after["wall_s"], after["machine"]) == (90.0, before["machine"])
    capsys.readouterr()
    assert plot.main([f"--experiments={root / 'sweeps'}", f"--out={root / 'docs'}"]) == 0
    printed = capsys.readouterr().out
    page = (root / "docs" / "experiments.md").read_text()
    assert str(root) not in page and "/tmp" not in page  # no machine paths
    headline = page[page.index("## Headline") + len("## Headline"):page.index('<a id="tiny_ramp">')]
    assert headline.strip() in printed  # the headline goes to stdout too, for the README
    names = ("tiny_ramp", "tiny_curve", "tiny_depth", "tiny_ratio")
    for name in names:
        summary = read_json(root / "sweeps" / name / "summary.json")
        section = page[page.index(f'<a id="{name}"></a>'):]
        section = section[:section.index("![")]
        for claim in summary["claims"]:
            # the page's numbers are the summary's, in the headline and in the recipe's table
            effect = lab.tables.interval_text(claim["effect"], claim["effect_ci"])
            cells = (f"| {effect} | {lab.tables.coverage_text(claim['ci_coverage'])} | "
                     f"{lab.tables.p_value_text(claim['p_holm'])} | {lab.tables.target_value_text(claim)} | "
                     f"{lab.tables.power_text(claim['power'])} | {claim['verdict']} |")
            assert cells in headline, (name, cells)
            assert (f"| {claim['n']} | {lab.tables.p_value_text(claim['p'])} | "
                    f"{lab.tables.p_value_text(claim['p_holm'])} |") in section
            assert claim["n"] == 2 and f"{effect} | " in section
        assert "It is better." in section and "A Paper (v2) §1, Table 9" in section and "Deviations" in section
        assert f"`python sweep.py --recipe={name}`" in section and "1.5 min on " in section
        assert "2 seeds (3-4; all tested)" in section and "a guess" in section
        png = root / "docs" / "experiments" / f"{name}.png"
        check_png(png)
        assert matplotlib.image.imread(png).shape[1] >= 800  # 8 inches at 120 dpi, less the trimmed margins
    curve = page[page.index('<a id="tiny_curve">'):page.index('<a id="tiny_depth">')]
    assert "| qk_norm=True | " in curve and "L(1e-2) | L(0.5)" in curve
    depth = page[page.index('<a id="tiny_depth">'):page.index('<a id="tiny_ratio">')]
    assert "left the plateau" in depth and "| baseline+n_layer=2 | 0.5 | " in depth
    assert "(norm=rmsnorm+n_layer=2 vs baseline+n_layer=2) - (norm=rmsnorm+n_layer=1 vs baseline+n_layer=1)" in depth
    positions = [page.index(f'<a id="{name}">') for name in names]
    assert page.index("## Headline") < positions[0] and positions == sorted(positions)
    assert "sign-flip" in page and "Holm" in page and "- Failure rule: " in page and "MDE" in page
    assert "earlier design" not in headline  # these runs are the recipes' designs as they stand


def test_the_gradient_ratio_recipe_has_ratios_from_its_telemetry(tiny_experiments):
    summary = read_json(tiny_experiments / "sweeps" / "tiny_ratio" / "summary.json")
    for run in summary["runs"]:
        # telemetry at steps 5 and 10 of 12: only step 10 is within steps 10-100
        assert [step for step, _ in run["ratio_curve"]] == [5, 10]
        assert run["grad_ratio"] == pytest.approx(run["ratio_curve"][1][1], rel=1e-12)
    grad, fc2 = summary["claims"]
    assert grad["metric"] == "grad_ratio@1e-2" and grad["n"] == 2 and fc2["family"] == 2
