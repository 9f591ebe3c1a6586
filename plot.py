"""
Pictures of nanonorm runs, read from their log.jsonl (and a sweep's summary.json); the only file that
imports matplotlib. Any number of run folders (train.py --out_dir) and sweep folders (sweep.py --out_dir):
    python plot.py out/baseline out/normformer --out=plots
    python plot.py sweeps/lr --out=plots --op=fc2
writes into --out:
    loss.png                  train and val loss of all runs overlaid, spikes marked; LR and grad norm below
    loss_vs_lr_<sweep>.png    final val loss vs LR per variant, log-x, diverged runs marked (--mode=lr sweeps)
and for each run whose log has the events (train.py --telemetry_interval, --fp16_headroom_interval):
    grad_norms_<run>.png      mean |g| and L2 norm of one op's weight gradient per layer (--op, default fc2)
    gains_<run>.png           gamma/beta and other gains per layer and op at the last telemetry step
    attn_logits_<run>.png     the max attention logit per layer over steps
    powernorm_<run>.png       PowerNorm/PN-V running psi^2 and nu per layer over steps
    headroom_<run>.png        max |x| per op and layer at the last headroom step against float16's 65504
A plot whose events are absent is skipped with a note.

The results page: `python plot.py --experiments=sweeps --out=docs` reads the summary.json of every recipe's
sweep under sweeps/ (python sweep.py --recipe=NAME) and writes docs/experiments.md, a headline table and a
section per claim (the paper's words and number, ours, p, verdict, deviations, command), and a figure per recipe
in docs/experiments/. It reads nothing else, so the page cannot drift from the data.

A log.jsonl or summary.json that is not what train.py or sweep.py write (not JSON, lacking a key a plot reads, a
folder in the file's place), or an --out that cannot be a folder, is bad input: one line naming the file (and line),
exit code 2, before anything is drawn. A log's last line cut short by a killed run is left out with a note. Every
file is written whole or not at all; a write that fails (disk full, read-only) is one line naming it, exit code 1.
"""

import dataclasses
import glob
import io
import json
import math
import os
import statistics
import sys
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from engine import files  # noqa: E402
from engine import flags  # noqa: E402
from engine.flags import UsageError, help_of  # noqa: E402

FP16_MAX = 65504.0
LINE_STYLES = ("-", "--", ":", "-.")
NUMBER = (int, float)
MAYBE_NUMBER = (int, float, type(None))
JSON_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", type(None): "null",
              list: "a list", dict: "an object"}

# What plot.py reads of the files train.py and sweep.py write, so that a foreign file is refused before anything is
# drawn: a dict is a JSON object with at least these keys, [x] a list whose items are each x, a type (or a tuple
# of types) the value's type, a set the values allowed, None any value.
EVENTS = {
    "train": {"step": int, "loss": NUMBER, "lr": NUMBER, "grad_norm": MAYBE_NUMBER},  # None: an fp16 overflow step
    "eval": {"step": int, "val_loss": NUMBER},
    "spike": {"step": int, "loss": NUMBER},
    "telemetry": {"step": int,
                  "weights": [{"layer": None, "op": None, "name": str, "grad_mean_abs": NUMBER, "grad_l2": NUMBER}],
                  "gains": [{"layer": None, "op": None, "name": str, "mean": NUMBER, "std": NUMBER, "min": NUMBER,
                             "max": NUMBER}],
                  "attn_logit_max": [{"layer": int, "value": NUMBER}],
                  "norm_stats": [{"layer": None, "op": None, **{f"{stat}_{k}": NUMBER for stat in ("psi2", "nu")
                                                                for k in ("mean", "min", "max")}}]},
    "headroom": {"step": int, "ops": [{"layer": None, "op": None, "pass": None, "max_abs": NUMBER}]},
}
SWEEP = {"mode": str}
LR_SWEEP = {"variants": [{"variant": str, "init_loss": NUMBER}],
            "runs": [{"variant": str, "lr": str, "status": str, "final_loss": MAYBE_NUMBER}]}
