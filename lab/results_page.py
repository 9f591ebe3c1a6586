"""
The results page: `python plot.py --experiments=sweeps --out=docs` reads the summary.json of every recipe's sweep
under sweeps/ (python sweep.py --recipe=NAME) and writes docs/experiments.md, a headline table and a section per
recipe (the paper's words, the design, each claim's effect, CI, p, Holm's p, power, MDE and verdict, descriptive
extras, deviations, command), and a figure per recipe in docs/experiments/. It reads nothing else, so the page
cannot drift from the data.
"""

import glob
import math
import os
import statistics

import matplotlib.ticker

from engine import files
from engine.flags import UsageError
from lab import schema
from lab.claims import FIELDS, RATIO_STEPS
from lab.figures import FP16_MAX, legend_outside, log_lr_axis, make_folder, plt, save_png
from lab.tables import (claims_table, comparison_text, interval_text, metric_label, p_value_text, power_text,
                        value_text)

LINE_STYLES = ("-", "--", ":", "-.")
FIGURE_SIZE = (8, 4.5)  # inches, at FIGURE_DPI: readable at the page's width
FIGURE_DPI = 120


def read_recipe_summaries(root):
    """The summary.json of every recipe's sweep under root (sweep.py --recipe writes its recipe into it), in the
    order recipes.py lists the recipes, CPU before GPU scale."""
    found = {}
    for path in sorted(glob.glob(os.path.join(glob.escape(root), "**", "summary.json"), recursive=True)):
        summary = schema.read_summary(path)
        if not summary.get("recipe"):
            continue
        check_recipe_summary(path, summary)
        key = (summary["recipe"]["order"], summary["recipe"]["scale"])
        if key in found:
            raise UsageError(f"{found[key][0]} and {path} are both sweeps of recipe {summary['recipe']['name']} "
                             f"({summary['recipe']['scale']} scale); the page shows one: move the other out of {root}")
        found[key] = (path, summary)
    if not found:
        raise UsageError(f"{root} holds no recipe's summary.json; run python sweep.py --recipe=NAME first")
    return [summary for _, (_, summary) in sorted(found.items())]


def check_recipe_summary(path, summary):
    """A UsageError naming path where the summary lacks what the results page reads."""
    schema.check_summary(path, summary, schema.RECIPE_SUMMARY)
    schema.check_recipe_name(path, summary)
    schema.check_values(path, summary)
    for i, row in enumerate(summary["variants"]):
        for key, needs in schema.ENDED_ROW.items():
            found = schema.mismatch(row, needs, f"variants[{i}]") if row.get(key) else None
            if found:
                raise UsageError(f"{path}: {found} beside {key}; {schema.SUMMARY_ALLOWED}")


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
    """A run's final val loss as the claims count it: min(L, L_0), a diverged run at its loss at initialization."""
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
    """An x at each diverged run's counted loss (L_0)."""
    diverged = [(x_of(r), capped(r)) for r in runs if r["status"] == "diverged" and capped(r) is not None]
    if diverged:
        ax.plot(*zip(*diverged), "x", color=color, ms=8, mew=2)


def figure_loss_vs_lr(summary, ax):
    """Final val loss against the LR (log-x), per variant the median over seeds and a min-max band; a diverged run
    counts as its loss at initialization (min(L, L_0), Wortsman et al. 2023 §3), marked x."""
    for variant, (color, style) in family_styles(summary["recipe"]["variants"]).items():
        mine = [r for r in summary["runs"] if r["variant"] == variant and r["status"] != "unfinished"]
        lrs = sorted({float(r["lr"]) for r in mine})
        band(ax, lrs, [[capped(r) for r in mine if float(r["lr"]) == lr and capped(r) is not None] for lr in lrs],
             color, style, variant)
        mark_diverged(ax, mine, lambda r: float(r["lr"]), color)
    log_lr_axis(ax, "peak learning rate")
    grid = sorted({float(r["lr"]) for r in summary["runs"]})
    ax.set_xticks(grid, [f"{lr:g}" for lr in grid])  # the sweep's own LRs
    ax.set(ylabel="final val loss, min(L, L_0)\n(line: median; band: min-max; x: diverged)")


