"""
The results page: `python plot.py --experiments=sweeps --out=docs` reads the summary.json of every recipe's sweep
under sweeps/ (python sweep.py --recipe=NAME) and writes docs/experiments.md, a headline table and a section per
claim (the paper's words and number, ours, p, verdict, deviations, command), and a figure per recipe in
docs/experiments/. It reads nothing else, so the page cannot drift from the data.
"""

import glob
import math
import os
import statistics

import matplotlib.ticker

from engine import files
from engine.flags import UsageError
from lab import schema
from lab.figures import FP16_MAX, legend_outside, log_lr_axis, make_folder, plt, save_png
from lab.tables import side_text

LINE_STYLES = ("-", "--", ":", "-.")


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


def save_small(fig, path):
    """A small PNG for the results page."""
    save_png(fig, path, dpi=80, bbox_inches="tight")


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


def figure_loss_vs_lr(summary, ax):
    """Final val loss against the LR (log-x): the median over seeds as a line, each seed a dot, a diverged run an x
    above the highest finite loss."""
    runs = summary["runs"]
    finite = [r["final_loss"] for r in runs if r["final_loss"] is not None and math.isfinite(r["final_loss"])]
    top = max(finite, default=1.0) * 1.05
    for variant, (color, style) in family_styles(summary["recipe"]["variants"]).items():
        mine = [r for r in runs if r["variant"] == variant and r["status"] != "unfinished"]
        lrs = sorted({float(r["lr"]) for r in mine})
        medians = [statistics.median(r["final_loss"] for r in mine if float(r["lr"]) == lr) for lr in lrs]
        ax.plot([lr for lr, m in zip(lrs, medians) if math.isfinite(m)], [m for m in medians if math.isfinite(m)],
                style, color=color, label=variant)
        ax.plot([float(r["lr"]) for r in mine if r["status"] == "done"],
                [r["final_loss"] for r in mine if r["status"] == "done"], "o", color=color, ms=3)
        diverged = [float(r["lr"]) for r in mine if r["status"] == "diverged"]
        ax.plot(diverged, [top] * len(diverged), "x", color=color, ms=8, mew=2)
    log_lr_axis(ax, "peak learning rate")
    grid = sorted({float(r["lr"]) for r in runs})
    ax.set_xticks(grid, [f"{lr:g}" for lr in grid])  # the sweep's own LRs
    ax.set(ylabel="final val loss (line: median; x: diverged)")


def figure_logits(summary, axes):
    """The largest attention logit and |mean log Z| over steps, log-y, one line per run (Wortsman et al. 2023
    §3.1 and §3.2 plot the same growth)."""
    for variant, (color, style) in family_styles(summary["recipe"]["variants"]).items():
        for i, run in enumerate(r for r in summary["runs"] if r["variant"] == variant and r["logit_curve"]):
            steps = [point[0] for point in run["logit_curve"]]
            for ax, column in zip(axes, (1, 2)):
                values = [point[column] for point in run["logit_curve"]]
                if None not in values:
                    ax.plot(steps, values, style, color=color, lw=1, label=None if i else variant)
    axes[0].set(yscale="log", xlabel="step", ylabel="max attention logit")
    axes[1].set(yscale="log", xlabel="step", ylabel="abs(mean log Z) of the output")
    for ax in axes:
        low, high = ax.get_ylim()
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        # within one decade there is no power of ten to label: label the minor ticks instead
        minor = matplotlib.ticker.FormatStrFormatter("%g") if high < 10 * low else matplotlib.ticker.NullFormatter()
        ax.yaxis.set_minor_formatter(minor)


