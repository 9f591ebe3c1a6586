"""
The results page: `python plot.py --experiments=sweeps --out=docs` reads the summary.json of every recipe's sweep
under sweeps/ (python sweep.py --recipe=NAME) and writes docs/experiments.md, a headline table and a section per
recipe (the paper's words, the design, each claim's effect, CI, p, Holm's p, power, MDE and verdict, descriptive
extras, deviations, command), and a figure per recipe in docs/experiments/. It reads nothing else, so the page
cannot drift from the data.
"""

import collections
import glob
import html
import json
import math
import os
import statistics

import matplotlib.ticker

from engine import files
from engine.flags import UsageError
from lab import schema
from lab import claims as claims_lib
from lab import recipes
from lab import replication
from lab.claims import RATIO_STEPS
from lab.figures import FP16_MAX, legend_outside, log_lr_axis, make_folder, plt, save_png
from lab.tables import (chosen_lr_text, claims_table, comparison_text, coverage_text, finite_number, interval_text,
                        known, mde_text, metric_label, p_value_text, power_text, target_value_text, value_text)

LINE_STYLES = ("-", "--", ":", "-.")
WORDS = ("title", "paper", "quote", "deviations")  # a recipe's words, which the page takes from lab/recipes.py
DATA = "experiments/records"  # under --out: the page's data, one <name>.json a recipe (page_data)
CURVES = ("curve", "ratio_curve", "fc2_ratio_curve", "logit_curve")
FIGURE_SIZE = (8, 4.5)  # inches, at FIGURE_DPI: readable at the page's width
FIGURE_DPI = 120


def read_recipe_summaries(root):
    """The summary of every recipe's sweep under root (sweep.py --recipe writes its recipe into its summary.json),
    or of every recipe in a data folder (DATA: <name>.json, written by this page), in the order recipes.py lists the
    recipes, CPU before GPU scale: ([(summary, [its replicates])], [fresh-seed replicates]). A recipe run more than
    once on the same seeds (another --jobs, so another thread count, or another machine:
    --out_dir=sweeps/NAME_threads2) has its first folder in path order as the summary and the others as replicates,
    whose spread the page shows; its fresh-seed replicate (sweep.py --replicate) stands apart, in recipes.py's
    order."""
    found, fresh, anchors = {}, {}, {}
    paths = sorted(glob.glob(os.path.join(glob.escape(root), "**", "summary.json"), recursive=True))
    paths += sorted(glob.glob(os.path.join(glob.escape(root), "*.json")))
    for path in paths:
        summary = schema.read_summary(path)
        if not summary.get("recipe") or summary.get("stage") == "pilot":  # a pilot alone tests nothing
            continue
        check_recipe_summary(path, summary)
        check_verdicts(path, summary)
        key = (summary["recipe"]["order"], summary["recipe"]["scale"])
        if summary["recipe"].get("stage") == recipes.REPLICATION:
            if key in fresh:
                raise UsageError(f"{path}: a second fresh-seed replicate of {summary['recipe']['name']}; keep one "
                                 "(a replicate's seeds are fixed in lab/recipes.py)")
            fresh[key] = page_data(summary)
        else:
            check_one_section(path, anchors.setdefault(anchor(summary["recipe"]), (key, path)), key)
            found.setdefault(key, []).append(page_data(summary))
    return [(group[0], group[1:]) for _, group in sorted(found.items())], [fresh[k] for k in sorted(fresh)]


def page_data(summary):
    """What the page is made from, committed beside it (DATA): the summary less what the page does not show (the
    sweep's every-metric comparisons, per-step curves its figure does not draw). The page is drawn from this alone,
    so that the committed data regenerates it byte for byte."""
    figure = summary["recipe"]["figure"]
    keep, at = set(), None
    if figure == "ramp":
        keep = {"curve"}
    elif figure == "grad_ratio":
        name, _, at = ratio_metric(summary).partition("@")
        keep = {"ratio_curve" if name == "grad_ratio" else "fc2_ratio_curve"}
    runs = [{k: ([] if k in CURVES and (k not in keep or at not in (None, run["lr"])) else v) for k, v in run.items()}
            for run in summary["runs"]]
    return json.loads(json.dumps({**{k: v for k, v in summary.items() if k != "comparisons"}, "runs": runs}))


def check_recipe_summary(path, summary):
    """A UsageError naming path where the summary lacks what the results page reads."""
    schema.check_summary(path, summary, schema.RECIPE_SUMMARY)
    schema.check_recipe_name(path, summary)
    schema.check_values(path, summary)
    check_record_name(path, summary)
    for i, row in enumerate(summary["variants"]):
        for key, needs in schema.ENDED_ROW.items():
            found = schema.mismatch(row, needs, f"variants[{i}]") if row.get(key) else None
            if found:
                raise UsageError(f"{path}: {found} beside {key}; {schema.SUMMARY_ALLOWED}")


def check_record_name(path, summary):
    """A page data file (DATA: <anchor>.json, <anchor>.replicate<i>.json, as experiments_page names them) holds the
    recipe its name says, the part before its first dot; a UsageError naming path where it holds another (its claims
    would be published under that recipe's heading). A sweep's summary.json may be in any folder."""
    name = os.path.basename(path)
    if name == "summary.json":
        return
    own = anchor(summary["recipe"])
    if name.split(".")[0] != own:
        raise UsageError(f"{path}: recipe.name is {summary['recipe']['name']} ({summary['recipe']['scale']} scale), "
                         f"whose page data is {own}.json; {schema.SUMMARY_ALLOWED}")


def check_one_section(path, first, key):
    """A UsageError where path's recipe and scale (its section's anchor) came first from another place on the page
    (first: (its order and scale, its path)): two sections under one anchor."""
    if first[0] != key:
        raise UsageError(f"{path}: its recipe and scale are those of {first[1]}, at another place on the page "
                         f"(recipe.order {key[0]}, not {first[0][0]}); {schema.SUMMARY_ALLOWED}")


def check_verdicts(path, summary):
    """A UsageError naming path where a claim's stored verdict is not the one its own numbers give
    (claims.verdict, recomputed from p (Holm), the effect, its interval and coverage, the MDE and the target): the
    page prints only verdicts that follow from the numbers beside them."""
    withheld = summary.get("no_verdict")  # runs that failed to run leave the recipe without verdicts, and say why
    for i, claim in enumerate(summary["claims"]):
        numbers = {key: None for key in ("ci_coverage", "target_origin")} | claim
        recomputed = f"no verdict ({withheld})" if withheld else claims_lib.verdict(numbers)
        if claim["verdict"] != recomputed:
            raise UsageError(f"{path}: claims[{i}] says {claim['verdict']!r} where its numbers give "
                             f"{recomputed!r}; {schema.SUMMARY_ALLOWED}")


def design_changes(summary):
    """How a summary's recipe differs from lab/recipes.py and lab/claims.py as they stand: the variants, LRs,
    seeds, the recipe's own flags, the claims, or the failure rule, test and interval; [] where it is the current
    design."""
    recipe = summary["recipe"]
    if recipe["name"] not in recipes.RECIPES:
        return ["the recipe is not in lab/recipes.py"]
    now = json.loads(json.dumps(recipes.describe(recipe["name"], recipe["scale"], stage=recipe.get("stage"))))
    design = recipe["design"]
    changed = [what for what, then, current in (
        ("variants", recipe["variants"], now["variants"]), ("LRs", recipe["lrs"], now["lrs"]),
        ("seeds", recipe.get("seed_list"), now["seed_list"]),
        ("the recipe's flags", recipe["train_argv"][:len(now["recipe_argv"])], now["recipe_argv"]),
        ("claims", recipe["claims"], now["claims"]), ("failure rule", design.get("failure_rule"),
                                                      claims_lib.FAILURE_RULE),
        ("test", design.get("test"), claims_lib.TEST), ("interval", design.get("interval"), claims_lib.INTERVAL))
        if then != current]
    return changed


