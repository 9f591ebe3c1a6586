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
one per line, for a Slurm array, xargs or GNU parallel, and runs nothing.

--mode=ramp: the LR stability test (NormFormer §4, Table 3, Fig. 5, Table 8): --lr_schedule=ramp, the LR
rises linearly from 0 to --lr at --max_iters; per variant and LR: steps survived and the LR reached (median,
min and max over seeds), the most frequent failed op and layer. --mode=lr: the runs' own schedule (cosine by
default) at each LR of the grid; per variant: the best LR, the best final val loss and the LR sensitivity of
Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer training instabilities", §3), where a
diverged run counts as infinite loss, i.e. as L_0. Both count the spike monitor's "spike" events.
summary.json (a diverged run's loss is written as Infinity), summary.csv and a Markdown table on stdout.
"""

import csv
import json
import math
import os
import queue
import shlex
import statistics
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

import train

HERE = os.path.dirname(os.path.abspath(__file__))
SET_BY_SWEEP = ("lr", "seed", "out_dir", "resume", "overwrite")  # per run; the user gives --lrs, --seeds instead
FINISHED_CODES = (0, 3)  # train.py: 0 finished, 3 diverged


class UsageError(Exception):
    """Bad input from the command line: printed as one line, exit code 2."""


@dataclass
class Run:
    variant: str
    lr: str  # as written in --lrs: it names the folder
    seed: int
    dir: str


def parse_args(argv):
    """Split argv into the sweep's own options and the flags every run gets (checked by train.py's parser)."""
    opts = {"variants": "", "lrs": "", "seeds": "1", "mode": "lr", "jobs": "1", "out_dir": "sweep", "dry_run": "False"}
    train_argv = []
    for arg in argv:
        name, has_value, text = arg[2:].partition("=")
        if arg.startswith("--") and name in opts:
            opts[name] = text if has_value else "True"
        else:
            train_argv.append(arg)
    variants = [v for v in opts["variants"].split(",") if v]
    lrs = [lr for lr in opts["lrs"].split(",") if lr]
    if not variants or not lrs:
        raise UsageError("--variants and --lrs are required; e.g. --variants=baseline,norm=powernorm --lrs=3e-3,1e-2")
    if opts["mode"] not in ("ramp", "lr"):
        raise UsageError(f"--mode={opts['mode']} is not a mode; choose ramp or lr")
    for name in ("seeds", "jobs"):
        if not opts[name].isdigit() or int(opts[name]) < 1:
            raise UsageError(f"--{name}={opts[name]} must be a positive integer")
    for lr in lrs:
        try:
            if not float(lr) > 0:
                raise ValueError
        except ValueError:
            raise UsageError(f"--lrs: {lr} is not a positive number; give LRs separated by commas") from None
    given = train.parse_flags(train_argv)
    owned = [name for name in given if name in SET_BY_SWEEP or (name == "lr_schedule" and opts["mode"] == "ramp")]
    if owned:
        raise UsageError(f"{', '.join('--' + n for n in owned)} is set per run by sweep.py; use --lrs, --seeds, "
                         "--out_dir and --mode instead")
    return dict(variants=variants, lrs=lrs, seeds=int(opts["seeds"]), mode=opts["mode"], jobs=int(opts["jobs"]),
                out_dir=opts["out_dir"], dry_run=opts["dry_run"].lower() in ("true", "1", "yes"),
                train_argv=train_argv)


def variant_flags(variant):
    """'normformer' -> --preset=normformer; 'preset=normformer+qk_norm=True' -> --preset=normformer --qk_norm=True."""
    return [f"--{part}" if "=" in part else f"--preset={part}" for part in variant.split("+")]


def grid(args):
    return [Run(variant, lr, seed, os.path.join(args["out_dir"], variant, lr, str(seed)))
            for variant in args["variants"] for lr in args["lrs"] for seed in range(args["seeds"])]


def read_events(path):
    """The events of a log.jsonl ([] if none); a last line cut short by a killed run (no newline yet) is left out."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def exit_code(run):
    """The exit code sweep.py recorded for the run's last attempt, or None."""
    if not os.path.exists(run.dir + ".exit"):
        return None
    with open(run.dir + ".exit") as f:
        return int(f.read())


def is_finished(run):
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
        except train.UsageError as e:
            raise UsageError(f"variant {run.variant}: {e}") from None


def job_env(slot, jobs):
    """One GPU per job where there are GPUs; otherwise the job's share of the CPU cores (and their ids)."""
    env = dict(os.environ)
    if torch.cuda.is_available():
        env["CUDA_VISIBLE_DEVICES"] = str(slot % torch.cuda.device_count())
        return env, None
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // jobs)
    mine = {cores[(slot * share + i) % len(cores)] for i in range(share)}
    env["OMP_NUM_THREADS"] = str(share)
    return env, mine