SIDE = {"median": None, "min": None, "max": None, "n": None}
RECIPE_SUMMARY = {
    "recipe": {"name": str, "title": str, "order": int, "scale": str, "paper": None, "quote": None, "reference": None,
               "figure": {"ramp", "loss_vs_lr", "logits", "metric"}, "variants": [str], "lrs": [str], "seeds": int,
               "claims": [{"variant": str, "metric": str, "expect": None, "paper_number": None}],
               "deviations": None, "command": None, "train_argv": [str]},
    "machine": {"hardware": None, "load": NUMBER, "torch": None, "date": None},
    "wall_s": NUMBER,
    "comparisons": [{"variant": str, "metric": str, "reference": None, "lr": None, "reference_lr": None,
                     "variant_values": SIDE, "reference_values": SIDE, "p": NUMBER, "p_exact": None, "verdict": None}],
    "variants": [{"variant": str}],
    "runs": [{"variant": str, "lr": str, "status": str, "final_loss": MAYBE_NUMBER, "peak_lr": MAYBE_NUMBER,
              "steps_survived": MAYBE_NUMBER, "spikes": int, "attn_logit_max": MAYBE_NUMBER, "log_z": MAYBE_NUMBER,
              "curve": [[NUMBER]], "logit_curve": [[MAYBE_NUMBER]]}],
}
# a variant row that names how its runs ended (recipe_section) also needs the counts: named key -> what it needs
ENDED_ROW = {"criterion": {"criterion_count": int, "runs": int}, "failed_op": {"failed_op_count": int},
             "grew_most": {"grew_most_count": int}}
SUMMARY_ALLOWED = "plot.py reads the summary.json that sweep.py writes (the sweep's command again rewrites it)"


def mismatch(value, shape, where):
    """Where value is not of the shape (as EVENTS describes shapes), such as "runs[2].lr is missing"; None where it
    is."""
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"{where or 'it'} is {JSON_NAMES[type(value)]}, not an object"
        for key, inner in shape.items():
            name = f"{where}.{key}" if where else key
            found = f"{name} is missing" if key not in value else mismatch(value[key], inner, name)
            if found:
                return found
    elif isinstance(shape, list):
        if not isinstance(value, list):
            return f"{where} is {JSON_NAMES[type(value)]}, not a list"
        for i, item in enumerate(value):
            found = mismatch(item, shape[0], f"{where}[{i}]")
            if found:
                return found
    elif isinstance(shape, set):
        if value not in shape:
            return f"{where} is {json.dumps(value)[:40]}, not one of {', '.join(sorted(shape))}"
    elif shape is not None and not isinstance(value, shape):
        kinds = shape if isinstance(shape, tuple) else (shape,)
        expected = " or ".join(JSON_NAMES[kind] for kind in kinds if not (kind is int and float in kinds))
        return f"{where} is {JSON_NAMES[type(value)]}, not {expected}"
    return None


def read_events(path):
    """The events of a log.jsonl (files.read_log), each with the keys the plots read; a last line cut short by a
    killed run is left out with a note on stderr. Anything else foreign is a UsageError naming the file and line."""
    events, note = files.read_log(path)
    if note:
        print(f"plot.py: {note}", file=sys.stderr)
    for line, event in enumerate(events, 1):  # read_log gives one event a line, or refuses the log
        found = mismatch(event, EVENTS.get(event["event"]), "")
        if found:
            raise UsageError(f"{path}:{line}: {event['event']} event: {found}; it is not a log nanonorm wrote")
    return events


