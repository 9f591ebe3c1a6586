"""
Pictures of nanonorm runs, read from their log.jsonl (and a sweep's summary.json), drawn with matplotlib
(lab/figures.py). Any number of run folders (train.py --out_dir) and sweep folders (sweep.py --out_dir):
    python plot.py out/baseline out/normformer --out=plots
    python plot.py sweeps/lr --out=plots --op=fc2
writes into --out:
    loss.png                  train and val loss of all runs overlaid, spikes marked; LR and grad norm below
    loss_vs_lr_<sweep>.png    final val loss vs LR per variant, log-x, diverged runs marked (--mode=lr sweeps)
and for each run whose log has the events (train.py --telemetry_interval, --fp16_headroom_interval), <run> its
folder's path with _ for each separator (numbered +1, +2 where two runs' names would be one):
    grad_norms_<run>.png      mean |g| and L2 norm of one op's weight gradient per layer (--op, default fc2)
    gains_<run>.png           gamma/beta and other gains per layer and op at the last telemetry step
    attn_logits_<run>.png     the max attention logit per layer over steps
    powernorm_<run>.png       PowerNorm/PN-V running psi^2 and nu per layer over steps
    headroom_<run>.png        max |x| per op and layer at the last headroom step against float16's 65504
A plot whose events are absent is skipped with a note. With --tensorboard, no pictures: each run's TensorBoard view,
the event files train.py --tensorboard writes, is written beside its log.jsonl (engine/tensorboard_view.py), for runs
that ran without it; with --wandb, each run's W&B run, as train.py --wandb sends it (engine/wandb_view.py: offline
without an API key, a note saying where each is and how to upload it).

The results page (lab/results_page.py): `python plot.py --experiments=sweeps --out=docs` reads
the summary.json of every recipe's sweep under sweeps/ (python sweep.py --recipe=NAME) and writes
docs/experiments.md, a headline table and a section per claim (the paper's words and number, ours, p, verdict,
deviations, command), a figure per recipe in docs/experiments/ and the page's data in docs/experiments/records/. It
reads nothing else, so the page cannot drift from the data; with --experiments=docs/experiments/records it
regenerates the same page from the committed data.

A log.jsonl or summary.json that is not what train.py or sweep.py write (not JSON, lacking a key a plot reads, a
folder in the file's place), or an --out that cannot be a folder, is bad input: one line naming the file (and line),
exit code 2, before anything is drawn. A log's last line cut short by a killed run is left out with a note. Every
file is written whole or not at all; a write that fails (disk full, read-only) is one line naming it, exit code 1.
"""

from engine import starting  # first: a Ctrl-C from here to main's own handling is one line and exit code 130

import collections
import dataclasses
import glob
import math
import os
import sys
from dataclasses import dataclass

from engine import files
from engine import flags
from engine import run_reader
from engine import views
from engine import wandb_view
from engine.flags import UsageError, help_of
from lab import schema
from lab.figures import FP16_MAX, legend_outside, log_lr_axis, make_folder, plt, save_png
from lab.results_page import experiments_page


def read_events(path, notes):
    """The events of a log.jsonl (run_reader.read_log), each with the keys the plots read; a last line cut short by a
    killed run is left out with a note, appended to notes (said once every log is read: a refusal is one line).
    Anything else foreign is a UsageError naming the file and line."""
    events, note = run_reader.read_log(path)
    if note:
        notes.append(note)
    for line, event in enumerate(events, 1):  # read_log gives one event a line, or refuses the log
        found = schema.mismatch(event, schema.EVENTS.get(event["event"]), "")
        if found:
            raise UsageError(f"{path}:{line}: {event['event']} event: {found}; it is not a log nanonorm wrote")
    return events


def sweep_summary(path):
    """A sweep folder's summary.json with what plot_loss_vs_lr reads (all of it for an --mode=lr sweep)."""
    summary = schema.read_summary(path)
    schema.check_summary(path, summary, schema.SWEEP)
    if summary["mode"] == "lr":
        schema.check_summary(path, summary, schema.LR_SWEEP)
        schema.check_values(path, summary)
    return summary