def depth_of(variant):
    """The n_layer override of a variant ("dn_postln+n_layer=18" -> 18), None without one."""
    return next((int(part.partition("=")[2]) for part in variant.split("+")[1:] if part.startswith("n_layer=")), None)


def figure_depth(summary, ax):
    """Final val loss against depth at the claims' LR, per variant family the median over seeds and a min-max
    band, a diverged run at L_0 (x); the dotted line is the val split's unigram entropy, the plateau of a model
    that has learned only the tokens' frequencies."""
    lr = summary["recipe"]["claims"][0]["metric"].partition("@")[2]
    runs = [r for r in summary["runs"] if r["lr"] == lr and r["status"] != "unfinished"]
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
    ax.set(xlabel="layers", ylabel=f"final val loss at LR {lr}, min(L, L_0)\n(line: median; band: min-max)")


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
    for x, (variant, (color, style)) in enumerate(styles.items()):
        mine = [r for r in summary["runs"] if r["variant"] == variant and r["lr"] == lr and r["status"] != "unfinished"]
        values = [r[name] for r in mine if r.get(name) is not None]
        axes[0].plot([x] * len(values), values, "o", color=color, ms=4, alpha=0.7)
        if values:
            axes[0].plot([x - 0.3, x + 0.3], [statistics.median(values)] * 2, style, color=color, lw=2)
        steps = sorted({step for r in mine for step, _ in r.get(curve, [])})
        at = [[ratio for r in mine for s, ratio in r.get(curve, []) if s == step] for step in steps]
        if steps:
            axes[1].plot(steps, [statistics.median(v) for v in at], style, color=color, label=variant)
    axes[0].set_xticks(range(len(styles)), list(styles), rotation=20, ha="right")
    axes[0].set(ylabel=metric_label(metric))
    axes[1].axvspan(*RATIO_STEPS, color="gray", alpha=0.1, lw=0)
    axes[1].set(xlabel="step (shaded: the steps averaged)", ylabel="the ratio, median over seeds")
    for ax in axes:
        if ax.has_data() and ax.lines:  # a log axis needs a ratio to show: runs that diverged early have none
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
            ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))