def extra_flags(recipe):
    """The flags the runs had beyond the recipe's own (sweep.py puts the command line's after the recipe's); None
    where the summary does not say which flags were the recipe's."""
    own = recipe.get("recipe_argv")
    if own is None or recipe["train_argv"][:len(own)] != own:
        return None
    return recipe["train_argv"][len(own):]


def variant_flags(variant):
    """The flags a variant adds to every run of it ('dn_postln+n_layer=6' -> --preset=dn_postln --n_layer=6), as
    sweep.py gives them."""
    return [f"--{part}" if "=" in part else f"--preset={part}" for part in variant.split("+")]


def flags_text(recipe):
    """The flags the runs had: those every run shares, and each variant's own (its flags win over the shared
    ones, so a shared flag a variant sets is listed with the variants, not as every run's)."""
    per_variant = {v: variant_flags(v) for v in recipe["variants"]}
    overridden = {flag.partition("=")[0] for flags in per_variant.values() for flag in flags}
    shared = [flag for flag in recipe["train_argv"] if flag.partition("=")[0] not in overridden]
    shared = without_paths(shared)
    own = "; ".join(f"{variant}: `{' '.join(flags)}`" for variant, flags in per_variant.items())
    return f"Every run's flags: `{' '.join(shared)}`; each variant's own: {own}."


def family_styles(variants):
    """{variant: (color, line style)}: one color per variant family (the preset a variant starts from), and a
    line style of its own for each variant of a family (dn_deepnorm+n_layer=6, ...=18, ...=36)."""
    families = list(dict.fromkeys(v.split("+")[0] for v in variants))
    styles, seen = {}, {}
    for variant in variants:
        family = variant.split("+")[0]
        seen[family] = seen.get(family, -1) + 1
        styles[variant] = (f"C{families.index(family) % 10}", LINE_STYLES[seen[family] % len(LINE_STYLES)])
    return styles


def save_figure(fig, path):
    """A PNG for the results page, readable at the page's width."""
    save_png(fig, path, dpi=FIGURE_DPI, bbox_inches="tight")


def figure_ramp(summary, ax):
    """Train loss along the LR ramp against the LR (log-x), one line per run, x where a run diverged (NormFormer
    final Fig. 5 plots the LR each run reached)."""
    styles = family_styles(summary["recipe"]["variants"])
    for variant, (color, style) in styles.items():
        for i, run in enumerate(r for r in summary["runs"] if r["variant"] == variant and r["curve"]):
            points = [(lr, loss) for _, lr, loss in run["curve"] if lr > 0 and math.isfinite(loss)]
            ax.plot(*zip(*points), style, color=color, lw=1, alpha=0.8, label=None if i else variant)
            if run["status"] == "diverged" and points:  # at the LR it diverged at, beside its last logged loss
                ax.plot(run["peak_lr"], points[-1][1], "x", color=color, ms=8, mew=2)
    log_lr_axis(ax, "learning rate (rising each step)")
    ax.set(ylabel="train loss (x: diverged)")


def capped(run):
    """A run's final val loss as the claims count it: min(L, ln V), a failed run at ln V (claims.FAILURE_RULE)."""
    return run.get("final_loss_capped")


def band(ax, xs, groups, color, style, label):
    """The median over seeds as a line and the min-max over seeds as a band, at each x that has values."""
    pairs = [(x, values) for x, values in zip(xs, groups) if values]
    if not pairs:
        return
    xs, groups = zip(*pairs)
    ax.plot(xs, [statistics.median(v) for v in groups], style, color=color, marker="o", ms=3, label=label)
    ax.fill_between(xs, [min(v) for v in groups], [max(v) for v in groups], color=color, alpha=0.15, lw=0)


def mark_diverged(ax, runs, x_of, color):
    """An x at each diverged run's counted loss (ln V)."""
    diverged = [(x_of(r), capped(r)) for r in runs if r["status"] == "diverged" and capped(r) is not None]
    if diverged:
        ax.plot(*zip(*diverged), "x", color=color, ms=8, mew=2)


def figure_loss_vs_lr(summary, ax):
    """Final val loss against the LR (log-x), per variant the median over seeds and a min-max band; a diverged run
    counts at ln V, a uniform guess (claims.FAILURE_RULE), marked x."""
    for variant, (color, style) in family_styles(summary["recipe"]["variants"]).items():
        mine = [r for r in summary["runs"] if r["variant"] == variant and r["status"] != "unfinished"]
        lrs = sorted({float(r["lr"]) for r in mine})
        band(ax, lrs, [[capped(r) for r in mine if float(r["lr"]) == lr and capped(r) is not None] for lr in lrs],
             color, style, variant)
        mark_diverged(ax, mine, lambda r: float(r["lr"]), color)
    log_lr_axis(ax, "peak learning rate")
    grid = sorted({float(r["lr"]) for r in summary["runs"]})
    ax.set_xticks(grid, [f"{lr:g}" for lr in grid])  # the sweep's own LRs
    ax.set(ylabel="final val loss, min(L, ln V)\n(line: median; band: min-max; x: diverged)")


def depth_of(variant):
    """The n_layer override of a variant ("dn_postln+n_layer=18" -> 18), None without one."""
    return next((int(part.partition("=")[2]) for part in variant.split("+")[1:] if part.startswith("n_layer=")), None)


def figure_depth(summary, ax):
    """Final val loss against depth at the claims' LR, per variant family the median over seeds and a min-max
    band, a diverged run at ln V (x); the dotted line is the val split's unigram entropy, the plateau of a model
    that has learned only the tokens' frequencies. Claims that read each arm at its best LR: each arm at its own."""
    lr = summary["recipe"]["claims"][0]["metric"].partition("@")[2]
    chosen = {arm: at for c in summary["claims"] for arm, at in (c.get("chosen_lr") or {}).items()}
    runs = [r for r in summary["runs"] if r["lr"] == chosen.get(r["variant"], lr) and r["status"] != "unfinished"]
    families = {}
    for variant in summary["recipe"]["variants"]:
        families.setdefault(variant.split("+")[0], []).append(variant)
    for i, (family, variants) in enumerate(families.items()):
        depths = sorted(depth_of(v) for v in variants)
        mine = [r for r in runs if r["variant"] in variants]
        band(ax, depths, [[capped(r) for r in mine if depth_of(r["variant"]) == d and capped(r) is not None]
                          for d in depths], f"C{i}", LINE_STYLES[0], family)
        mark_diverged(ax, mine, lambda r: depth_of(r["variant"]), f"C{i}")
    entropy = [r["unigram_entropy"] for r in runs if r.get("unigram_entropy")]
    if entropy:
        ax.axhline(statistics.median(entropy), color="gray", ls=":", lw=1, label="unigram entropy of val")
    depths = sorted({depth_of(v) for v in summary["recipe"]["variants"]})
    ax.set_xticks(depths, [str(d) for d in depths])
    where = "each arm's best LR" if chosen else f"LR {lr}"
    ax.set(xlabel="layers", ylabel=f"final val loss at {where}, min(L, ln V)\n(line: median; band: min-max)")


def ratio_metric(summary):
    """The gradient-ratio metric of the recipe's claims (grad_ratio@LR or fc2_grad_ratio@LR)."""
    return next(c["metric"] for c in summary["recipe"]["claims"] if "grad_ratio" in c["metric"])