def find_runs(paths):
    """(label, events) of every run (a folder holding log.jsonl, or each run folder under a sweep folder) and
    (folder, summary) of every sweep folder; all read and checked before anything is drawn."""
    runs, sweeps, notes = [], [], []
    # sweep runs end in .../<variant>/<lr>/<seed>: several given run folders differ only higher up
    common = os.path.dirname(os.path.commonpath([os.path.abspath(p) for p in paths]))
    if len(paths) > 1:
        common = os.path.commonpath([os.path.abspath(p) for p in paths])
    for path in paths:
        for log in run_logs(path):
            label = os.path.relpath(os.path.dirname(log), path)
            if label == ".":  # a run folder given itself: its path below what all the given folders share
                label = os.path.relpath(os.path.abspath(path), common)
            runs.append((label, read_events(log, notes)))
        summary = os.path.join(path, "summary.json")
        if os.path.lexists(summary):  # lexists: a broken symlink in its place is refused, not passed over
            sweeps.append((path, sweep_summary(summary)))
    say(notes)
    return runs, sweeps


def say(notes):
    for note in notes:
        print(f"plot.py: {note}", file=sys.stderr)


def run_logs(path):
    """The log.jsonl of the run folder path, or of every run below the sweep folder path; a UsageError if none."""
    if not os.path.isdir(path):
        raise UsageError(f"{path} is not a folder; pass run folders (train.py --out_dir) or sweep folders")
    # include_hidden: a run in a folder whose name starts with a dot (--lrs=.01 names one .01/) is a run too
    logs = sorted(glob.glob(run_reader.log_path(os.path.join(glob.escape(path), "**")), recursive=True,
                            include_hidden=True))
    if not logs and started(path):
        raise UsageError(f"{path} holds no log.jsonl yet: its runs have started but logged nothing; plot it once "
                         "they have")
    if not logs:
        raise UsageError(f"{path} holds no log.jsonl; pass run folders (train.py --out_dir) or sweep folders")
    return logs


def started(path):
    """Whether a folder without a log holds a run or a sweep that has started: what train.py writes before its first
    line (run.lock, config.json) or sweep.py beside each run it starts (<seed>.out)."""
    names = ("run.lock", run_reader.CONFIG, "*.out")
    return any(glob.glob(os.path.join(glob.escape(path), "**", name), recursive=True, include_hidden=True)
               for name in names)


def of_kind(events, kind):
    return [e for e in events if e["event"] == kind]


def slug(label):
    return "".join(c if c.isalnum() or c in "-.=" else "_" for c in label)


def file_names(labels):
    """A file name part per run, each once: slug(label), and where two runs' labels slug alike (a b and a_b, or the
    same label in two sweep folders) each of them numbered in order with a +, which no slug holds, so that no
    run's plots overwrite another's."""
    slugs = [slug(label) for label in labels]
    seen = collections.Counter(slugs)
    counts, names = {}, []
    for name in slugs:
        counts[name] = counts.get(name, 0) + 1
        names.append(f"{name}+{counts[name]}" if seen[name] > 1 else name)
    return names


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


def plot_grad_norms(label, file_name, telemetry, op, out):
    """Per-layer gradient norms of one op's weights over steps (NormFormer Fig. 3: mean |g| of fc2 per layer;
    Spike No More Fig. 2-3)."""
    lines = {}
    for event in telemetry:
        for row in event["weights"]:
            if row["op"] == op:
                lines.setdefault((row["layer"], row["name"]), []).append((event["step"], row))
    if not lines:
        print(f"grad_norms_{file_name}.png skipped: no telemetry weights rows for op {op}")
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
    save(fig, out, f"grad_norms_{file_name}.png")


def plot_gains(label, file_name, telemetry, out):
    """Gains per layer and op at the last telemetry step: mean +- std as bars, min and max as ticks
    (NormFormer Fig. 4: the distribution of each norm's gamma per layer)."""
    rows = telemetry[-1]["gains"] if telemetry else []
    if not rows:
        print(f"gains_{file_name}.png skipped: no telemetry gains rows")
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
    save(fig, out, f"gains_{file_name}.png")