def figure_metric(summary, ax):
    """The first claim's metric for each variant, as the claims count it: every seed a dot, the median a bar (in
    the variant's line style), the number of diverged runs written above."""
    metric = summary["recipe"]["claims"][0]["metric"]
    name, _, lr = metric.partition("@")
    styles = family_styles(summary["recipe"]["variants"])
    for x, (variant, (color, style)) in enumerate(styles.items()):
        mine = [r for r in summary["runs"] if r["variant"] == variant and r["status"] != "unfinished" and r["lr"] == lr]
        values = [r[FIELDS[name]] for r in mine if r.get(FIELDS[name]) is not None]
        ax.plot([x] * len(values), values, "o", color=color, ms=4, alpha=0.7, label=variant)
        if values:
            ax.plot([x - 0.3, x + 0.3], [statistics.median(values)] * 2, style, color=color, lw=2)
        diverged = sum(r["status"] == "diverged" for r in mine)
        if diverged:
            ax.annotate(f"{diverged} diverged", (x, 1.0), xycoords=("data", "axes fraction"), ha="center",
                        va="bottom", fontsize=8, color=color)
    ax.set_xticks(range(len(styles)), list(styles), rotation=20, ha="right")
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
    (NormFormer §4) or, where none did, the op whose forward max |x| grew the most before the end (train.py's
    diverged event, "grew_most"; older summaries have no such field)."""
    text = f"{row['variant']}: {row['criterion']} in {row['criterion_count']} of {row['runs']}"
    if row.get("failed_op"):
        return f"{text}, first op over the float16 range {row['failed_op']} in {row['failed_op_count']}"
    if row.get("grew_most"):
        return (f"{text}, none over {FP16_MAX:.0f}; the op that grew the most: {row['grew_most']} in "
                f"{row['grew_most_count']}")
    return text


def headline_rows(summary):
    recipe = summary["recipe"]
    return [f"| [{recipe['name']}](#{anchor(recipe)}) | {comparison_text(c)}: {metric_label(c['metric'])} | "
            f"{interval_text(c['effect'], c['effect_ci'])} | {p_value_text(c['p_holm'])} | {power_text(c['power'])} "
            f"| {c['verdict']} |" for c in summary["claims"]]


def headline(summaries):
    """The headline table: one row per claim of every recipe (the README's table is pasted from it)."""
    lines = ["| recipe | claim | effect [95% CI] (+: the paper's direction) | p (Holm) | power for the paper's effect "
             "| verdict |", "|---|---|---|---|---|---|"]
    for summary in summaries:
        lines += headline_rows(summary)
    return "\n".join(lines)


def diverged_text(summary):
    """How many runs of each arm diverged among the pairs of each claim (their loss counts as L_0)."""
    found = {arm: count for c in summary["claims"] for arm, count in c["diverged"].items() if count}
    if not found:
        return []
    return ["Diverged runs among the pairs (a diverged run's final loss counts as its loss at initialization): " +
            "; ".join(f"{arm}: {count}" for arm, count in found.items()) + ".", ""]


def lr_curve_table(summary):
    """The final val loss of each variant at each LR (median over seeds, a diverged run at L_0), the runs that
    diverged, and Wortsman et al.'s LR sensitivity of the medians."""
    lrs = summary["recipe"]["lrs"]
    lines = ["| variant | " + " | ".join(f"L({lr})" for lr in lrs) + " | diverged runs | LR sensitivity |",
             "|" + "---|" * (len(lrs) + 3)]
    for variant in summary["recipe"]["variants"]:
        mine = [r for r in summary["runs"] if r["variant"] == variant and r["status"] != "unfinished"]
        cells = [value_text(median_of([capped(r) for r in mine if r["lr"] == lr])) for lr in lrs]
        sensitivity = [c for c in summary["claims"] if c["metric"] == "lr_sensitivity"]
        medians = [c["arm_medians"].get(variant) for c in sensitivity]
        lines.append(f"| {variant} | " + " | ".join(cells) + f" | {sum(r['status'] == 'diverged' for r in mine)} of "
                     f"{len(mine)} | {value_text(medians[0] if medians else None)} |")
    return ["Final val loss per LR (median over seeds, min(L, L_0)); the LR sensitivity is the median over seeds of "
            "each seed's own:", "", *lines, ""]


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
    """The design paragraph: what ran, on which windows, and how the claims are tested."""
    d = recipe["design"]
    windows = d["eval_windows"]
    seeds = d["seeds"]
    return (f"Design, fixed before the runs: {len(d['variants'])} variants x {len(d['lrs'])} LR(s) "
            f"({', '.join(d['lrs'])}) x {len(seeds)} seeds ({seeds[0]}-{seeds[-1]}), {d['steps']} steps a run; "
            f"every run scored on the same {windows['windows']} validation windows ({windows['eval_iters']} x "
            f"{windows['batch_size']} windows of {windows['block_size']} tokens, {windows['tokens']:,} tokens). "
            f"Test: {d['test']}; family: {d['family']}; power at alpha = {d['power_alpha']:.3g} (Holm's first "
            f"step), from the recipe's own spread of the paired differences.")


def anchor(recipe):
    return recipe["name"] + ("_gpu" if recipe["scale"] == "gpu" else "")


def recipe_section(summary, figure):
    recipe, machine = summary["recipe"], summary["machine"]
    ended = [ended_text(row) for row in summary["variants"] if row.get("criterion")]
    lines = [f'<a id="{anchor(recipe)}"></a>', f"## {recipe['title']}", "",
             f"Recipe `{recipe['name']}` ({recipe['scale']} scale). Paper: {recipe['paper']}.", "",
             f"> {recipe['quote']}", "", design_text(recipe), "", claims_table(summary["claims"]), "",
             *diverged_text(summary)]
    if summary["mode"] == "lr":
        lines += lr_curve_table(summary)
    lines += leakage_table(summary) + plateau_table(summary)
    if ended:
        lines += ["How the runs that diverged ended (the most frequent rule; loss gap and loss bound are nanonorm's "
                  "divergence rules, probes.DivergenceCheck, not the papers'): " + "; ".join(ended) + ".", ""]
    lines += [f"Deviations from the paper's protocol: {recipe['deviations']}.", "",
              f"Command: `{recipe['command']}`, then `python plot.py --experiments=sweeps --out=docs`. It took "
              f"{summary['wall_s'] / 60:.1f} min on {machine['hardware']} (5-minute load average {machine['load']:.1f} "
              f"as it ended, its own runs included), torch {machine['torch']}, {machine['date']}. Every run's flags: "
              f"`{' '.join(without_paths(recipe['train_argv']))}`.",
              "", f"![{recipe['name']}]({figure})", ""]
    return "\n".join(lines)


INTRO = """\
Generated by `python plot.py --experiments=sweeps --out=docs` from the summary.json of each recipe's sweep \
(`python sweep.py --recipe=NAME`); edit lab/recipes.py and re-run, never this page. NormFormer's table numbers name \
their version: arXiv v1 (the earlier text) or final (the later, fuller one); see [papers.md](papers.md).

How to read the numbers. Each claim is a comparison fixed in lab/recipes.py before the runs: a variant against a \
reference of the same model context, on one metric, in the direction the paper states, with the effect the design \
must be able to detect and where that effect comes from. Every arm runs the same seeds (a seed fixes the \
initialization draws and the order of the training batches) and every run is scored on the same validation \
windows, so the runs of two arms with the same seed form a pair. Per pair: d = variant - reference (for an \
interaction, the difference of two such differences), signed so that a positive d is the paper's direction (a \
lower loss, a lower gradient ratio, more steps survived). A run that diverged counts with its loss at \
initialization, min(L, L_0) (Wortsman et al. 2023 §3), so that every d is a number; the tables count such runs.

- **p**: the exact two-sided sign-flip permutation test over seeds. If the variant made no difference, each d \
would be as likely negative as positive; p is the share of all 2^n ways to flip the signs of the n differences \
whose sum is at least as far from 0 as the observed one. With n pairs the smallest possible p is 2 / 2^n \
(8 pairs: 0.0078).
- **p (Holm)**: a recipe's claims are one family. Holm's step-down adjustment (the smallest p times m, the next \
times m - 1, ...) keeps the chance of any false verdict within the recipe at 5%.
- **effect [95% CI]**: the Hodges-Lehmann estimate of d (the median of the averages of every two differences, each \
with itself included) with its exact 95% confidence interval (from the distribution of Wilcoxon's signed-rank \
statistic), in the metric's units; positive is the paper's direction. The recipe's table also gives it as \
variant - reference, in the metric's own sign.
- **power for the paper's effect**: the probability that this design detects a true mean difference of the size \
the recipe names (the paper's number where it gives one, else nanonorm's stated choice; a relative effect is a \
share of the reference's median), at alpha = 0.05 / m (Holm's first step, the conservative case), with n pairs \
whose differences spread as this recipe's own did (their sd), by simulation.
- **MDE**: the minimum detectable effect, the smallest true mean difference the design detects with 80% power at \
that alpha and spread.
- **verdict**: "agrees" where p (Holm) < 0.05 and the effect is in the paper's direction; "disagrees" where \
p (Holm) < 0.05 and it is against it; otherwise "not detected", with the MDE: an effect smaller than the MDE \
could be there unseen, so "not detected" is not "no effect".

Descriptive numbers (LR curves, leakage, plateau counts) are shown, not tested."""


def experiments_page(root, out):
    """docs/experiments.md and a figure per recipe, from the recipes' summary.json files alone; the headline table
    also goes to stdout, for the README."""
    summaries = read_recipe_summaries(root)
    make_folder(os.path.join(out, "experiments"))
    sections = []
    for summary in summaries:
        name = anchor(summary["recipe"])
        recipe_figure(summary, os.path.join(out, "experiments", f"{name}.png"))
        sections.append(recipe_section(summary, f"experiments/{name}.png"))
    table = headline(summaries)
    page = "\n".join(["# What nanonorm's runs say about the papers' claims", "", INTRO, "", "## Headline", "",
                      table, "", *sections])
    path = os.path.join(out, "experiments.md")
    files.write_atomic(path, page.encode())
    print(f"wrote {path} and {len(summaries)} figures in {os.path.join(out, 'experiments')}")
    print()
    print(table)
