"""
Grids of train.py runs, one summary. Every (variant, lr, seed) runs as its own `python train.py` process
into out_dir/<variant>/<lr>/<seed>/, --jobs at a time; any other flag goes to every run:
    python sweep.py --variants=baseline,normformer,norm=powernorm --lrs=3e-3,1e-2 --seeds=3 --mode=lr \
        --jobs=2 --out_dir=sweeps/lr --max_iters=300
A variant is a preset name (model.PRESETS) or flags without their dashes, several joined by "+":
    normformer    norm=powernorm    preset=normformer+qk_norm=True    normformer+z_loss=1e-4
Seeds are 0 .. --seeds-1. Sweep flags take the form --key=value (a bare --dry_run is True).

Re-running the same command skips finished runs (a "done" or "diverged" event in the run's log.jsonl, or
exit code 0 or 3 in <seed>.exit beside the run's folder), resumes interrupted ones that have a checkpoint
(--resume) and starts the others afresh (--overwrite where a previous attempt left files). The console
output of a run goes to <seed>.out beside its folder. --dry_run prints the train.py commands still to run,
one per line, for a Slurm array, xargs or GNU parallel, and runs nothing. A run whose folder another process
holds (the same sweep started twice) is left to that process, never started a second time. A Ctrl-C, SIGTERM or
SIGHUP to sweep.py is passed on to its runs, which stop with a checkpoint, and sweep.py waits for them.

--mode=ramp: the LR stability test (NormFormer §4, Table 3, Fig. 5, Table 8): --lr_schedule=ramp, the LR
rises linearly from 0 to --lr at --max_iters; per variant and LR: steps survived and the LR reached (median,
min and max over seeds), the most frequent failed op and layer. --mode=lr: the runs' own schedule (cosine by
default) at each LR of the grid; per variant: the best LR, the best final val loss and the LR sensitivity of
Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer training instabilities", §3), where a
diverged run counts as infinite loss, i.e. as L_0. Both count the spike monitor's "spike" events.
summary.json (a diverged run's loss is written as Infinity), summary.csv and a Markdown table on stdout.

--reference=VARIANT compares every other variant with it, seed by seed, on each metric: ramp mode
steps_survived@LR and peak_lr@LR; lr mode final_loss@LR, spikes@LR (and attn_logit_max@LR, log_z@LR where the
runs log telemetry) and best_loss, each variant at its own best LR. A diverged run counts as the worst value.
Per comparison: median, [min, max] and n per side, the difference of medians, the exact two-sided permutation
(Mann-Whitney) p and a verdict, "agrees" or "disagrees" only at p < 0.05 (recipes.py). A variant with the
reference's preset and other +key=value overrides is a reference too: dn_deepnorm+n_layer=18 meets
dn_postln+n_layer=18 when --reference=dn_postln+n_layer=6.

--recipe=NAME runs one paper's claim (recipes.RECIPES: its variants, LRs, seeds, mode, reference and flags) into
sweeps/NAME; --scale=gpu is the same claim at a GPU size, into sweeps/NAME_gpu:
    python sweep.py --recipe=normformer_stability --jobs=2
    python sweep.py --recipe=normformer_stability --scale=gpu --dry_run
Its summary.json also holds the recipe and the claims' verdicts, from which `python plot.py --experiments=sweeps
--out=docs` writes docs/experiments.md.
"""

import contextlib
import csv
import functools
import io
import json
import math
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Literal

import torch

from engine import files
from engine import flags
from lab import recipes
from engine import runtime
import train
from engine.files import WriteError
from engine.flags import UsageError, help_of

HERE = os.path.dirname(os.path.abspath(__file__))
SET_BY_SWEEP = ("lr", "seed", "out_dir", "resume", "overwrite")  # per run; the user gives --lrs, --seeds instead
FINISHED_CODES = (0, 3)  # train.py: 0 finished, 3 diverged
MAX_COUNT = 10_000  # --seeds and --jobs: larger is a typo, and 1e11 threads would hang the machine
METRICS = {"ramp": ("steps_survived", "peak_lr"), "lr": ("final_loss", "spikes", "attn_logit_max", "log_z")}


@dataclass
class Run:
    variant: str
    lr: str  # as written in --lrs: it names the folder
    seed: int
    dir: str