def figure_grad_ratio(summary, axes):
    """Left: each seed's gradient ratio (layer 0 over the last layer, the geometric mean over telemetry steps
    10-100) per variant, the median a bar; right: the ratio at each telemetry step, the median over seeds per
    variant (Spike No More Fig. 3 and NormFormer Fig. 3 show the layers' gradients early in training)."""
    metric = ratio_metric(summary)
    name, _, lr = metric.partition("@")
    curve = "ratio_curve" if name == "grad_ratio" else "fc2_ratio_curve"
    styles = family_styles(summary["recipe"]["variants"])
    shown = [[], []]
    for x, (variant, (color, style)) in enumerate(styles.items()):
        mine = [r for r in summary["runs"] if r["variant"] == variant and r["lr"] == lr and r["status"] != "unfinished"]
        values = [r[name] for r in mine if finite_number(r.get(name))]
        shown[0] += values
        axes[0].plot([x] * len(values), values, "o", color=color, ms=4, alpha=0.7)
        if values:
            axes[0].plot([x - 0.3, x + 0.3], [statistics.median(values)] * 2, style, color=color, lw=2)
        steps = sorted({step for r in mine for step, _ in r.get(curve, [])})
        at = [[ratio for r in mine for s, ratio in r.get(curve, []) if s == step] for step in steps]
        shown[1] += [ratio for values_at in at for ratio in values_at]
        if steps:
            axes[1].plot(steps, [statistics.median(v) for v in at], style, color=color, label=variant)
    axes[0].set_xticks(range(len(styles)), list(styles), rotation=40, ha="right", fontsize=8)
    axes[0].set(ylabel=f"{name.replace('_', ' ')} at LR {lr}, each seed\n(the claims score abs ln of it)")
    axes[1].axvspan(*RATIO_STEPS, color="gray", alpha=0.1, lw=0)
    axes[1].set(xlabel="step (shaded: the steps averaged; dotted: even)", ylabel="the ratio, median over seeds")
    for ax, values in zip(axes, shown):
        # a log axis needs a positive ratio to show: a 1-layer model, or runs that diverged early, have none
        if not any(v > 0 for v in values):
            ax.text(0.5, 0.5, "no gradient ratios", transform=ax.transAxes, ha="center", va="center")
            continue
        ax.axhline(1.0, color="gray", ls=":", lw=1)  # even: the claims score |ln ratio|, the distance from here
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))


def figure_metric(summary, ax):
    """The first claim's metric for each variant, as the claims count it: every seed a dot, the median a bar (in
    the variant's line style), the number of diverged runs written above."""
    claim = summary["recipe"]["claims"][0]
    metric = claim["metric"]
    lr = metric.partition("@")[2]
    styles = family_styles(summary["recipe"]["variants"])
    for x, (variant, (color, style)) in enumerate(styles.items()):
        mine = [r for r in summary["runs"] if r["variant"] == variant and r["status"] != "unfinished"
                and (not lr or r["lr"] == lr)]
        counted = claims_lib.seed_values(summary["runs"], variant, metric, summary["recipe"]["lrs"],
                                         summary["recipe"].get("pilot", 0))
        values = [v for v in counted.values() if finite_number(v)]
        ax.plot([x] * len(values), values, "o", color=color, ms=4, alpha=0.7, label=variant)
        if values:
            ax.plot([x - 0.3, x + 0.3], [statistics.median(values)] * 2, style, color=color, lw=2)
        diverged = sum(r["status"] == "diverged" for r in mine)
        if diverged:
            ax.annotate(f"{diverged} diverged", (x, 1.0), xycoords=("data", "axes fraction"), ha="center",
                        va="bottom", fontsize=8, color=color)
    ax.set_xticks(range(len(styles)), list(styles), rotation=40, ha="right", fontsize=8)
    ax.set(ylabel=metric_label(metric))


FIGURES = {"ramp": figure_ramp, "loss_vs_lr": figure_loss_vs_lr, "depth": figure_depth,
           "grad_ratio": figure_grad_ratio, "metric": figure_metric}


def recipe_figure(summary, path):
    """The figure of one recipe, as its recipe asks (recipes.Recipe.figure); the title names the recipe, no path."""
    kind = summary["recipe"]["figure"]
    fig, axes = plt.subplots(1, 2 if kind == "grad_ratio" else 1, figsize=FIGURE_SIZE, layout="constrained")
    FIGURES[kind](summary, axes)
    legend_outside(axes[-1] if kind == "grad_ratio" else axes)
    fig.suptitle(f"{summary['recipe']['name']}: {summary['recipe']['title']}", fontsize=9, wrap=True)
    save_figure(fig, path)


def without_paths(argv):
    """The flags with an absolute path (a --data_dir of this machine) shown as <path>: the page names no machine's
    folders."""
    return [f"{arg.partition('=')[0]}=<path>" if os.path.isabs(arg.partition("=")[2]) else arg for arg in argv]


def ended_text(row):
    """How a variant's diverged runs ended: the most frequent rule, and the op that went over float16's range first
    (NormFormer arXiv v1 §4) or, where none did, the op whose forward max |x| grew the most before the end (train.py's
    diverged event, "grew_most"; older summaries have no such field)."""
    text = f"{row['variant']}: {row['criterion']} in {row['criterion_count']} of {row['runs']}"
    if row.get("failed_op"):
        return f"{text}, first op over the float16 range {row['failed_op']} in {row['failed_op_count']}"
    if row.get("grew_most"):
        return (f"{text}, none over {FP16_MAX:.0f}; the op that grew the most: {row['grew_most']} in "
                f"{row['grew_most_count']}")
    return text


def headline_rows(summary, replicates=(), fresh=None):
    """A recipe's headline rows; fresh: replication.replicates_by_key of the fresh-seed replicates (None: a page
    without that column's data, as the device check's)."""
    recipe = summary["recipe"]
    earlier = "earlier design: " if design_changes(summary) else ""
    rows = []
    for i, c in enumerate(summary["claims"]):
        replicate = (fresh or {}).get(replication.key(c), (None, None))[1]
        found = replication.reading(c, replicate) if c.get("tested", True) else None
        warned = f"; on fresh seeds: {found}" if found in (replication.SAME_DIRECTION,
                                                           replication.NOT_REPLICATED) else ""
        rows.append(f"| [{recipe['name']}](#{anchor(recipe)}) | {comparison_text(c)}: {metric_label(c['metric'])} | "
                    f"{interval_text(c['effect'], c['effect_ci'])} | {coverage_text(c.get('ci_coverage'))} | "
                    f"{p_value_text(c['p_holm'])} | {target_value_text(c)} | {power_cell(c)} | "
                    f"{earlier}{shown_verdict(summary, replicates, i)}{warned} | {replicate_cell(replicate, found)} |")
    return rows


def power_cell(claim):
    """The a-priori power at the pilot sd's upper bound, with the power at the estimate beside it."""
    if known(claim.get("power_at_estimate")) is None:
        return power_text(claim["power"])
    return f"{power_text(claim['power'])} ({power_text(claim['power_at_estimate'])} at the estimate)"


def replicate_cell(replicate, found):
    """The fresh-seed replicate's effect, interval, p (Holm) and reading (found; None: a descriptive row)."""
    if replicate is None:
        return "not run" if found else "n/a"
    effect = interval_text(replicate["effect"], replicate["effect_ci"])
    if found is None:
        return f"{effect} (descriptive)"
    return f"{effect}, p (Holm) {p_value_text(replicate['p_holm'])}: {found}"


def fresh_only_rows(fresh_summary, originals):
    """The headline rows of the claims only a fresh-seed replicate tests (NormFormer's width interaction): its own
    numbers and verdict, the a-priori power from the original seeds (replication.post_hoc)."""
    recipe = fresh_summary["recipe"]
    known_keys = {replication.key(c) for s in originals for c in s["claims"]}
    rows = []
    for c in fresh_summary["claims"]:
        if replication.key(c) in known_keys:
            continue
        before = replication.post_hoc(c, originals)
        planned = replication.power(before, c) if before else None
        rows.append(f"| [{recipe['name']}](#{anchor(recipe)}-replicate) | {comparison_text(c)}: "
                    f"{metric_label(c['metric'])} | {interval_text(c['effect'], c['effect_ci'])} | "
                    f"{coverage_text(c.get('ci_coverage'))} | {p_value_text(c['p_holm'])} | {target_value_text(c)} | "
                    f"{power_text(planned)} (from the original seeds) | {c['verdict']} (fresh seeds only: the claim "
                    "came from the original seeds) | itself |")
    return rows