def plot_attn_logits(label, file_name, telemetry, out):
    """The max attention logit per layer over steps (attention-logit growth: Dehghani et al. 2023 §3.1;
    Wortsman et al. 2023 §3.1)."""
    lines = {}
    for event in telemetry:
        for row in event["attn_logit_max"]:
            lines.setdefault(row["layer"], []).append((event["step"], row["value"]))
    if not lines:
        print(f"attn_logits_{file_name}.png skipped: no telemetry attn_logit_max rows")
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    for layer, points in sorted(lines.items()):
        ax.plot(*zip(*points), label=f"layer {layer}")
    ax.set(xlabel="step", ylabel="max attention logit", title=f"attention logits: {label}")
    ax.legend(fontsize=7)
    save(fig, out, f"attn_logits_{file_name}.png")


def plot_powernorm(label, file_name, telemetry, out):
    """PowerNorm's running quadratic mean psi^2 (eq. 10) and backward statistic nu (eq. 11) per layer and norm
    over steps: mean as a line, min..max shaded; nu drifting away from 0 comes before a NaN."""
    lines = {}
    for event in telemetry:
        for row in event["norm_stats"]:
            lines.setdefault((row["layer"], row["op"]), []).append((event["step"], row))
    if not lines:
        print(f"powernorm_{file_name}.png skipped: no telemetry norm_stats rows")
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
    save(fig, out, f"powernorm_{file_name}.png")


def plot_headroom(label, file_name, headroom, out):
    """Max |x| per op and layer at the last headroom step against float16's largest value 65504 (NormFormer arXiv v1 §4,
    Table 3: the first op past it is the failed one). Non-finite values are drawn as red x at the top."""
    rows = headroom[-1]["ops"] if headroom else []
    if not rows:
        print(f"headroom_{file_name}.png skipped: no headroom events")
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
    save(fig, out, f"headroom_{file_name}.png")


VIEWS = ("tensorboard", "wandb")  # the options that write each run's views (engine/views.py) in place of pictures


@dataclass
class PlotOptions:
    out: str = help_of("the folder the pictures go to", default="plots")
    op: str = help_of("the op of the grad_norms plot (an op label of model.py, such as fc2 or q)", default="fc2")
    experiments: str = help_of("a folder of recipe sweeps (sweep.py --recipe): writes OUT/experiments.md and its "
                               "figures from their summary.json files", default="")
    tensorboard: bool = help_of("no pictures: write each run's TensorBoard view beside its log.jsonl, the event files "
                                "train.py --tensorboard writes, for runs that ran without it", default=False)
    wandb: bool = help_of("no pictures: write each run's W&B run from its log.jsonl, as train.py --wandb sends it "
                          "(offline without an API key), for runs that ran without it", default=False)


def parse_args(argv):
    """The folders (positional) and {option: value}."""
    given = flags.parse(argv, PlotOptions, positional="folders")
    paths, opts = given.pop("folders"), dataclasses.asdict(flags.build(PlotOptions, given))
    files.check_out_folder(opts["out"], "the pictures", "plots")
    shown = [f"--{name}" for name in VIEWS if opts[name]]
    if opts["experiments"]:
        if shown:
            raise UsageError(f"{shown[0]} views runs, --experiments writes the results page; give one of them")
        if paths:
            raise UsageError(f"--experiments reads recipe sweeps only; drop the folders {' '.join(paths)}, or "
                             "--experiments")
        if not os.path.isdir(opts["experiments"]):
            raise UsageError(f"--experiments={opts['experiments']} is not a folder; pass the folder holding the "
                             "recipes' sweeps (sweeps/<recipe>/summary.json)")
        return paths, opts
    if not paths:
        raise UsageError("no folders given; usage: python plot.py RUN_OR_SWEEP_DIR [...] --out=DIR")
    if shown and "out" in given:
        raise UsageError(f"{shown[0]} writes each run's view from its own folder, not into --out; drop one of them")
    twice = [path for path, n in collections.Counter(os.path.realpath(p) for p in paths).items() if n > 1]
    if twice:
        # the same run twice would draw two identical curves under one label
        raise UsageError(f"{twice[0]} is given more than once; give each run or sweep folder once")
    return paths, opts