@dataclass
class SweepOptions:
    variants: str = help_of("comma-separated: preset names, or flags without dashes joined by +", default="")
    lrs: str = help_of("comma-separated peak LRs (as written, each names a folder)", default="")
    seeds: int = help_of("seeds 0 .. seeds-1 per variant and LR", default=1)
    mode: Literal["lr", "ramp"] = help_of("lr: the runs' own schedule; ramp: the LR stability test", default="lr")
    jobs: int = help_of("runs at a time", default=1)
    out_dir: str = help_of("the sweep's folder: <variant>/<lr>/<seed>/ per run, and the summaries", default="sweep")
    dry_run: bool = help_of("print the train.py commands still to run, and run nothing", default=False)
    reference: str = help_of("the variant every other variant is compared with (seeds, exact p, verdict)", default="")
    recipe: str = help_of(f"a paper's claim as one command: {', '.join(recipes.RECIPES)}", default="")
    scale: Literal["cpu", "gpu"] = help_of("a recipe's size: cpu (minutes on 2 cores) or gpu", default="cpu")


def parse_args(argv):
    """Split argv into the sweep's own options and the flags every run gets (checked by train.py's parser)."""
    own, train_argv = flags.split(argv, SweepOptions)
    given = flags.parse(own, SweepOptions, choices={"recipe": list(recipes.RECIPES)})
    opts = flags.build(SweepOptions, given)
    args = dict(variants=[v for v in opts.variants.split(",") if v], lrs=[lr for lr in opts.lrs.split(",") if lr],
                seeds=opts.seeds, mode=opts.mode, jobs=opts.jobs, out_dir=opts.out_dir, dry_run=opts.dry_run,
                train_argv=train_argv, reference=opts.reference or None, recipe=opts.recipe or None, scale=opts.scale)
    if args["recipe"]:
        args = apply_recipe(args, given)
    elif "scale" in given:
        raise UsageError("--scale sizes a recipe; give --recipe=NAME too")
    variants, lrs = args["variants"], args["lrs"]
    if not variants or not lrs:
        raise UsageError("--variants and --lrs are required; e.g. --variants=baseline,norm=powernorm --lrs=3e-3,1e-2")
    for name in ("seeds", "jobs"):
        if not 1 <= getattr(opts, name) <= MAX_COUNT:
            raise UsageError(f"--{name}={getattr(opts, name)} must be an integer from 1 to {MAX_COUNT}")
    check_lrs(lrs)
    check_variants(variants, args["mode"])
    check_out_dir(args["out_dir"])
    given = train.parse_flags(args["train_argv"])
    owned = [name for name in given if set_per_run(name, args["mode"])]
    if owned:
        raise UsageError(f"{', '.join('--' + n for n in owned)} is set per run by sweep.py; use --lrs, --seeds, "
                         "--out_dir and --mode instead")
    check_reference(args)
    return args


def set_per_run(name, mode):
    return name in SET_BY_SWEEP or (name == "lr_schedule" and mode == "ramp")


def check_lrs(lrs):
    """Positive numbers, each once: an LR given twice would run twice into one folder at once, and 1e-2 beside 0.01
    would count the same LR twice."""
    seen = {}
    for lr in lrs:
        try:
            value = float(lr)
        except ValueError:
            value = math.nan
        if not value > 0 or not math.isfinite(value):
            raise UsageError(f"--lrs: {lr} is not a positive number; give LRs separated by commas")
        if value in seen:
            raise UsageError(f"--lrs: {seen[value]} and {lr} are the same LR; give each LR once")
        seen[value] = lr


def check_variants(variants, mode):
    """Each variant once (baseline and preset=baseline are the same runs), and none setting what the sweep sets per
    run: baseline+lr=1 would be overridden by --lrs without a word."""
    seen = {}
    for variant in variants:
        for part in variant.split("+"):
            name = part.partition("=")[0] if "=" in part else "preset"
            if set_per_run(name, mode):
                raise UsageError(f"variant {variant}: {name} is set per run by sweep.py; use --lrs, --seeds, "
                                 "--out_dir and --mode instead")
        same = seen.setdefault(tuple(variant_flags(variant)), variant)
        if same != variant or variants.count(variant) > 1:
            raise UsageError(f"--variants: {same} and {variant} are the same runs; give each variant once")