def shown_verdict(summary, replicates, i):
    """A claim's verdict as the page shows it: "unstable across machines" where a replicate (the same recipe on
    another thread count or machine) reads it otherwise, so that one machine's rounding does not decide the word;
    for a chaotic recipe (recipes.Recipe.chaotic: the step a ramp diverges moves with the thread count and the CPU)
    without a replicate, a note that the spread was not measured."""
    claim = summary["claims"][i]
    if not claim.get("tested", True):
        return claim["verdict"]
    if not replicates:
        if summary["recipe"].get("chaotic"):
            return f"{claim['verdict']} (one machine and thread count only: the spread across them not measured)"
        return claim["verdict"]
    readings = [claim["reading"]] + [r["claims"][i]["reading"] for r in replicates]
    if len(set(readings)) > 1:
        where = "; ".join(f"{name}: {reading}" for name, reading in zip(run_names(summary, replicates), readings))
        return f"unstable across machines ({where})"
    return f"{claim['verdict']} (the same on {len(readings)} machines or thread counts)"


def run_names(summary, replicates):
    """"2-core AMD EPYC, 1 thread a run" for the summary and each replicate."""
    return [f"{s['machine']['hardware']}, {s.get('threads', '?')} thread{'s' if s.get('threads') != 1 else ''} a run"
            for s in (summary, *replicates)]


def headline(summaries, fresh=()):
    """The headline table: one row per claim of every recipe, its fresh-seed replicate beside it, and the claims
    only a replicate tests after its recipe's rows."""
    by_key = replication.replicates_by_key(fresh)
    originals = [summary for summary, _ in summaries]
    lines = ["| recipe | claim | effect: mean d [interval] (+: the paper's direction) | interval's coverage | "
             "p (Holm) | target (whose) | a-priori power for the target (pilot sd's 80% upper bound) | verdict | "
             "fresh-seed replicate: mean d [interval], p (Holm): reading |",
             "|---|---|---|---|---|---|---|---|---|"]
    for summary, replicates in summaries:
        lines += headline_rows(summary, replicates, by_key)
        lines += [row for f in fresh if f["recipe"]["name"] == summary["recipe"]["name"]
                  for row in fresh_only_rows(f, originals)]
    return "\n".join(lines)


def claim_lines(summary, data_link):
    """Per claim, what a reader re-derives its numbers from: the per-seed differences (in the committed data), the
    pilot's spread and the a-priori power it gave, the observed MDE, the verdict without the failed runs, and the
    mechanism's number where the claim needs one (z-loss: the baseline's |mean log Z| at the end)."""
    lines = []
    for i, c in enumerate(summary["claims"]):
        seeds = ", ".join(f"{seed}: {per_seed_text(d)}" for seed, d in zip(c["seeds"], c["differences"])) or "none"
        text = [f"**Claim {i + 1}** ({comparison_text(c)}): d = variant - reference per seed, in the metric's sign "
                f"(seed: d) {seeds}; in [{data_link}]({data_link}) as claims[{i}].differences."]
        if c.get("pilot_seeds"):
            pilot = ", ".join(f"{seed}: {per_seed_text(d)}"
                              for seed, d in zip(c["pilot_seeds"], c["pilot_differences"]))
            text += planned_power_lines(c, pilot, summary["recipe"]["name"])
        elif c["endpoint"] == "continuous":
            text.append("No pilot: no a-priori power.")
        if c.get("mde") is not None and c["endpoint"] == "continuous":
            text.append(f"Observed minimum detectable effect (from the tested pairs' own spread, not the design's): "
                        f"{mde_text(c['mde'])}.")
        text += tested_power_lines(c)
        for arm, flat in (c.get("flat_pilot") or {}).items():
            text.append(f"{arm}'s pilot is flat: its median losses over the grid lie within {value_text(flat['range'])}"
                        f" of each other, inside the pilot's noise ({value_text(flat['noise'])}, the seeds' typical "
                        "range at one LR): its LR is the lowest median by the rule fixed before the runs, and any LR "
                        "of the grid would have read it within that range.")
        second = c.get("second_rule")
        if second:
            text.append(f"Without the failed runs ({claims_lib.SECOND_RULE}): {second['n']} pairs, "
                        f"{interval_text(second['effect'], second['effect_ci'])}, p (Holm) "
                        f"{p_value_text(second['p_holm'])}: {second['reading']}.")
        if known(c["effect"]) is not None and c["effect"] < 0 and c["p"] is not None and c["p"] < 0.05:
            kind = "a tested claim" if c.get("tested", True) else "a row outside Holm's family, all the same"
            text.append(f"**Against the paper's direction** ({kind}): its own p is {p_value_text(c['p'])}, the mean d "
                        f"{per_seed_text(c['effect'])} in the paper's sign; read it as a finding of this scale, not "
                        "as noise.")
        elif (known(c["effect"]) is not None and c["effect"] < 0 and not c.get("tested", True)
              and not c.get("control")):
            text.append(f"Its estimate points against the paper's direction (mean d {per_seed_text(c['effect'])} in "
                        f"the paper's sign, its own p {p_value_text(c['p'])}): not significant at this scale, and a "
                        "descriptive row has no verdict, but nothing here supports the paper's direction either.")
        if c.get("control") and known(c["effect"]) is not None and c.get("effect_ci"):
            low, high = c["effect_ci"]
            if low > 0 or high < 0:
                text.append(f"**A gap where the paper predicts none** (a control, outside Holm's family): mean d "
                            f"{per_seed_text(c['effect'])} in the claim's sign, its interval "
                            f"{interval_text(c['effect'], c['effect_ci'])} excludes 0, its own p "
                            f"{p_value_text(c['p'])}; the claims above compare arms that differ by this much even "
                            "where depth is not the problem.")
            else:
                text.append(f"No gap detected, as the paper predicts (a control): the interval "
                            f"{interval_text(c['effect'], c['effect_ci'])} includes 0.")
        if c["metric"].startswith("log_z@"):
            text.append(f"The baseline's |mean log Z| at the end: median {value_text(c['arm_medians'][c['reference']])}"
                        f" over its seeds, {drift_text(c['arm_medians'][c['reference']], c['effect_to_detect'])}.")
        lines += [" ".join(text), ""]
    return lines


def planned_power_lines(claim, pilot, name):
    """The a-priori power at the pilot sd's upper bound and at its estimate, the pairs 80% would take, and, below
    80%, what a reading from so weak a design says: a significant one is read against the winner's curse only where
    the tested pairs' own spread left it weak too."""
    needs, bound = claim.get("pairs_for_power"), known(claim.get("pilot_sd_bound"))
    estimate = value_text(known(claim.get("pilot_sd")))
    at = (f"at the pilot sd's 80% upper bound {value_text(bound)} ({power_text(claim.get('power_at_estimate'))} at "
          f"the estimate {estimate}, which {len(claim['pilot_seeds'])} seeds cannot carry)" if bound is not None
          else f"from the pilot's sd {estimate}")
    lines = [f"A-priori power {power_text(claim['power'])} for the target with {claim.get('planned_pairs')} planned "
             f"pairs, {at} (pilot seeds, never tested: {pilot}); 80% power would take "
             f"{f'{needs} pairs' if needs else 'more than 16 pairs'}{' at the bound' if bound is not None else ''}."]
    if known(claim["power"]) is None or claim["power"] >= claims_lib.TARGET_POWER:
        return lines
    tested = known(claim.get("power_tested"))
    if claim.get("reading") not in ("agrees", "disagrees"):
        weak = (f"Below {claims_lib.TARGET_POWER:.0%}: at this scale the design could not be planned to decide the "
                "claim")
    elif tested is not None and tested >= claims_lib.TARGET_POWER:
        weak = (f"Below {claims_lib.TARGET_POWER:.0%} as planned, but the tested pairs' own spread gave "
                f"{power_text(tested)} power for the target, so the design turned out strong enough")
    else:
        weak = (f"Below {claims_lib.TARGET_POWER:.0%} for the target, yet the effect was large enough to detect: a "
                "significant result from a design this weak overstates the effect's size more often than a "
                "well-powered one (the winner's curse), so read the estimate with care")
    return [*lines, f"{weak}; the GPU-sized version is `python sweep.py --recipe={name} --scale=gpu`."]