def figure_metric(summary, ax):
    """The claims' metric for each variant: every seed a dot, the median a bar (in the variant's line style), the
    number of diverged runs (inf, the worst value) written above."""
    metrics = list(dict.fromkeys(claim["metric"] for claim in summary["recipe"]["claims"]))
    styles = family_styles(summary["recipe"]["variants"])
    for x, variant in enumerate(summary["recipe"]["variants"]):
        values = [run_value(run, metrics[0]) for run in summary["runs"] if run["variant"] == variant
                  and run["status"] != "unfinished" and run["lr"] == metrics[0].partition("@")[2]]
        color, style = styles[variant]
        finite = [v for v in values if v is not None and math.isfinite(v)]
        ax.plot([x] * len(finite), finite, "o", color=color, ms=4, alpha=0.7, label=variant)
        if values and None not in values:
            # the median over every seed, a diverged one (inf) included, as the comparison counts it
            median = statistics.median(values)
            ax.plot([x - 0.3, x + 0.3], [median if math.isfinite(median) else ax.get_ylim()[1]] * 2, style,
                    color=color, lw=2)
        diverged = len(values) - len(finite)
        if diverged:
            ax.annotate(f"{diverged} diverged", (x, 1.0), xycoords=("data", "axes fraction"), ha="center",
                        va="bottom", fontsize=7, color=color)
    ax.set_xticks(range(len(summary["recipe"]["variants"])), summary["recipe"]["variants"], rotation=30,
                  ha="right", fontsize=7)
    ax.set(ylabel=metric_label(metrics[0]))


def run_value(run, metric):
    """One run's value of a sweep metric NAME@LR, a diverged run inf where lower is better (as sweep.py counts it)."""
    name = metric.partition("@")[0]
    if run["status"] == "diverged" and name not in ("steps_survived", "peak_lr"):
        return math.inf
    return run[name]


def metric_label(metric):
    name, _, lr = metric.partition("@")
    return {"steps_survived": f"steps survived, LR ramp to {lr}", "peak_lr": f"LR reached, ramp to {lr}",
            "final_loss": f"final val loss at LR {lr}", "best_loss": "final val loss, each at its best LR",
            "spikes": f"loss spikes at LR {lr}", "attn_logit_max": f"max attention logit at the end, LR {lr}",
            "log_z": f"abs(mean log Z) at the end, LR {lr}"}[name]  # no "|": the label goes into Markdown tables


def recipe_figure(summary, path):
    """The figure of one recipe, as its recipe asks (recipes.Recipe.figure); the title names the recipe, no path."""
    kind = summary["recipe"]["figure"]
    fig, axes = plt.subplots(1, 2 if kind == "logits" else 1, figsize=(9 if kind == "logits" else 6, 3.6))
    {"ramp": figure_ramp, "loss_vs_lr": figure_loss_vs_lr, "logits": figure_logits, "metric": figure_metric}[kind](
        summary, axes)
    legend_outside(axes[-1] if kind == "logits" else axes)
    fig.tight_layout(rect=(0, 0, 1, 0.94))  # room for the title
    fig.suptitle(f"{summary['recipe']['name']}: {summary['recipe']['title']}", fontsize=8)
    save_small(fig, path)


def claim_rows(summary):
    """(claim, the sweep's comparison of it) for each of the recipe's claims; the comparison is None where its
    runs have not finished."""
    found = {(row["variant"], row["metric"]): row for row in summary["comparisons"]}
    return [(claim, found.get((claim["variant"], claim["metric"]))) for claim in summary["recipe"]["claims"]]


def ours_text(row):
    if row is None:
        return "not run yet"
    lrs = f" (LR {row['lr']} vs {row['reference_lr']})" if row["metric"] == "best_loss" else ""
    return f"{side_text(row['variant_values'])} vs {side_text(row['reference_values'])}{lrs}"


def headline(summaries):
    lines = ["| recipe | claim | paper | metric | ours: variant vs reference, median [min, max] | p | verdict |",
             "|---|---|---|---|---|---|---|"]
    for summary in summaries:
        recipe = summary["recipe"]
        for claim, row in claim_rows(summary):
            lines.append(f"| [{recipe['name']}](#{recipe['name']}) | {claim['variant']} vs "
                         f"{row['reference'] if row else recipe['reference']}, expected {claim['expect']} | "
                         f"{recipe['paper']} | {metric_label(claim['metric'])} | "
                         f"{ours_text(row)} | {p_text(row)} | {row['verdict'] if row else ''} |")
    return "\n".join(lines)