def check_out_dir(out_dir):
    """A folder, or a path where one can be made: not empty, not a file, not inside one."""
    if not out_dir:
        raise UsageError("--out_dir is empty; give the sweep's folder")
    path = files.nearest_existing(os.path.abspath(out_dir))
    if not os.path.isdir(path):
        where = "is" if path == os.path.abspath(out_dir) else f"is inside {path}, which is"
        what = files.not_a_file(path) or "a file, not a folder"
        raise UsageError(f"--out_dir={out_dir} {where} {what}; give the sweep's folder")


def variant_flags(variant):
    """'normformer' -> --preset=normformer; 'preset=normformer+qk_norm=True' -> --preset=normformer --qk_norm=True."""
    return [f"--{part}" if "=" in part else f"--preset={part}" for part in variant.split("+")]


def apply_recipe(args, given):
    """args for --recipe=NAME: the recipe's variants, LRs, seeds, mode, reference, claims and every run's flags
    (recipes.settings, --scale=gpu for the GPU-sized ones); the command line's own train.py flags come after the
    recipe's, so they win. --out_dir defaults to sweeps/NAME (sweeps/NAME_gpu), --seeds may raise the recipe's.
    given: the names of the sweep options the command line set."""
    taken = [f"--{name}" for name in ("variants", "lrs", "mode", "reference") if name in given]
    if taken:
        raise UsageError(f"{', '.join(taken)} come from the recipe; run without them, or without --recipe")
    recipe = recipes.settings(args["recipe"], args["scale"])
    if "seeds" in given and args["seeds"] < recipe["seeds"]:
        raise UsageError(f"--seeds={args['seeds']} is fewer than the recipe's {recipe['seeds']}; a verdict needs them")
    out_dir = args["out_dir"] if "out_dir" in given else os.path.join(
        "sweeps", args["recipe"] + ("_gpu" if args["scale"] == "gpu" else ""))
    return {**args, **recipe, "seeds": args["seeds"] if "seeds" in given else recipe["seeds"], "out_dir": out_dir,
            "train_argv": [*recipe["train_argv"], *args["train_argv"]]}


def check_reference(args):
    """--reference must be one of the variants: the comparisons need its runs."""
    if args.get("reference") and args["reference"] not in args["variants"]:
        raise UsageError(f"--reference={args['reference']} is not one of --variants ({', '.join(args['variants'])}); "
                         "name the variant the others are compared with")


def grid(args):
    return [Run(variant, lr, seed, os.path.join(args["out_dir"], variant, lr, str(seed)))
            for variant in args["variants"] for lr in args["lrs"] for seed in range(args["seeds"])]


def read_events(path):
    """The events of a log.jsonl ([] if none) through files.read_log: a last line cut short by a killed run is left
    out with a note on stderr; any other damage is a UsageError naming the file and line."""
    events, note = files.read_log(path)
    if note:
        print(f"sweep.py: {note}", file=sys.stderr)
    return events


def exit_code(run):
    """The exit code sweep.py recorded for the run's last attempt, or None: none recorded, or an empty file (sweep.py
    was killed while writing it). Anything else that is not a number is a UsageError naming the file."""
    path = run.dir + ".exit"
    problem = files.not_a_file(path)
    if problem:
        raise UsageError(f"{path} is {problem}; sweep.py writes a run's exit code there")
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        text = f.read().strip()
    if not text:
        return None
    if not text.isdigit():
        raise UsageError(f"{path}: {text[:20]!r} is not an exit code; sweep.py writes a number there (remove the file "
                         "to let the run's log decide)")
    return int(text)


def is_finished(run):
    """A "done" or "diverged" event in the run's log (a run started by --dry_run's commands has no .exit), or the
    exit code 0 or 3 recorded beside it."""
    ended = any(e["event"] in ("done", "diverged") for e in read_events(os.path.join(run.dir, "log.jsonl")))
    return ended or exit_code(run) in FINISHED_CODES