def read_summary(path):
    """A summary.json as a dict; a UsageError naming the file where it is not a file, not JSON or not an object."""
    problem = files.not_a_file(path)
    if problem:
        raise UsageError(f"{path} is {problem}; {SUMMARY_ALLOWED}")
    try:
        with open(path, "rb") as f:
            summary = json.loads(f.read().decode("utf-8"))
    except OSError as e:
        raise UsageError(f"{path}: cannot read it ({e.strerror}); {SUMMARY_ALLOWED}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text; {SUMMARY_ALLOWED}") from None
    except ValueError:
        raise UsageError(f"{path}: not JSON; {SUMMARY_ALLOWED}") from None
    if not isinstance(summary, dict):
        raise UsageError(f"{path}: {JSON_NAMES[type(summary)]}, not an object; {SUMMARY_ALLOWED}")
    return summary


def check_summary(path, summary, shape):
    found = mismatch(summary, shape, "")
    if found:
        raise UsageError(f"{path}: {found}; {SUMMARY_ALLOWED}")


def sweep_summary(path):
    """A sweep folder's summary.json with what plot_loss_vs_lr reads (all of it for an --mode=lr sweep)."""
    summary = read_summary(path)
    check_summary(path, summary, SWEEP)
    if summary["mode"] == "lr":
        check_summary(path, summary, LR_SWEEP)
    return summary


def find_runs(paths):
    """(label, events) of every run (a folder holding log.jsonl, or each run folder under a sweep folder) and
    (folder, summary) of every sweep folder; all read and checked before anything is drawn."""
    runs, sweeps = [], []
    # sweep runs end in .../<variant>/<lr>/<seed>: several given run folders differ only higher up
    common = os.path.dirname(os.path.commonpath([os.path.abspath(p) for p in paths]))
    if len(paths) > 1:
        common = os.path.commonpath([os.path.abspath(p) for p in paths])
    for path in paths:
        if not os.path.isdir(path):
            raise UsageError(f"{path} is not a folder; pass run folders (train.py --out_dir) or sweep folders")
        logs = sorted(glob.glob(os.path.join(glob.escape(path), "**", "log.jsonl"), recursive=True))
        if not logs:
            raise UsageError(f"{path} holds no log.jsonl; pass run folders (train.py --out_dir) or sweep folders")
        for log in logs:
            label = os.path.relpath(os.path.dirname(log), path)
            if label == ".":  # a run folder given itself: its path below what all the given folders share
                label = os.path.relpath(os.path.abspath(path), common)
            runs.append((label, read_events(log)))
        summary = os.path.join(path, "summary.json")
        if os.path.lexists(summary):  # lexists: a broken symlink in its place is refused, not passed over
            sweeps.append((path, sweep_summary(summary)))
    return runs, sweeps


def of_kind(events, kind):
    return [e for e in events if e["event"] == kind]


def slug(label):
    return "".join(c if c.isalnum() or c in "-.=" else "_" for c in label)


def save_png(fig, path, **options):
    """fig as a PNG at path, whole or not at all (files.write_atomic); a failed write is a files.WriteError."""
    picture = io.BytesIO()
    fig.savefig(picture, format="png", **options)
    plt.close(fig)
    files.write_atomic(path, picture.getvalue())


def save(fig, out, name):
    path = os.path.join(out, name)
    save_png(fig, path, dpi=90, bbox_inches="tight")  # "tight" keeps a legend outside the axes in the picture
    print(f"wrote {path}")