def tested_power_lines(claim):
    """Beside a "not detected" or "smaller than": the power the tested pairs' own spread gives for the target, and
    a plain caveat where it is under 80%."""
    if claim.get("reading") not in ("not detected", "smaller") or known(claim.get("power_tested")) is None:
        return []
    text = (f"At the tested pairs' own sd ({value_text(known(claim.get('sd')))}), these {claim['n']} pairs had "
            f"{power_text(claim['power_tested'])} power for the target.")
    if claim["power_tested"] < claims_lib.TARGET_POWER:
        text += (f" Under {claims_lib.TARGET_POWER:.0%}: a real effect of the target's size would often go "
                 "undetected here, so this reading says little about whether the effect exists.")
    return [text]


def drift_text(log_z, drift):
    """What the baseline's |mean log Z| says of the z-loss claim beside it: below the drift the design counts (the
    claim's target), nothing for z-loss to fix; at or past it, a drift it could have fixed."""
    if known(log_z) is None:
        return "unknown: whether there was a drift for z-loss to fix is not known"
    if abs(log_z) < drift:
        return (f"within {value_text(drift)} of 0: nothing for z-loss to fix, so a \"not detected\" above says "
                "little")
    return (f"at least {value_text(drift)} from 0: the drift z-loss is meant to prevent was there, so the verdict "
            "above is about z-loss, not about a problem that never arose")


def replicate_lines(summary, replicates):
    """Where a recipe ran more than once: each run set's machine, threads and each claim's effect, p and reading,
    the spread the verdict is judged against (descriptive rows too: spike counts are as chaotic as a divergence
    step); for a chaotic recipe run once, that its spread was not measured."""
    if not replicates:
        if not summary["recipe"].get("chaotic"):
            return []
        return ["Spread across machines and thread counts: not measured (one run set). The endpoint is chaotic: "
                "re-run with another --jobs (another thread count) into --out_dir=sweeps/NAME_threadsN.", ""]
    lines = ["Spread across machines and thread counts (the same recipe, seeds and flags; the verdict reads "
             "\"unstable across machines\" where they differ; a relative target follows each run set's own pilot):",
             "", "| run set | claim | effect: mean d [interval] | p (Holm) | target | reading | time |",
             "|---|---|---|---|---|---|---|"]
    names = run_names(summary, replicates)
    for name, run in zip(names, (summary, *replicates)):
        minutes = run["wall_s"] / 60 if finite_number(run["wall_s"]) else None
        for c in run["claims"]:
            lines.append(f"| {name} | {comparison_text(c)}: {metric_label(c['metric'])} | "
                         f"{interval_text(c['effect'], c['effect_ci'])} | {p_value_text(c['p_holm'])} | "
                         f"{value_text(known(c['effect_to_detect']))} | {c['reading']} | "
                         f"{'unknown' if minutes is None else f'{minutes:.1f} min'} |")
    lines += ["", *seed_moves(summary, replicates, names[1:])]
    return [*lines, ""]


def seed_moves(summary, replicates, names):
    """How far each claim's per-seed difference d moved from the first run set to each other one (named by names),
    on the seeds both paired: the spread one machine's number carries."""
    lines = []
    for i, c in enumerate(summary["claims"]):
        first = dict(zip(c["seeds"], c["differences"]))
        for name, run in zip(names, replicates):
            other = dict(zip(run["claims"][i]["seeds"], run["claims"][i]["differences"]))
            moves = [abs(other[seed] - first[seed]) for seed in first if seed in other]
            if moves:
                lines.append(f"- Claim {i + 1}, {name}: the per-seed d moved by up to {value_text(max(moves))} "
                             f"(median {value_text(statistics.median(moves))}) over the {len(moves)} seeds both "
                             "paired.")
    return lines


def per_seed_text(value):
    """A per-seed number to 4 significant digits with its sign, +0.01234 (n/a for none)."""
    return "n/a" if known(value) is None else f"{value:+.4g}"


def diverged_text(summary):
    """How many runs of each arm failed among the pairs of each claim (their loss counts as ln V)."""
    found = {arm: count for c in summary["claims"] for arm, count in c["diverged"].items() if count}
    if not found:
        return []
    return ["Failed runs among the pairs (counted by the failure rule above): " +
            "; ".join(f"{arm}: {count}" for arm, count in found.items()) + ".", ""]


def lr_curve_table(summary):
    """The final val loss of each variant at each LR (median over seeds, a failed run at ln V), the runs that
    diverged, and Wortsman et al.'s LR sensitivity of the medians."""
    lrs = summary["recipe"]["lrs"]
    lines = ["| variant | " + " | ".join(f"L({lr})" for lr in lrs) + " | diverged runs | LR sensitivity |",
             "|" + "---|" * (len(lrs) + 3)]
    ended = [r for r in summary["runs"] if r["status"] != "unfinished"]
    # where the tested seeds ran only each arm's chosen LR, the medians stand on different numbers of seeds: say how
    # many behind each
    uneven = len(set(collections.Counter((r["variant"], r["lr"]) for r in ended).values())) > 1
    sensitivity = [c for c in summary["claims"] if c["metric"] == "lr_sensitivity"]
    for variant in summary["recipe"]["variants"]:
        mine = [r for r in ended if r["variant"] == variant]
        cells = [lr_cell([capped(r) for r in mine if r["lr"] == lr], uneven) for lr in lrs]
        medians = [c["arm_medians"].get(variant) for c in sensitivity]
        lines.append(f"| {variant} | " + " | ".join(cells) + f" | {sum(r['status'] == 'diverged' for r in mine)} of "
                     f"{len(mine)} | {value_text(medians[0] if medians else None)} |")
    seeds = (" (in parentheses: the seeds behind each median, as the tested seeds ran only the LRs the pilot chose)"
             if uneven else "")
    tested = (f"the median over the {sensitivity[0]['n']} tested seeds (the pilot's are not tested) of each seed's "
              "own" if sensitivity else "the median over seeds of each seed's own")
    return [f"Final val loss per LR (median over every seed that ran it, pilot seeds included, min(L, ln V)){seeds}; "
            f"the LR sensitivity is {tested}:", "", *lines, ""]


def lr_cell(losses, counted):
    """One cell of lr_curve_table: the median loss, with the number of seeds behind it where counted."""
    text = value_text(median_of(losses))
    return f"{text} ({len(losses)})" if counted and losses else text


def leakage_table(summary):
    """For each batch-statistic arm: the val loss in eval mode (running statistics, what the claims use) beside
    the same windows' loss in training mode (batch statistics, where a token's normalizer sees the rest of the
    batch, future tokens included)."""
    runs = [r for r in summary["runs"] if r.get("val_loss_batch_stats") is not None]
    if not runs:
        return []
    lines = ["| variant | LR | val loss, eval mode | val loss, batch statistics | eval minus batch, median [min, max] "
             "| runs |", "|---|---|---|---|---|---|"]
    for variant in summary["recipe"]["variants"]:
        for lr in summary["recipe"]["lrs"]:
            mine = [r for r in runs if r["variant"] == variant and r["lr"] == lr]
            if mine:
                leak = [r["leakage"] for r in mine]
                lines.append(f"| {variant} | {lr} | {value_text(median_of([r['final_loss'] for r in mine]))} | "
                             f"{value_text(median_of([r['val_loss_batch_stats'] for r in mine]))} | "
                             f"{value_text(median_of(leak))} [{value_text(min(leak))}, {value_text(max(leak))}] | "
                             f"{len(mine)} |")
    return ["Leakage (descriptive, not tested): each batch-statistic arm's val loss with running statistics (eval "
            "mode) beside its loss on the same windows with batch statistics (training mode); medians over "
            "seeds, finished runs:", "", *lines, ""]


def plateau_table(summary):
    """Per arm and LR: how many runs ended below 0.9 x the val split's unigram entropy (left the plateau)."""
    runs = [r for r in summary["runs"] if r.get("left_plateau") is not None]
    if summary["recipe"]["figure"] != "depth" or not runs:
        return []
    lines = ["| variant | LR | left the plateau |", "|---|---|---|"]
    for variant in summary["recipe"]["variants"]:
        for lr in summary["recipe"]["lrs"]:
            mine = [r for r in runs if r["variant"] == variant and r["lr"] == lr]
            if mine:
                lines.append(f"| {variant} | {lr} | {sum(r['left_plateau'] for r in mine)} of {len(mine)} |")
    return ["Runs that left the unigram plateau (descriptive: final val loss below 0.9 x the val split's unigram "
            "entropy):", "", *lines, ""]