def run_one(run, args, slots):
    """One train.py process; train.py takes its thread count from the cores it is pinned to."""
    slot = slots.get()
    try:
        flags = train_flags(run, args)
        env, cores = job_env(slot, args["jobs"])
        os.makedirs(os.path.dirname(run.dir), exist_ok=True)
        print(f"start {run.dir}{' (resume)' if '--resume' in flags else ''}", flush=True)
        with open(run.dir + ".out", "a") as out:
            code = subprocess.run([sys.executable, os.path.join(HERE, "train.py"), *flags], stdout=out,
                                  stderr=subprocess.STDOUT, env=env,
                                  preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None).returncode
        with open(run.dir + ".exit", "w") as f:
            f.write(f"{code}\n")
        print(f"exit {code} {run.dir}", flush=True)
        return code
    finally:
        slots.put(slot)


def run_all(runs, args):
    slots = queue.Queue()
    for slot in range(args["jobs"]):
        slots.put(slot)
    pool = ThreadPoolExecutor(args["jobs"])
    try:
        return list(pool.map(lambda run: run_one(run, args, slots), runs))
    finally:
        # on Ctrl-C the running train.py processes write a checkpoint and stop; no new run starts
        pool.shutdown(cancel_futures=True)


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
    return {"variant": run.variant, "lr": run.lr, "seed": run.seed, "status": status,
            "init_loss": next((e["val_loss"] for e in evals if e["step"] == 0), None),
            "final_loss": math.inf if status == "diverged" else final,
            "steps_survived": diverged["steps_survived"] if diverged else (evals[-1]["step"] if evals else None),
            "peak_lr": diverged["lr"] if diverged else (evals[-1]["lr"] if evals else None),
            "failed_op": f"{failed['op']} layer {failed['layer']}" if failed else None,
            "spikes": sum(e["event"] == "spike" for e in events)}


def ramp_rows(records):
    """Per variant and peak LR: steps survived and LR reached (median, min, max over seeds), the failed op."""
    rows = []
    for (variant, lr), group in group_by(records, ("variant", "lr")).items():
        ran = [r for r in group if r["status"] != "unfinished"]
        op, count = most_frequent([r["failed_op"] for r in ran if r["failed_op"]])
        row = {"variant": variant, "lr": lr, "runs": len(ran), "diverged": sum(r["status"] == "diverged" for r in ran)}
        for name in ("steps_survived", "peak_lr"):
            row.update({f"{name}_{k}": v for k, v in median_summary([r[name] for r in ran]).items()})
        rows.append({**row, "failed_op": op, "failed_op_count": count, "spikes": sum(r["spikes"] for r in ran)})
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


def cell(value):
    return f"{value:.4g}" if isinstance(value, float) else ("" if value is None else str(value))


def markdown(rows):
    columns = list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def write_summary(args, runs):
    records = [run_record(run) for run in runs]
    os.makedirs(args["out_dir"], exist_ok=True)
    rows = ramp_rows(records) if args["mode"] == "ramp" else lr_rows(records, args["lrs"])
    with open(os.path.join(args["out_dir"], "summary.json"), "w") as f:
        # inf (a diverged run's loss) is written as Infinity, which Python's json reads back
        json.dump({"mode": args["mode"], "variants": rows, "runs": records}, f, indent=1)
    with open(os.path.join(args["out_dir"], "summary.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
        writer.writeheader()
        writer.writerows({k: cell(v) for k, v in row.items()} for row in rows)
    unfinished = sum(r["status"] == "unfinished" for r in records)
    if unfinished:
        print(f"{unfinished} of {len(records)} runs did not finish (see their .out files); the summary leaves them out")
    print(markdown(rows))


def main(argv):
    if "--help" in argv or "-h" in argv:
        print(__doc__.strip())
        return 0
    try:
        args = parse_args(argv)
        runs = grid(args)
        check_runs(runs, args)
    except (UsageError, train.UsageError) as e:
        print(f"sweep.py: {e}", file=sys.stderr)
        return 2
    todo = [run for run in runs if not is_finished(run)]
    if args["dry_run"]:
        for run in todo:
            print(shlex.join(["python", "train.py", *train_flags(run, args)]))
        return 0
    print(f"{len(runs)} runs, {len(runs) - len(todo)} finished already, {len(todo)} to run, {args['jobs']} at a time")
    try:
        run_all(todo, args)
    except KeyboardInterrupt:
        print("sweep.py: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    write_summary(args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