def train_flags(run, args):
    """The flags of one run: the common ones, the variant's (they win), then what the sweep sets per run."""
    flags = [*args["train_argv"], *variant_flags(run.variant), f"--lr={run.lr}", f"--seed={run.seed}",
             f"--out_dir={run.dir}"]
    if args["mode"] == "ramp":
        flags.append("--lr_schedule=ramp")
    if os.path.exists(os.path.join(run.dir, "ckpt.pt")):
        flags.append("--resume")
    elif os.path.isdir(run.dir) and os.listdir(run.dir):
        flags.append("--overwrite")  # a previous attempt stopped before its first checkpoint
    return flags


def check_runs(runs, args):
    """Every run's flags through train.py's own parser and config checks, before anything starts."""
    for run in runs:
        flags = [f for f in train_flags(run, args) if f not in ("--resume", "--overwrite")]
        try:
            train.build_configs(train.parse_flags(flags))
        except UsageError as e:
            raise UsageError(f"variant {run.variant}: {e}") from None


def job_env(slot, jobs):
    """One GPU per job where there are GPUs; otherwise the job's share of the CPU cores (and their ids)."""
    env = dict(os.environ)
    if torch.cuda.is_available():
        env["CUDA_VISIBLE_DEVICES"] = str(slot % torch.cuda.device_count())
        return env, None
    share = max(1, runtime.cpu_cores() // jobs)
    env["OMP_NUM_THREADS"] = str(share)
    if not hasattr(os, "sched_getaffinity"):  # macOS: no pinning
        return env, None
    cores = sorted(os.sched_getaffinity(0))
    return env, {cores[(slot * share + i) % len(cores)] for i in range(share)}


@dataclass
class Job:
    """A train.py process the sweep started: its run, the slot (CPU cores or GPU) it holds and its console file."""
    run: Run
    slot: int
    process: subprocess.Popen
    out: io.TextIOWrapper


class Stop(Exception):
    """SIGTERM or SIGHUP to sweep.py: its runs are stopped the way train.py stops on them, then the sweep."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_stop(signum, frame):
    raise Stop(signum)


def why_not_start(run):
    """Why a run must not start now (None if it may): another process holds its folder (a sweep started twice, or a
    run from --dry_run's commands) or it finished meanwhile (another sweep ran it)."""
    holder = files.held_by(run.dir)
    if holder:
        return f"running in another process ({holder}); left to it"
    return "finished meanwhile" if is_finished(run) else None


def start(run, args, slot):
    """One train.py process in a session of its own, so that a Ctrl-C in the terminal reaches sweep.py alone, which
    passes it on once (train.py stops at once on a second one). train.py takes its thread count from the cores it is
    pinned to."""
    flags = train_flags(run, args)
    env, cores = job_env(slot, args["jobs"])
    try:
        os.makedirs(os.path.dirname(run.dir), exist_ok=True)
        out = open(run.dir + ".out", "a")
    except OSError as e:
        raise files.cannot_write(run.dir + ".out", e) from None
    print(f"start {run.dir}{' (resume)' if '--resume' in flags else ''}", flush=True)
    try:
        process = subprocess.Popen([sys.executable, os.path.join(HERE, "train.py"), *flags], stdout=out,
                                   stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                   preexec_fn=functools.partial(os.sched_setaffinity, 0, cores) if cores else None)
    except BaseException:
        out.close()
        raise
    return Job(run, slot, process, out)


def finish(job):
    """Record the exit code of an ended job beside its folder (<seed>.exit)."""
    job.out.close()
    code = job.process.returncode
    files.write_atomic(job.run.dir + ".exit", f"{code}\n".encode())
    print(f"exit {code} {job.run.dir}", flush=True)


def run_all(runs, args):
    """Every run, --jobs at a time. A Ctrl-C, SIGTERM or SIGHUP to sweep.py is passed on to the running train.py
    processes, which write a checkpoint and stop; sweep.py waits for them, records their exit codes and re-raises,
    and starts nothing more."""
    pending, jobs, free = list(runs), [], list(range(args["jobs"]))
    try:
        while pending or jobs:
            while pending and free:
                run = pending.pop(0)
                why = why_not_start(run)
                if why:
                    print(f"skip {run.dir}: {why}", flush=True)
                    continue
                jobs.append(start(run, args, free.pop(0)))
            for job in [job for job in jobs if job.process.poll() is not None]:
                jobs.remove(job)
                free.append(job.slot)
                finish(job)
            time.sleep(0.1)
    except BaseException as e:  # a signal, or a file sweep.py could not write: no run is left running
        stop_jobs(jobs, e.signum if isinstance(e, Stop) else signal.SIGINT if isinstance(e, KeyboardInterrupt)
                  else signal.SIGTERM)
        raise


def stop_jobs(jobs, signum):
    """Pass the signal on to every running job and wait for them all; a second Ctrl-C (or signal) meanwhile is
    passed on as a Ctrl-C, which train.py takes as "stop at once"."""
    for job in jobs:
        job.process.send_signal(signum)
    while jobs:
        try:
            jobs[0].process.wait()
            job = jobs.pop(0)
            with contextlib.suppress(WriteError):  # the error that stopped the sweep is the one to report
                finish(job)
        except (KeyboardInterrupt, Stop):
            for job in jobs:
                job.process.send_signal(signal.SIGINT)


def median_summary(values):
    """Median, min and max over seeds (NormFormer Table 3 reports the median of seeds)."""
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def most_frequent(items):
    """The most frequent item (the first seen on a tie) and its count; (None, 0) for none."""
    counts = Counter(items)
    return counts.most_common(1)[0] if counts else (None, 0)


def lr_sensitivity(losses, init_loss):
    """Wortsman et al. 2023 §3: E_lr[min(L(lr), L_0) - L*] over the LR grid, L* = min_lr L(lr).

    A diverged run's loss is inf, so min(L, L_0) caps it at L_0, the loss at initialization. None when
    every LR diverged (no L*)."""
    best = min(losses)
    if not math.isfinite(best):
        return None
    return statistics.fmean(min(loss, init_loss) - best for loss in losses)


def run_record(run):
    """What the summaries need from one run's log.jsonl and exit code."""
    events = read_events(os.path.join(run.dir, "log.jsonl"))
    evals = [e for e in events if e["event"] == "eval"]
    diverged = next((e for e in events if e["event"] == "diverged"), None)
    code = exit_code(run)
    final = evals[-1]["val_loss"] if evals else None
    if diverged or code == 3 or (final is not None and not math.isfinite(final)):
        status = "diverged"
    elif any(e["event"] == "done" for e in events) or code == 0:
        status = "done"
    else:
        status = "unfinished"
    failed = (diverged or {}).get("failed_op")
    # per telemetry step: the largest attention logit of any layer (None without --attn_impl=manual) and
    # |mean log Z| of the output logits (Wortsman et al. 2023 §3.1 attention-logit growth, §3.2 output-logit
    # divergence)
    logits = [[e["step"], max((r["value"] for r in e["attn_logit_max"]), default=None),
               abs(e["logits"]["mean_log_z"])] for e in events if e["event"] == "telemetry"]
    return {"variant": run.variant, "lr": run.lr, "seed": run.seed, "status": status,
            "init_loss": next((e["val_loss"] for e in evals if e["step"] == 0), None),
            "final_loss": math.inf if status == "diverged" else final,
            "steps_survived": diverged["steps_survived"] if diverged else (evals[-1]["step"] if evals else None),
            "peak_lr": diverged["lr"] if diverged else (evals[-1]["lr"] if evals else None),
            "failed_op": op_text(failed) if failed else None,
            "grew_most": grew_most_text((diverged or {}).get("grew_most")),
            "criterion": criterion(diverged) if diverged else None,
            "spikes": sum(e["event"] == "spike" for e in events),
            "attn_logit_max": logits[-1][1] if logits else None, "log_z": logits[-1][2] if logits else None,
            # for the results page's figures: [step, lr, train loss] and [step, attention logit, |log Z|]
            "curve": [[e["step"], e["lr"], e["loss"]] for e in events if e["event"] == "train"],
            "logit_curve": logits}


def grew_most_text(grew):
    """Where no op crossed 65504 (train.py --fp16_overflow_fails): the op whose max |x| grew the most over the last
    steps, "q@k layer 0 (x75)", or None."""
    return f"{op_text(grew)} (x{grew['ratio']:.3g})" if grew else None


def op_text(record):
    """"q@k layer 0"; "logits" for an op outside the blocks (its layer is None)."""
    return record["op"] if record["layer"] is None else f"{record['op']} layer {record['layer']}"


def criterion(event):
    """The rule that ended a diverged run, in a word or two: the event's own "criterion" where train.py names it,
    else read from its reason (probes.DivergenceCheck: nanonorm's rules, not NormFormer's)."""
    if event.get("criterion"):
        return event["criterion"]
    reason = event["reason"]
    for start, name in (("non-finite validation", "non-finite val loss"), ("non-finite", "non-finite loss"),
                        ("float16", "float16 loss scale")):
        if reason.startswith(start):
            return name
    return "loss bound" if "above the bound" in reason else ("loss gap" if "above its best" in reason else reason)


def ramp_rows(records):
    """Per variant and peak LR: steps survived and LR reached (median, min, max over seeds), the failed op."""
    rows = []
    for (variant, lr), group in group_by(records, ("variant", "lr")).items():
        ran = [r for r in group if r["status"] != "unfinished"]
        op, count = most_frequent([r["failed_op"] for r in ran if r["failed_op"]])
        rule, ended = most_frequent([r["criterion"] for r in ran if r["criterion"]])
        # the op alone, without its ratio, so that the seeds' ops can be counted
        grew, grew_count = most_frequent([r["grew_most"].rsplit(" (", 1)[0] for r in ran if r.get("grew_most")])
        row = {"variant": variant, "lr": lr, "runs": len(ran), "diverged": sum(r["status"] == "diverged" for r in ran)}
        for name in ("steps_survived", "peak_lr"):
            row.update({f"{name}_{k}": v for k, v in median_summary([r[name] for r in ran]).items()})
        rows.append({**row, "criterion": rule, "criterion_count": ended, "failed_op": op, "failed_op_count": count,
                     "grew_most": grew, "grew_most_count": grew_count, "spikes": sum(r["spikes"] for r in ran)})
    return rows


def lr_rows(records, lrs):
    """Per variant: L(lr) = median final val loss over seeds (inf if diverged), best LR, L*, LR sensitivity."""
    rows = []
    for variant, group in group_by(records, ("variant",)).items():
        ran = [r for r in group if r["status"] != "unfinished"]
        by_lr = {lr: statistics.median(r["final_loss"] for r in ran if r["lr"] == lr)
                 for lr in lrs if any(r["lr"] == lr for r in ran)}
        init = [r["init_loss"] for r in ran if r["init_loss"] is not None]
        init_loss = statistics.median(init) if init else math.inf
        best_lr = min(by_lr, key=by_lr.get) if by_lr else None
        rows.append({"variant": variant, "runs": len(ran), "diverged": sum(r["status"] == "diverged" for r in ran),
                     "best_lr": best_lr, "best_loss": by_lr[best_lr] if by_lr else None, "init_loss": init_loss,
                     "lr_sensitivity": lr_sensitivity(list(by_lr.values()), init_loss) if by_lr else None,
                     "spikes": sum(r["spikes"] for r in ran), **{f"L({lr})": loss for lr, loss in by_lr.items()}})
    return rows


def group_by(records, keys):
    groups = {}
    for record in records:
        groups.setdefault(tuple(record[k] for k in keys), []).append(record)
    return {key[0] if len(key) == 1 else key: group for key, group in groups.items()}


def references(variants, reference):
    """{variant: the reference it is compared with}: the variant of the reference's preset whose +key=value
    overrides, beside the reference's own, are the variant's (with --reference=dn_postln+n_layer=6,
    "dn_deepnorm+n_layer=18" -> "dn_postln+n_layer=18"), or the reference itself where there is none. The
    variants of the reference's preset are references, not compared."""
    head, *own = reference.split("+")

    def context(variant):
        return frozenset(variant.split("+")[1:]) - frozenset(own)

    family = {context(v): v for v in variants if v.split("+")[0] == head}
    return {v: family.get(context(v), reference) for v in variants if v.split("+")[0] != head}


def metric_names(mode, lrs, records):
    """The metrics a sweep compares: NAME@LR for each of the mode's metrics that its runs logged, and in lr mode
    best_loss (each variant at its own best LR, as NormFormer §4 tunes baseline and NormFormer separately)."""
    names = [f"{name}@{lr}" for lr in lrs for name in METRICS[mode]
             if any(r[name] is not None for r in records if r["lr"] == lr)]
    return names + (["best_loss"] if mode == "lr" else [])


def metric_values(records, variant, metric):
    """(the seeds' values, the LR they are at) of a metric for a variant. A diverged run is the worst value:
    inf where lower is better; in ramp mode its steps survived and LR reached are the metric itself."""
    ran = [r for r in records if r["variant"] == variant and r["status"] != "unfinished"]
    if metric == "best_loss":
        by_lr = group_by(ran, ("lr",))
        if not by_lr:
            return [], None
        lr = min(by_lr, key=lambda lr: statistics.median(r["final_loss"] for r in by_lr[lr]))
        return [r["final_loss"] for r in by_lr[lr]], lr
    name, _, lr = metric.partition("@")
    values = [math.inf if r["status"] == "diverged" and recipes.BETTER[name] == "lower" else r[name]
              for r in ran if r["lr"] == lr]
    return ([] if None in values else values), lr


def comparisons(records, mode, lrs, variants, reference, claims=()):
    """Each variant against its reference on every metric: medians, [min, max] and n per side, the difference of
    medians, the exact permutation p and the verdict (recipes.compare). A recipe's claims give the paper's
    direction for their (variant, metric), and for the variant's other metrics; a variant without a claim is read
    against "the variant is better"."""
    expected = {(c.variant, c.metric): c.expect for c in claims}
    by_variant = {c.variant: c.expect for c in claims}
    rows = []
    for variant, ref in references(variants, reference).items():
        for metric in metric_names(mode, lrs, records):
            ours, our_lr = metric_values(records, variant, metric)
            theirs, their_lr = metric_values(records, ref, metric)
            if ours and theirs:
                result = recipes.compare(ours, theirs, recipes.BETTER[metric.split("@")[0]],
                                         expected.get((variant, metric), by_variant.get(variant, "better")))
                rows.append({"variant": variant, "reference": ref, "metric": metric, "lr": our_lr,
                             "reference_lr": their_lr, "claim": (variant, metric) in expected, **result})
    return rows


def spread_text(side):
    """median [min, max] (n) of one side of a comparison."""
    return f"{cell(side['median'])} [{cell(side['min'])}, {cell(side['max'])}] (n={side['n']})"


def comparison_markdown(rows):
    lines = ["| variant | reference | metric | variant: median [min, max] | reference: median [min, max] | "
             "difference | p | expected | verdict |", "|" + "---|" * 9]
    for row in rows:
        metric = row["metric"] + (f" (LR {row['lr']} vs {row['reference_lr']})" if row["metric"] == "best_loss" else "")
        lines.append(f"| {row['variant']} | {row['reference']} | {metric} | {spread_text(row['variant_values'])} | "
                     f"{spread_text(row['reference_values'])} | {cell(row['median_difference'])} | "
                     f"{row['p']:.3g} | {row['expect']} | {row['verdict']} |")
    return "\n".join(lines)


def cell(value):
    return f"{value:.4g}" if isinstance(value, float) else ("" if value is None else str(value))


def markdown(rows):
    columns = list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def machine():
    """Where the runs ran, for the results page: "2-core AMD EPYC" or the GPUs' name, the torch version, the date."""
    if torch.cuda.is_available():
        hardware = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    else:
        hardware = f"{runtime.cpu_cores()}-core {cpu_model()}"
    # the 5-minute load average when the sweep ended: a shared machine's timings are slower than an idle one's
    return {"hardware": hardware, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "load": os.getloadavg()[1]}


def cpu_model():
    """The CPU's model name as lscpu gives it (/proc/cpuinfo on Linux), else platform.processor()."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "CPU"


def previous_summary(out_dir):
    """The sweep's summary.json as a previous invocation wrote it ({} if none): its wall time and machine carry
    over. A damaged one is a UsageError: it is left as it is, not overwritten."""
    path = os.path.join(out_dir, "summary.json")
    problem = files.not_a_file(path)
    if problem:
        raise UsageError(f"{path} is {problem}; sweep.py writes its summary there")
    if not os.path.exists(path):
        return {}
    try:
        with open(path, "rb") as f:
            summary = json.loads(f.read().decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        summary = None
    if not isinstance(summary, dict) or not isinstance(summary.get("wall_s", 0.0), (int, float)):
        raise UsageError(f"{path} is not a summary sweep.py wrote (not a JSON object with its fields); move it away "
                         "and run again to rebuild it from the runs' logs")
    return summary


def recipe_record(args):
    """The recipe as the results page reads it, with the seeds and flags this sweep ran (--seeds or extra train.py
    flags may add to the recipe's)."""
    return {**recipes.describe(args["recipe"], args["scale"], args["jobs"]), "seeds": args["seeds"],
            "train_argv": args["train_argv"]}


def write_summary(args, runs, wall_s=0.0):
    """summary.json, summary.csv and Markdown tables on stdout. wall_s: this invocation's time running runs, added
    to the previous summary's, so the summary says how long the whole sweep took; where it ran nothing (0), the
    previous summary's machine, date and load stay, as they are the runs'."""
    records = [run_record(run) for run in runs]
    os.makedirs(args["out_dir"], exist_ok=True)
    rows = ramp_rows(records) if args["mode"] == "ramp" else lr_rows(records, args["lrs"])
    compared = (comparisons(records, args["mode"], args["lrs"], args["variants"], args["reference"],
                            args.get("claims", ())) if args.get("reference") else [])
    previous = previous_summary(args["out_dir"])
    where = previous["machine"] if wall_s == 0 and "machine" in previous else machine()
    summary = {"mode": args["mode"], "reference": args.get("reference"), "variants": rows, "comparisons": compared,
               "recipe": recipe_record(args) if args.get("recipe") else None, "machine": where,
               "wall_s": wall_s + previous.get("wall_s", 0.0), "runs": records}
    # inf (a diverged run's loss) is written as Infinity, which Python's json reads back
    files.write_atomic(os.path.join(args["out_dir"], "summary.json"), json.dumps(summary, indent=1).encode())
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
    writer.writeheader()
    writer.writerows({k: cell(v) for k, v in row.items()} for row in rows)
    files.write_atomic(os.path.join(args["out_dir"], "summary.csv"), table.getvalue().encode())
    unfinished = sum(r["status"] == "unfinished" for r in records)
    elsewhere = sum(files.held_by(run.dir) is not None for run in runs)
    if unfinished:
        print(f"{unfinished} of {len(records)} runs did not finish ({elsewhere} of them still running in another "
              "process; see the others' .out files); the summary leaves them out")
    print(markdown(rows))
    if compared:
        print()
        print(comparison_markdown(compared))


def main(argv):
    if flags.wants_help(argv):
        flags.print_help(__doc__, SweepOptions)
        return 0
    try:
        args = parse_args(argv)
        runs = grid(args)
        check_runs(runs, args)
        previous_summary(args["out_dir"])  # a damaged one is refused now, not after hours of runs
        todo = [run for run in runs if not is_finished(run)]
        return run_sweep(args, runs, todo)
    except UsageError as e:
        return flags.fail("sweep.py", e)
    except WriteError as e:
        print(f"sweep.py: {e}", file=sys.stderr)
        return 1


def run_sweep(args, runs, todo):
    """Print --dry_run's commands, or run what is left and write the summaries. Exit code 0, or 128 + the signal
    that stopped the sweep (its runs stopped with a checkpoint)."""
    elsewhere = [run for run in todo if files.held_by(run.dir)]
    for run in elsewhere:
        print(f"sweep.py: {run.dir} is running in another process ({files.held_by(run.dir)}); left to it",
              file=sys.stderr)
    todo = [run for run in todo if run not in elsewhere]
    if args["dry_run"]:
        for run in todo:
            print(shlex.join(["python", "train.py", *train_flags(run, args)]))
        return 0
    print(f"{len(runs)} runs, {len(runs) - len(todo) - len(elsewhere)} finished already, {len(elsewhere)} running "
          f"elsewhere, {len(todo)} to run, {args['jobs']} at a time")
    started = time.time()
    handlers = {signum: signal.signal(signum, raise_stop) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        run_all(todo, args)
    except (KeyboardInterrupt, Stop) as e:
        name = str(e) if isinstance(e, Stop) else "Ctrl-C"
        print(f"sweep.py: stopped by {name}; its runs stopped with a checkpoint; run the same command again to resume",
              file=sys.stderr)
        return 128 + (e.signum if isinstance(e, Stop) else signal.SIGINT)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    write_summary(args, runs, wall_s=time.time() - started if todo else 0.0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