def p_text(row):
    return f"{row['p']:.3g} ({row['p_exact']})" if row else ""


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


def recipe_section(summary, figure):
    recipe, machine = summary["recipe"], summary["machine"]
    ended = [ended_text(row) for row in summary["variants"] if row.get("criterion")]
    lines = [f'<a id="{recipe["name"]}"></a>', f"## {recipe['title']}", "",
             f"Recipe `{recipe['name']}` ({recipe['scale']} scale). Paper: {recipe['paper']}.", "",
             f"> {recipe['quote']}", "",
             "| comparison | metric | the paper's number | ours: variant vs reference, median [min, max] | p | "
             "verdict |", "|---|---|---|---|---|---|"]
    for claim, row in claim_rows(summary):
        lines.append(f"| {claim['variant']} vs {row['reference'] if row else recipe['reference']}, expected "
                     f"{claim['expect']} | {metric_label(claim['metric'])} | {claim['paper_number']} | "
                     f"{ours_text(row)} | {p_text(row)} | {row['verdict'] if row else ''} |")
    lines.append("")
    if ended:
        lines += ["How the runs that diverged ended (the most frequent rule; loss gap and loss bound are nanonorm's "
                  "divergence rules, probes.DivergenceCheck, not the papers'): " + "; ".join(ended) + ".", ""]
    lines += [f"Deviations from the paper's protocol: {recipe['deviations']}.", "",
              f"Command: `{recipe['command']}` ({len(recipe['variants'])} variants x {len(recipe['lrs'])} LR(s) x "
              f"{recipe['seeds']} seeds), then `python plot.py --experiments=sweeps --out=docs`. It took "
              f"{summary['wall_s'] / 60:.1f} min on {machine['hardware']} (5-minute load average {machine['load']:.1f} "
              f"as it ended, its own runs included), torch {machine['torch']}, {machine['date']}. Every run's flags: "
              f"`{' '.join(without_paths(recipe['train_argv']))}`; LRs {', '.join(recipe['lrs'])}; seeds "
              f"0-{recipe['seeds'] - 1}.",
              "", f"![{recipe['name']}]({figure})", ""]
    return "\n".join(lines)


def experiments_page(root, out):
    """docs/experiments.md and a figure per recipe, from the recipes' summary.json files alone."""
    summaries = read_recipe_summaries(root)
    make_folder(os.path.join(out, "experiments"))
    sections = []
    for summary in summaries:
        name = summary["recipe"]["name"] + ("_gpu" if summary["recipe"]["scale"] == "gpu" else "")
        recipe_figure(summary, os.path.join(out, "experiments", f"{name}.png"))
        sections.append(recipe_section(summary, f"experiments/{name}.png"))
    page = "\n".join([
        "# What nanonorm's runs say about the papers' claims", "",
        "Generated by `python plot.py --experiments=sweeps --out=docs` from the summary.json of each recipe's sweep "
        "(`python sweep.py --recipe=NAME`); edit lab/recipes.py and re-run, never this page. Each claim compares a "
        "variant with a reference variant of the same model context over seeds: ours is the median [min, max] "
        "over n seeds a side, p the exact two-sided permutation (Mann-Whitney) p-value over all C(2n, n) "
        "relabelings of the seeds' values, a diverged run counting as the worst value. A verdict is \"agrees\" or "
        "\"disagrees\" with the paper's direction only at p < 0.05; otherwise it is \"inconclusive at this scale\". "
        "With n seeds a side the smallest p is 2 / C(2n, n): 5 seeds can reach 0.0079, 3 never reach 0.05. "
        "NormFormer's table numbers name their version: arXiv v1 (the earlier text) or final (the later, fuller "
        "one); see [papers.md](papers.md).", "",
        "## Headline", "", headline(summaries), "", *sections])
    path = os.path.join(out, "experiments.md")
    files.write_atomic(path, page.encode())
    print(f"wrote {path} and {len(summaries)} figures in {os.path.join(out, 'experiments')}")