def plot_loss(runs, out):
    """Loss curves overlaid with spikes marked (the spike monitor's events); LR and grad norm underneath."""
    if not any(of_kind(events, "train") or of_kind(events, "eval") for _, events in runs):
        print("loss.png skipped: no train or eval events")
        return
    fig, (ax_loss, ax_lr, ax_grad) = plt.subplots(3, 1, figsize=(9, 8), sharex=True,
                                                  gridspec_kw={"height_ratios": [3, 1, 1]})
    for i, (label, events) in enumerate(runs):
        color = f"C{i % 10}"
        train, evals, spikes = of_kind(events, "train"), of_kind(events, "eval"), of_kind(events, "spike")
        ax_loss.plot([e["step"] for e in train], [e["loss"] for e in train], color=color, lw=1, label=label)
        ax_loss.plot([e["step"] for e in evals], [e["val_loss"] for e in evals], "o--", color=color, ms=3, lw=1)
        ax_loss.plot([e["step"] for e in spikes], [e["loss"] for e in spikes], "x", color="red", ms=8, mew=2)
        ax_lr.plot([e["step"] for e in train], [e["lr"] for e in train], color=color, lw=1)
        ax_grad.plot([e["step"] for e in train], [e["grad_norm"] for e in train], color=color, lw=1)
    ax_loss.set(ylabel="loss (line: train, dots: val, red x: spike)", title="loss")
    ax_lr.set(ylabel="LR")
    ax_grad.set(ylabel="grad norm", xlabel="step", yscale="log")
    if len(runs) <= 12:
        ax_loss.legend(fontsize=7)
    save(fig, out, "loss.png")


def plot_loss_vs_lr(sweep, summary, out):
    """Final val loss vs LR per variant, log-x (Wortsman et al. 2023 §3, Fig. 1); diverged runs drawn as x at
    L_0, the loss at initialization, which is what they count as in the LR sensitivity."""
    name = f"loss_vs_lr_{slug(os.path.basename(os.path.abspath(sweep)))}.png"
    if summary["mode"] != "lr":
        print(f"{name} skipped: {sweep} is a --mode={summary['mode']} sweep")
        return
    fig, ax = plt.subplots(figsize=(7, 5))
    for i, row in enumerate(summary["variants"]):
        color = plt.get_cmap("tab20")(i % 20)  # a sweep of the papers' variants has more than 10
        # the row's L(lr) columns: median over seeds, inf where it diverged
        curve = sorted((float(k[2:-1]), v) for k, v in row.items() if k.startswith("L(") and math.isfinite(v))
        runs = [r for r in summary["runs"] if r["variant"] == row["variant"]]
        done = [(float(r["lr"]), r["final_loss"]) for r in runs if r["status"] == "done"]
        diverged = [(float(r["lr"]), row["init_loss"]) for r in runs if r["status"] == "diverged"]
        line = "--" if i % 2 else "-"  # every other curve dashed: neighbours among the 20 colors look alike
        for points, style in ((curve, line), (done, "o"), (diverged, "x")):
            ax.plot([p[0] for p in points], [p[1] for p in points], style, color=color, ms=8 if style == "x" else 4,
                    mew=2, label=row["variant"] if style == line else None)
    ax.set(ylabel="final val loss (x: diverged, at L_0)",
           title=f"final loss vs LR: {os.path.basename(os.path.abspath(sweep))}")  # no machine path in a title
    log_lr_axis(ax, "learning rate")
    legend_outside(ax)
    save(fig, out, name)


def plot_grad_norms(label, telemetry, op, out):
    """Per-layer gradient norms of one op's weights over steps (NormFormer Fig. 3: mean |g| of fc2 per layer;
    Spike No More Fig. 2-3)."""
    lines = {}
    for event in telemetry:
        for row in event["weights"]:
            if row["op"] == op:
                lines.setdefault((row["layer"], row["name"]), []).append((event["step"], row))
    if not lines:
        print(f"grad_norms_{slug(label)}.png skipped: no telemetry weights rows for op {op}")
        return
    fig, (ax_l1, ax_l2) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for (layer, name), points in sorted(lines.items(), key=lambda item: str(item[0])):
        steps = [step for step, _ in points]
        tag = f"layer {layer}" + (" bias" if name.endswith("bias") else "")
        ax_l1.plot(steps, [row["grad_mean_abs"] for _, row in points], label=tag)
        ax_l2.plot(steps, [row["grad_l2"] for _, row in points], label=tag)
    ax_l1.set(ylabel="mean |g| (L1 / numel)", yscale="log", title=f"{op} weight gradient per layer: {label}")
    ax_l2.set(ylabel="L2 norm", yscale="log", xlabel="step")
    ax_l1.legend(fontsize=7)
    save(fig, out, f"grad_norms_{slug(label)}.png")