def median_of(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def design_text(recipe):
    """The design paragraph: what ran, the pilot, on which windows, how the claims are tested, the failure rule and
    the second rule it is checked against. A ramp's metric is the step a run fails at: its validation windows score
    only the final loss, which no claim reads."""
    d = recipe["design"]
    windows = d["eval_windows"]
    seeds = d["seeds"]
    pilot = recipe.get("pilot", 0)
    split = (f"the first {pilot} the pilot ({seeds[0]}-{seeds[pilot - 1]}: they choose each arm's LR and fix the "
             f"a-priori power; never tested), then {len(seeds) - pilot} tested" if pilot else "all tested")
    scored = (f"every run's final loss scored on the same {windows['windows']} validation windows "
              f"({windows['eval_iters']} x {windows['batch_size']} windows of {windows['block_size']} tokens, "
              f"{windows['tokens']:,} tokens)")
    if recipe.get("mode") == "ramp":
        scored = "the metric is the step at which a run fails on the rising LR (no claim reads the validation loss)"
    return [f"Design, fixed before the runs: {len(d['variants'])} variants x {len(d['lrs'])} LR(s) "
            f"({', '.join(d['lrs'])}) x {len(seeds)} seeds ({seeds[0]}-{seeds[-1]}; {split}), {d['steps']} steps "
            f"a run; {scored}; family: {d['family']}; power at alpha = {d['power_alpha']:.3g} (Holm's first step), "
            "from the pilot's spread of the paired differences.", "",
            f"- Test, for every claim: {d['test']}.",
            f"- Interval: {d.get('interval', 'not recorded in this summary')}.",
            f"- Failure rule: {d.get('failure_rule', 'not recorded in this summary')}.",
            f"- Second rule, to show what the failure rule decides: {claims_lib.SECOND_RULE}.", ""]


def design_record_text(summary):
    """The design's hash as sweep.py recorded it before the runs started (stage and time), and whether it is the
    design lab/recipes.py holds now."""
    entries = summary.get("design_record") or []
    now = summary["recipe"].get("design_sha256")
    if not entries:
        return ["No design hash was recorded before these runs started.", ""]
    shown = "; ".join(f"{e['stage']}: {e['sha256'][:12]} at {e['recorded']}" for e in entries)
    same = entries[-1]["sha256"] == now
    unhashed = (" No hash was recorded for the pilot stage alone: the pilot and the tested seeds ran as one sweep, so "
                "nothing on record shows the design was fixed between them." if summary["recipe"].get("pilot")
                and not any(e["stage"] == "pilot" for e in entries) else "")
    return [f"Design hash (lab/recipes.design_hash) recorded before the runs started: {shown}; the summary's design "
            f"{'is' if same else 'is not'} the last one recorded.{unhashed}", ""]


def earlier_design_text(summary):
    """A warning above a section whose runs had another design or rules than lab/recipes.py and lab/claims.py
    have now: its verdicts are that design's."""
    changed = design_changes(summary)
    if not changed:
        return []
    name = summary["recipe"]["name"]
    return [f"**From an earlier design.** These runs' {', '.join(changed)} differ from lab/recipes.py and "
            "lab/claims.py as they stand: the numbers and verdicts below are that design's, not the current one's. "
            f"Re-run `python sweep.py --recipe={name}` and this page.", ""]


def command_text(summary):
    """The command and flags the runs had, the time it took, and where."""
    recipe, machine = summary["recipe"], summary["machine"]
    extra = extra_flags(recipe)
    command = " ".join([recipe["command"], *without_paths(extra or [])])
    minutes = summary["wall_s"] / 60 if finite_number(summary["wall_s"]) else None
    load = machine["load"] if finite_number(machine["load"]) else None
    pilot = f"`{recipe['command'].replace(' --jobs', ' --pilot --jobs')}`, then " if recipe.get("pilot") else ""
    lines = [f"Command: {pilot}`{command}`, then `python plot.py --experiments=sweeps --out=docs`. It took "
             f"{'an unknown time' if minutes is None else f'{minutes:.1f} min'} on {machine['hardware']} "
             f"(5-minute load average {'unknown' if load is None else f'{load:.1f}'} as it ended, its own runs "
             f"included), torch {machine['torch']}, {machine['date']}. {flags_text(recipe)}"]
    if extra is None:
        lines.append("This summary does not say which flags were the recipe's: the flags above are the runs'.")
    elif extra:
        lines.append(f"These runs had flags beyond the recipe's (`{' '.join(without_paths(extra))}`): the deviations "
                     "above are the recipe's and do not describe them.")
    return lines


def anchor(recipe):
    return recipe["name"] + ("_gpu" if recipe["scale"] == "gpu" else "")


def original_claim(claim, originals):
    """The original claim a replicate's claim repeats ((its summary, the claim)), or (None, None)."""
    return next(((s, c) for s in originals for c in s["claims"] if replication.key(c) == replication.key(claim)),
                (None, None))


def fresh_section(fresh, originals, data_link):
    """A recipe's fresh-seed replicate: its design, each claim beside the original, per-seed data, the grid check."""
    recipe = fresh["recipe"]
    seeds = recipe["seed_list"]
    chosen = ", ".join(f"{arm} {lr}" for arm, lr in (recipe.get("best_lrs") or {}).items())
    tested = sum(c.get("tested", True) for c in fresh["claims"])
    lines = [f'<a id="{anchor(recipe)}-replicate"></a>', "### Fresh-seed replicate", "",
             f"Seeds {seeds[0]}-{seeds[-1]} ({len(seeds)}, none of them run by nanonorm before), fixed in "
             "lab/recipes.py before any of them ran: the original's flags, test, interval and failure rule, "
             f"{f'each arm at the LR its original pilot chose ({chosen}), ' if chosen else 'the same LR grid, '}"
             f"no pilot (a replicate chooses nothing), Holm over the replicate's {tested} tested claims. Its "
             "a-priori power comes from the original's tested pairs: their sd's 80% one-sided upper bound, the "
             "original's target, the replicate's pairs and level. Reading (lab/replication.py, in this order): "
             "\"replicates\" where the original was significant (p (Holm) < 0.05) and the replicate is too, in the "
             "same direction, or neither was; \"same direction, not significant\" where only the original was and "
             "the replicate's mean d has its sign; \"does not replicate\" otherwise.", "",
             *design_record_text(fresh),
             "| claim | original: mean d [interval], p (Holm), verdict | replicate: mean d [interval] | interval's "
             "coverage | n pairs | p | p (Holm) | a-priori power for the target | replicate's verdict | reading |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in fresh["claims"]:
        source, first = original_claim(c, originals)
        if first is None:
            first = replication.post_hoc(c, originals)
            before = (f"{interval_text(first['effect'], first['effect_ci'])}, p {p_value_text(first['p'])} on the "
                      "original seeds (post hoc: the claim came from them)" if first else "none")
            found = "tested here first" if c.get("tested", True) else "descriptive"
        else:
            before = (f"{interval_text(first['effect'], first['effect_ci'])}, {p_value_text(first['p_holm'])}, "
                      f"{first['verdict']}" + ("" if source is None or source["recipe"]["name"] == recipe["name"]
                                               else f" ({source['recipe']['name']})"))
            found = replication.reading(first, c) if c.get("tested", True) else "descriptive"
        planned = replication.power(first, c) if first and c.get("tested", True) else None
        lines.append(f"| {comparison_text(c)}: {metric_label(c['metric'])}{chosen_lr_text(c)} | {before} | "
                     f"{interval_text(c['effect'], c['effect_ci'])} | {coverage_text(c.get('ci_coverage'))} | "
                     f"{c['n']} | {p_value_text(c['p'])} | {p_value_text(c['p_holm'])} | {power_text(planned)} | "
                     f"{c['verdict']} | {found} |")
    lines.append("")
    for i, c in enumerate(fresh["claims"]):
        per_seed = ", ".join(f"{seed}: {per_seed_text(d)}" for seed, d in zip(c["seeds"], c["differences"]))
        lines.append(f"- Claim {i + 1} ({comparison_text(c)}): d per seed, in the metric's sign, {per_seed or 'none'}; "
                     f"in [{data_link}]({data_link}) as claims[{i}].differences.")
    lines += ["", *lr_check_lines(fresh), *command_text(fresh), ""]
    return lines


def lr_check_lines(fresh):
    """The grid check: each best-LR arm's median loss at its chosen LR and at its sqrt(2) neighbours on the check
    seeds, and the grid's error against the smallest target of the claims that read the arm."""
    rows = replication.lr_check(fresh)
    if not rows:
        return []
    recipe = fresh["recipe"]
    check = recipe["seed_list"][:recipe["check_seeds"]]
    targets = [c["effect_to_detect"] for c in fresh["claims"] if c["metric"] == "best_loss" and c.get("tested", True)]
    target = min(targets) if targets else None
    lines = [f"The grid's error, measured: each arm at its chosen LR and at its sqrt(2) neighbours on seeds "
             f"{check[0]}-{check[-1]} (median final loss; the error is how much lower the best of the three is than "
             f"the chosen LR's{f', against the smallest loss target here, {value_text(target)}' if target else ''}):",
             "", "| arm | chosen LR | median loss by LR | the grid's error |", "|---|---|---|---|"]
    for arm, chosen, medians, error in rows:
        by_lr = ", ".join(f"{lr}: {value_text(m)}" for lr, m in medians.items())
        over = "" if error is None or target is None or error <= target else " (more than the target)"
        lines.append(f"| {arm} | {chosen} | {by_lr} | {value_text(known(error))}{over} |")
    return [*lines, ""]


def replicated_elsewhere(summary, fresh):
    """A pointer to the fresh-seed replicate of another recipe that holds this recipe's claims, [] where none does
    (or the recipe's own does)."""
    name = summary["recipe"]["name"]
    keys = {replication.key(c) for c in summary["claims"]}
    holders = [f["recipe"] for f in fresh if f["recipe"]["name"] != name
               and keys & {replication.key(c) for c in f["claims"]}]
    return [f"This recipe's claims were replicated on fresh seeds together with {r['name']}'s, on the same seeds: "
            f"[{r['name']}'s replicate](#{anchor(r)}-replicate).\n" for r in holders]


def recipe_section(summary, replicates, figure, data_link):
    recipe = summary["recipe"]
    ended = [ended_text(row) for row in summary["variants"] if row.get("criterion")]
    lines = [f'<a id="{anchor(recipe)}"></a>', f"## {recipe['title']}", "", *earlier_design_text(summary),
             f"Recipe `{recipe['name']}` ({recipe['scale']} scale). Paper: {recipe['paper']}.", "",
             f"> {recipe['quote']}", "", *design_text(recipe), *design_record_text(summary),
             claims_table(summary["claims"]), "", *claim_lines(summary, data_link),
             *replicate_lines(summary, replicates),
             *diverged_text(summary)]
    if summary["mode"] == "lr":
        lines += lr_curve_table(summary)
    lines += leakage_table(summary) + plateau_table(summary)
    if ended:
        lines += ["How the runs that diverged ended (the most frequent rule; loss gap and loss bound are nanonorm's "
                  "divergence rules, probes.DivergenceCheck, not the papers'): " + "; ".join(ended) + ".", ""]
    lines += [f"Deviations from the paper's protocol: {recipe['deviations']}.", "", *command_text(summary),
              "", f"![{recipe['name']}]({figure})", ""]
    return "\n".join(lines)


INTRO = """\
Generated by `python plot.py --experiments=sweeps --out=docs` from the summary.json of each \
recipe's sweep (`python sweep.py --recipe=NAME`), which also writes what the page is made from into \
[experiments/records/](experiments/records/) (one JSON a recipe: each run's final metrics, each claim's \
per-seed differences, the design and its hash); `python plot.py --experiments=docs/experiments/records --out=docs` \
regenerates this page from that folder alone, byte for byte (tests/test_plot.py and CI check it). Edit lab/recipes.py \
and re-run, never this page. NormFormer's numbers name their version: arXiv v1 (the earlier text) or final (the \
later, fuller one); see [papers.md](papers.md). A section whose runs had another design or other rules than \
lab/recipes.py and lab/claims.py have now says so at its top, and its verdicts in the headline read "earlier design:".

How to read the numbers. Each claim is a comparison fixed in lab/recipes.py before the runs: a variant against a \
reference of the same model context, on one metric, in the direction the paper states, with a target effect in the \
metric's unit and whose it is (the paper's number, converted to nats per byte where the paper counts GPT-2 tokens \
or words, or nanonorm's choice where the paper gives none). Every arm runs the same seeds and every run is scored \
on the same validation windows, so the runs of two arms with the same seed form a pair. Per pair: d = variant - \
reference (for an interaction, the difference of two such differences), signed so that a positive d is the \
paper's direction. A recipe's first seeds are its pilot: they choose each arm's LR where a claim reads an arm at \
its best (an interior point of a grid 2x apart, else "optimum not bracketed" and no verdict), give the spread from \
which the number of tested seeds was chosen, and are never tested. Each section states its failure rule (a failed \
run's loss counts at ln V, a uniform guess over the tokenizer's V tokens, the same for both arms), the second rule \
it is checked against, its test and its interval.

- **p**: the exact two-sided sign-flip permutation test of the mean of d over seeds (a binary endpoint: the exact \
McNemar test). With n pairs the smallest possible p is 2 / 2^n (8 pairs: 0.0078).
- **p (Holm)**: a recipe's tested claims are one family, Holm-adjusted together. Descriptive rows (a comparison \
no design of this size can power, or a check of the mechanism beside a tested claim) and controls (where the \
paper predicts no effect) stand outside it, with their own p.
- **effect: mean d [interval]**: the mean of d with the interval of the shifts the same test does not reject, at \
the family's level 1 - 0.05 / m for a recipe of m tested claims (95% for a descriptive row); its achieved \
coverage is printed beside it, as a discrete test reaches a level only approximately (8 pairs at 95%: 95.3%).
- **a-priori power for the target**: the chance that the planned pairs detect a true mean difference of the \
target's size at alpha = 0.05 / m (Holm's first step), with differences spread as the pilot's sd's 80% one-sided \
upper confidence bound (chi-square; 2.1x the estimate from 3 pilot pairs): fixed before the tested seeds ran. The \
power at the pilot's estimate is printed beside it, as what 3 seeds alone would claim. The **observed MDE** beside \
a claim comes from the tested pairs' own spread: it describes them, it did not choose the design; beside a "not \
detected" or "smaller than" the power at that spread is printed too, with a caveat where it is under 80%.
- **verdict**, the first of these that holds, in the order the code checks them (lab/stats.verdict): \
"disagrees" (p (Holm) < 0.05, against the paper's direction), "smaller than" the target (the interval, at the \
family's level, ends short of it: "detected in its direction" where p (Holm) < 0.05 too, so a claim can be \
significant in the paper's direction and still read "smaller than"), "agrees" (p (Holm) < 0.05, in the paper's \
direction) or "not detected" (with the observed MDE). Where the claim's arms had failed runs it is judged again \
without them, and a verdict that changes says "rests on the failure rule". A verdict reads "unstable across \
machines" where run sets of the same recipe on other thread counts or CPUs read it otherwise. The page recomputes \
each verdict from the numbers beside it and refuses a summary whose stored verdict differs.
- **fresh-seed replicate**: every tested claim again on seeds fixed in lab/recipes.py before any of them ran \
(`python sweep.py --recipe=NAME --replicate`), with the original's design and each arm at the LR its original pilot \
chose: "replicates" (significant in the same direction at the replicate's own level, or not significant where the \
original was not either), "same direction, not significant", or "does not replicate"; a verdict whose replicate \
does not replicate says so beside it.

Descriptive numbers (LR curves, leakage, plateau counts) are shown, not tested."""

RECOMPUTE = """\
How to recompute a claim's p and interval from its data, with scipy (the claim's differences are in the metric's \
sign; the sign-flip test is scipy's paired permutation test, exact over all 2^n sign patterns):

```python
import itertools, json, math
import numpy as np
from scipy.stats import permutation_test

claim = json.load(open("docs/experiments/records/RECIPE.json"))["claims"][0]
sign = (1 if claim["better"] == "higher" else -1) * (1 if claim["expect"] == "better" else -1)
d = sign * np.array(claim["differences"])  # + is the paper's direction
p = permutation_test((d,), np.mean, permutation_type="samples", n_resamples=np.inf).pvalue
alpha = claim["alpha_first_step"] if claim["tested"] else 0.05
means = sorted(np.mean(s) for k in range(1, len(d) + 1) for s in itertools.combinations(d, k))
k = max(1, math.floor(alpha * 2 ** len(d) / 2))  # the interval drops k - 1 of the 2^n - 1 means at each end
print(p, [means[k - 1], means[-k]], 1 - 2 * k / 2 ** len(d))  # p, the interval, its coverage
```

p (Holm) is Holm's step-down adjustment of the recipe's tested claims' p-values together.

How to re-run one run and get its numbers bit for bit: `python sweep.py --recipe=NAME --dry_run` prints every \
run's train.py command, and sweep.py pins each run to its share of the cores, which sets its thread count \
(`--jobs=2` on 2 cores: 1 thread). Give the command the same number of cores, for 1 thread `taskset -c 0 python \
train.py ...`: the float sums are then added in the same order. With another thread count (train.py uses every core \
it may run on) the numbers differ in the third or fourth digit, and a chaotic endpoint, such as the step a ramp \
diverges, can move by many steps: what the spread tables beside such claims measure."""


def spread_text(summaries):
    """Which recipes ran on a second thread count or CPU (the spread tables) and which on one only."""
    two = [s["recipe"]["name"] for s, others in summaries if others]
    one = [s["recipe"]["name"] for s, others in summaries if not others]
    return (f"Run again on the same seeds on a second CPU or thread count (their spread tables): "
            f"{', '.join(two) or 'none'}; on one CPU and thread count only, so the spread across machines is not "
            f"measured: {', '.join(one) or 'none'}.")


def not_run_text(summaries):
    """The line that names lab/recipes.py's recipes with no data here: claims the page cannot speak to."""
    missing = not_run(summaries)
    return (f"Not yet run under the current design, so without a verdict: {', '.join(missing)} (see "
            "[Not yet run](#not-yet-run))." if missing else "Every recipe of lab/recipes.py has data here.")


def not_run(summaries):
    return [name for name in recipes.RECIPES if name not in {s["recipe"]["name"] for s, _ in summaries
                                                              if not design_changes(s)}]


def not_run_section(summaries):
    """Each recipe without data under its current design: its title, and the commands that would run it."""
    missing = not_run(summaries)
    if not missing:
        return []
    lines = ['<a id="not-yet-run"></a>', "## Not yet run", "",
             "These recipes have no runs under the design lab/recipes.py holds now, so the page gives them no "
             "verdict. Each runs its pilot seeds first (`--pilot`: they choose each arm's LR and give the spread "
             "from which its seeds were chosen), then the rest:", ""]
    for name in missing:
        recipe = recipes.RECIPES[name]
        lines.append(f"- `{name}`: {recipe.title}. `python sweep.py --recipe={name} --pilot --jobs=2`, then "
                     f"`python sweep.py --recipe={name} --jobs=2`; at GPU size `python sweep.py --recipe={name} "
                     "--scale=gpu`.")
    return [*lines, ""]


AS_WRITTEN = ("command", "train_argv", "recipe_argv")  # printed in code spans, where an entity would show as such


def current_words(summary):
    """The summary with its recipe's words (title, paper, quote, deviations) as lab/recipes.py has them now, where
    its runs had the design lab/recipes.py holds (design_changes): a sentence about the design may be corrected after
    the runs, its numbers may not; the record keeps the words its runs recorded, under its design hash."""
    recipe = summary["recipe"]
    if recipe["name"] not in recipes.RECIPES or design_changes(summary):
        return summary
    now = recipes.describe(recipe["name"], recipe["scale"], stage=recipe.get("stage"))
    return {**summary, "recipe": {**recipe, **{key: now[key] for key in WORDS}}}


def as_printed(summary):
    """A summary as the page prints it: each string it holds HTML-escaped (&, <, >: escaped), since Markdown passes
    HTML through and the page writes what a summary says (a quote of "<script>" is text on the page). Left as they
    are: what the page prints inside code spans (AS_WRITTEN) and the recipe's declared claims, which the page
    compares with lab/recipes.py's (design_changes) and does not print. The names the page looks things up by
    (variants, LRs, metrics) hold none of these characters (lab/schema checks them)."""
    printed = escaped(summary)
    printed["recipe"]["claims"] = summary["recipe"]["claims"]
    return printed


def escaped(value, kept=False):
    """value with each string in it HTML-escaped, except under the keys AS_WRITTEN (kept: this value is one)."""
    if kept:
        return value
    if isinstance(value, str):
        return html.escape(value, quote=False)
    if isinstance(value, list):
        return [escaped(item) for item in value]
    if isinstance(value, dict):
        return {k: escaped(v, k in AS_WRITTEN) for k, v in value.items()}
    return value


def experiments_page(root, out):
    """docs/experiments.md, a figure per recipe and the page's data (DATA: one <name>.json a recipe, and
    <name>.replicate<i>.json for a recipe's other run sets), from the recipes' summaries alone: root is
    sweeps/ (the runs' summary.json files) or a data folder this wrote, which regenerates the same page byte for
    byte. The headline table also goes to stdout."""
    summaries, fresh = read_recipe_summaries(root)
    make_folder(os.path.join(out, DATA))
    for summary, replicates in summaries:
        name = anchor(summary["recipe"])
        own = [f for f in fresh if f["recipe"]["name"] == summary["recipe"]["name"]]
        for path, value in [(f"{DATA}/{name}.json", summary), *((f"{DATA}/{name}.replicate{i}.json", replicate)
                                                                 for i, replicate in enumerate(replicates, 1)),
                            *((f"{DATA}/{name}.replication.json", f) for f in own)]:
            files.write_atomic(os.path.join(out, path), json.dumps(value, indent=1).encode())
        recipe_figure(summary, os.path.join(out, "experiments", f"{name}.png"))
    summaries = [(as_printed(current_words(summary)), [as_printed(current_words(r)) for r in replicates])
                 for summary, replicates in summaries]
    fresh = [as_printed(current_words(f)) for f in fresh]
    originals = [summary for summary, _ in summaries]
    sections = []
    for summary, replicates in summaries:
        name = anchor(summary["recipe"])
        own = [f for f in fresh if f["recipe"]["name"] == summary["recipe"]["name"]]
        extra = [line for f in own for line in fresh_section(f, originals, f"{DATA}/{name}.replication.json")]
        extra += replicated_elsewhere(summary, fresh)
        sections.append("\n".join([recipe_section(summary, replicates, f"experiments/{name}.png",
                                                   f"{DATA}/{name}.json"), *extra]))
    table = "\n\n".join([headline(summaries, fresh), spread_text(summaries), not_run_text(summaries)])
    page = "\n".join(["# What nanonorm's runs say about the papers' claims", "", INTRO, "", RECOMPUTE, "",
                      "## Headline", "", table, "", *sections, *not_run_section(summaries)])
    path = os.path.join(out, "experiments.md")
    files.write_atomic(path, page.encode())
    print(f"wrote {path}, {len(summaries)} figures in {os.path.join(out, 'experiments')} and their data in "
          f"{os.path.join(out, DATA)}")
    print()
    print(table)