def plot_runs(paths, opts):
    """Every picture of the given run and sweep folders, each read and checked before the first is drawn."""
    runs, sweeps = find_runs(paths)
    make_folder(opts["out"])
    plot_loss(runs, opts["out"])
    for sweep, summary in sweeps:
        plot_loss_vs_lr(sweep, summary, opts["out"])
    for (label, events), file_name in zip(runs, file_names([label for label, _ in runs])):
        telemetry, headroom = of_kind(events, "telemetry"), of_kind(events, "headroom")
        if not telemetry and not headroom:
            print(f"{label}: per-layer plots skipped: no telemetry or headroom events "
                  "(train.py --telemetry_interval, --fp16_headroom_interval)")
            continue
        plot_grad_norms(label, file_name, telemetry, opts["op"], opts["out"])
        plot_gains(label, file_name, telemetry, opts["out"])
        plot_attn_logits(label, file_name, telemetry, opts["out"])
        plot_powernorm(label, file_name, telemetry, opts["out"])
        plot_headroom(label, file_name, headroom, opts["out"])


def write_views(paths, opts):
    """--tensorboard, --wandb: each run's views (engine/views.py) written from its log.jsonl as train.py would have
    written them, for runs that ran without: TensorBoard's event files beside it, rebuilt (engine/tensorboard_view.py);
    a new W&B run, offline without an API key (engine/wandb_view.py). Every log is read and checked first; a run still
    training is refused, since its views are its own process's to write."""
    if opts["tensorboard"]:
        from engine import tensorboard_view  # here: the view needs torch, which the pictures do not
        tensorboard_view.check_installed(True)
    wandb_view.check_installed(opts["wandb"])
    logs, notes = [log for path in paths for log in run_logs(path)], []
    for log in logs:
        read_events(log, notes)
        folder = os.path.dirname(log)
        who = files.held_by(folder)
        if who:
            raise UsageError(f"{folder} is in use by a run ({who}); its views are that run's to write "
                             "(train.py --tensorboard, --wandb): write them once the run has ended")
    say(notes)
    for log in logs:
        if opts["tensorboard"]:
            tensorboard_view.rebuild(os.path.dirname(log), log)
        if opts["wandb"]:
            wandb_view.start(os.path.dirname(log), log, True, resumed=False, script="plot.py")
        views.close_all()
    runs, its = f"{len(logs)} run{'s' if len(logs) > 1 else ''}", "its" if len(logs) == 1 else "their"
    if opts["tensorboard"]:
        above = os.path.commonpath([os.path.abspath(path) for path in paths])
        if any(os.path.abspath(os.path.dirname(log)) == above for log in logs):
            above = os.path.dirname(above)  # TensorBoard names a run in --logdir itself "."; from above, by its folder
        print(f"plot.py: the TensorBoard view of {runs} written beside {its} log.jsonl: tensorboard --logdir={above}")
    if opts["wandb"]:
        print(f"plot.py: the W&B run of {runs} written from {its} log.jsonl")


def main(argv):
    if flags.wants_help(argv):
        flags.print_help(__doc__, PlotOptions)
        return 0
    try:
        starting.done()  # in the try: from here a Ctrl-C is the KeyboardInterrupt below; before, starting's line
        paths, opts = parse_args(argv)
        if opts["experiments"]:
            experiments_page(opts["experiments"], opts["out"])
        elif opts["tensorboard"] or opts["wandb"]:
            write_views(paths, opts)
        else:
            plot_runs(paths, opts)
    except UsageError as e:
        return flags.fail("plot.py", e)
    except files.WriteError as e:  # what was written before is whole; the file it names is as it was
        print(f"plot.py: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # every file is written whole or not at all (files.write_atomic, a view's rename)
        print("plot.py: stopped by Ctrl-C; each file written before is whole, the one being written is as it was",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