def plot_gains(label, telemetry, out):
    """Gains per layer and op at the last telemetry step: mean +- std as bars, min and max as ticks
    (NormFormer Fig. 4: the distribution of each norm's gamma per layer)."""
    rows = telemetry[-1]["gains"] if telemetry else []
    if not rows:
        print(f"gains_{slug(label)}.png skipped: no telemetry gains rows")
        return
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(rows)), 5))
    x = range(len(rows))
    ax.errorbar(x, [r["mean"] for r in rows], yerr=[r["std"] for r in rows], fmt="o", capsize=3, label="mean +- std")
    ax.plot(x, [r["min"] for r in rows], "v", color="gray", ms=4, label="min")
    ax.plot(x, [r["max"] for r in rows], "^", color="gray", ms=4, label="max")
    ax.set_xticks(list(x), [f"{r['op']} {'' if r['layer'] is None else r['layer']} {r['name'].rsplit('.', 1)[-1]}"
                            for r in rows], rotation=90, fontsize=7)
    ax.set(ylabel="value", title=f"gains at step {telemetry[-1]['step']}: {label}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, out, f"gains_{slug(label)}.png")


def plot_attn_logits(label, telemetry, out):
    """The max attention logit per layer over steps (attention-logit growth: Dehghani et al. 2023 §3.1;
    Wortsman et al. 2023 §3.1)."""
    lines = {}
    for event in telemetry:
        for row in event["attn_logit_max"]:
            lines.setdefault(row["layer"], []).append((event["step"], row["value"]))
    if not lines:
        print(f"attn_logits_{slug(label)}.png skipped: no telemetry attn_logit_max rows")
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    for layer, points in sorted(lines.items()):
        ax.plot(*zip(*points), label=f"layer {layer}")
    ax.set(xlabel="step", ylabel="max attention logit", title=f"attention logits: {label}")
    ax.legend(fontsize=7)
    save(fig, out, f"attn_logits_{slug(label)}.png")


def plot_powernorm(label, telemetry, out):
    """PowerNorm's running quadratic mean psi^2 (eq. 10) and backward statistic nu (eq. 11) per layer and norm
    over steps: mean as a line, min..max shaded; nu drifting away from 0 comes before a NaN."""
    lines = {}
    for event in telemetry:
        for row in event["norm_stats"]:
            lines.setdefault((row["layer"], row["op"]), []).append((event["step"], row))
    if not lines:
        print(f"powernorm_{slug(label)}.png skipped: no telemetry norm_stats rows")
        return
    fig, axes = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for i, (key, points) in enumerate(sorted(lines.items(), key=lambda item: str(item[0]))):
        steps = [step for step, _ in points]
        for ax, stat in zip(axes, ("psi2", "nu")):
            ax.plot(steps, [r[f"{stat}_mean"] for _, r in points], color=f"C{i % 10}", label=f"layer {key[0]} {key[1]}")
            ax.fill_between(steps, [r[f"{stat}_min"] for _, r in points], [r[f"{stat}_max"] for _, r in points],
                            color=f"C{i % 10}", alpha=0.2)
    axes[0].set(ylabel="psi^2 (running)", title=f"PowerNorm statistics: {label}")
    axes[1].set(ylabel="nu (running)", xlabel="step")
    axes[0].legend(fontsize=7)
    save(fig, out, f"powernorm_{slug(label)}.png")


def plot_headroom(label, headroom, out):
    """Max |x| per op and layer at the last headroom step against float16's largest value 65504 (NormFormer §4,
    Table 3: the first op past it is the failed one). Non-finite values are drawn as red x at the top."""
    rows = headroom[-1]["ops"] if headroom else []
    if not rows:
        print(f"headroom_{slug(label)}.png skipped: no headroom events")
        return
    top = 10 * max([FP16_MAX] + [r["max_abs"] for r in rows if math.isfinite(r["max_abs"])])
    fig, ax = plt.subplots(figsize=(max(6, 0.3 * len(rows)), 5))
    for pass_, style in (("forward", "o"), ("backward", "s")):
        points = [(i, r["max_abs"]) for i, r in enumerate(rows) if r["pass"] == pass_ and math.isfinite(r["max_abs"])]
        ax.plot(*zip(*points) if points else ([], []), style, ms=4, label=pass_)
    broken = [i for i, r in enumerate(rows) if not math.isfinite(r["max_abs"])]
    ax.plot(broken, [top] * len(broken), "x", color="red", ms=9, mew=2, label="inf / nan")
    ax.axhline(FP16_MAX, color="red", ls="--", lw=1, label="float16 max 65504")
    ax.set_xticks(range(len(rows)), [f"{r['op']} {'' if r['layer'] is None else r['layer']}" for r in rows],
                  rotation=90, fontsize=6)
    ax.set(yscale="log", ylabel="max |x|", title=f"fp16 headroom at step {headroom[-1]['step']}: {label}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, out, f"headroom_{slug(label)}.png")


def read_recipe_summaries(root):
    """The summary.json of every recipe's sweep under root (sweep.py --recipe writes its recipe into it), in the
    order recipes.py lists the recipes, CPU before GPU scale."""
    found = {}
    for path in sorted(glob.glob(os.path.join(glob.escape(root), "**", "summary.json"), recursive=True)):
        summary = read_summary(path)
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
    check_summary(path, summary, RECIPE_SUMMARY)
    for i, row in enumerate(summary["variants"]):
        for key, needs in ENDED_ROW.items():
            found = mismatch(row, needs, f"variants[{i}]") if row.get(key) else None
            if found:
                raise UsageError(f"{path}: {found} beside {key}; {SUMMARY_ALLOWED}")


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


def legend_outside(ax):
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def log_lr_axis(ax, label):
    """A log-x LR axis labeled at 1, 2 and 5 times the powers of ten, as plain numbers."""
    ax.set(xscale="log", xlabel=label)
    ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


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


def value_text(value):
    if value is None:
        return "n/a"
    if isinstance(value, float) and not math.isfinite(value):
        return "diverged" if value > 0 else str(value)
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def side_text(side):
    """median [min, max], n seeds."""
    return f"{value_text(side['median'])} [{value_text(side['min'])}, {value_text(side['max'])}], n = {side['n']}"


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


def coord_check_means(rows):
    """{op: {step: {width: mean |x| averaged over the layers}}} from coord_check.py's rows."""
    sums = {}
    for r in rows:
        cell = sums.setdefault(r["op"], {}).setdefault(r["step"], {}).setdefault(r["width"], [0.0, 0])
        cell[0] += r["mean_abs"]
        cell[1] += 1
    return {op: {step: {w: total / n for w, (total, n) in sorted(by_width.items())} for step, by_width in steps.items()}
            for op, steps in sums.items()}


def plot_coord_check(rows, title, path):
    """Tensor Programs V's coord check: mean |x| of each op's output (averaged over layers) against width, log-log,
    one line per training step; flat lines mean the scale of that op does not depend on width."""
    means = coord_check_means(rows)
    cols = 4
    fig, axes = plt.subplots(math.ceil(len(means) / cols), cols, figsize=(2.3 * cols, 1.7 * math.ceil(len(means) / cols)),
                             squeeze=False)
    for ax, (op, steps) in zip(axes.flat, means.items()):
        for step, by_width in sorted(steps.items()):
            ax.plot(list(by_width), list(by_width.values()), marker="o", ms=3, label=f"step {step}",
                    color=plt.cm.viridis(step / max(1, len(steps) - 1)))
        ax.set(xscale="log", yscale="log")
        ax.set_title(op, fontsize=8)
        ax.set_xticks(list(by_width), [str(w) for w in by_width])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.tick_params(labelsize=6)
    for ax in list(axes.flat)[len(means):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.suptitle(f"coord check (mean |x| vs width, one line per step): {title}", fontsize=9)
    fig.tight_layout()
    # 15 panels at the results page's 80 dpi make a 130 KB PNG; 56 dpi keeps it under 100 KB for docs/
    save_png(fig, path, dpi=56)


@dataclass
class PlotOptions:
    out: str = help_of("the folder the pictures go to", default="plots")
    op: str = help_of("the op of the grad_norms plot (an op label of model.py, such as fc2 or q)", default="fc2")
    experiments: str = help_of("a folder of recipe sweeps (sweep.py --recipe): writes OUT/experiments.md and its "
                               "figures from their summary.json files", default="")


def check_out(out):
    """--out is a folder, or a path that can become one: not empty, not a file, not under a file."""
    if not out:
        raise UsageError("--out is empty; give the folder the pictures go to (it is made if absent), such as "
                         "--out=plots")
    existing = files.nearest_existing(out)
    if not os.path.isdir(existing):
        what = files.not_a_file(existing) or "a file"
        where = "" if existing == os.path.normpath(out) else f" is under {existing}, which"
        raise UsageError(f"--out={out}{where} is {what}; give the folder the pictures go to (it is made if absent)")


def parse_args(argv):
    """The folders (positional) and {option: value}."""
    given = flags.parse(argv, PlotOptions, positional="folders")
    paths, opts = given.pop("folders"), dataclasses.asdict(flags.build(PlotOptions, given))
    check_out(opts["out"])
    if opts["experiments"]:
        if paths:
            raise UsageError(f"--experiments reads recipe sweeps only; drop the folders {' '.join(paths)}, or "
                             "--experiments")
        if not os.path.isdir(opts["experiments"]):
            raise UsageError(f"--experiments={opts['experiments']} is not a folder; pass the folder holding the "
                             "recipes' sweeps (sweeps/<recipe>/summary.json)")
        return paths, opts
    if not paths:
        raise UsageError("no folders given; usage: python plot.py RUN_OR_SWEEP_DIR [...] --out=DIR")
    return paths, opts


def make_folder(path):
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise files.cannot_write(path, e) from None


def plot_runs(paths, opts):
    """Every picture of the given run and sweep folders, each read and checked before the first is drawn."""
    runs, sweeps = find_runs(paths)
    make_folder(opts["out"])
    plot_loss(runs, opts["out"])
    for sweep, summary in sweeps:
        plot_loss_vs_lr(sweep, summary, opts["out"])
    for label, events in runs:
        telemetry, headroom = of_kind(events, "telemetry"), of_kind(events, "headroom")
        if not telemetry and not headroom:
            print(f"{label}: per-layer plots skipped: no telemetry or headroom events "
                  "(train.py --telemetry_interval, --fp16_headroom_interval)")
            continue
        plot_grad_norms(label, telemetry, opts["op"], opts["out"])
        plot_gains(label, telemetry, opts["out"])
        plot_attn_logits(label, telemetry, opts["out"])
        plot_powernorm(label, telemetry, opts["out"])
        plot_headroom(label, headroom, opts["out"])


def main(argv):
    if flags.wants_help(argv):
        flags.print_help(__doc__, PlotOptions)
        return 0
    try:
        paths, opts = parse_args(argv)
        if opts["experiments"]:
            experiments_page(opts["experiments"], opts["out"])
        else:
            plot_runs(paths, opts)
    except UsageError as e:
        return flags.fail("plot.py", e)
    except files.WriteError as e:  # what was written before is whole; the file it names is as it was
        print(f"plot.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
