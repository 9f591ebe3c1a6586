"""
A sweep's results from its runs' log.jsonl and exit codes: one record per run, the summary rows of its mode, the
comparisons of each variant with its reference (lab/stats.py's tests), a recipe's claims (lab/claims.py), and
summary.json, summary.csv and the Markdown tables on stdout. docs/instruments.md says what each mode summarizes.
"""

import contextlib
import csv
import fcntl
import io
import json
import math
import os
import platform
import statistics
import time
from collections import Counter

import torch

import configs
from diagnostics.instruments import criterion_of
from engine import files
from engine import run_reader
from engine import runtime
from engine.flags import UsageError
from lab import claims as claims_lib
from lab import launch
from lab.claims import PLATEAU, RATIO_STEPS
from lab import recipes
from lab import schema
from lab import stats
from lab.runs import exit_code, read_events
from lab.tables import claims_table, side_text, value_text

ROW_TRIALS = 200  # the Monte Carlo designs of a comparison row's MDE (lab/stats.sign_flip_power)
SWEEP_LOCK = "sweep.lock"  # held while a summary is made (sweep_lock)
METRICS = {"ramp": ("steps_survived", "peak_lr"), "lr": ("final_loss", "spikes", "attn_logit_max", "log_z")}
# a summary.json that sweep.py cannot read back is left as it is, not overwritten
REBUILD = ("this summary.json is not a summary sweep.py wrote: move it away and run again to rebuild it from the "
           "runs' logs")


def median_summary(values):
    """Median, min and max over seeds (NormFormer (final) Fig. 5 reports the median of seeds)."""
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def most_frequent(items):
    """The most frequent item (the first seen on a tie) and its count; (None, 0) for none."""
    counts = Counter(items)
    return counts.most_common(1)[0] if counts else (None, 0)


def run_record(run):
    """What the summaries need from one run's log.jsonl and exit code."""
    events = read_events(run.dir)
    evals = [e for e in events if e["event"] == "eval"]
    diverged = next((e for e in events if e["event"] == "diverged"), None)
    code = exit_code(run)
    end = run_reader.agreed_end(run.dir, events, code, run.dir + ".exit")
    final = evals[-1]["val_loss"] if evals else None
    if end == "diverged" or code == 3 or (final is not None and not math.isfinite(final)):
        status = "diverged"
    elif end == "done" or code == 0:
        status = "done"
    else:
        status = "unfinished"
    failed = (diverged or {}).get("failed_op")
    # per telemetry step: the largest attention logit of any layer (None without --attn_impl=manual) and
    # |mean log Z| of the output logits (Wortsman et al. 2023 §3.1 attention-logit growth, §3.2 output-logit
    # divergence)
    logits = [[e["step"], max((r["value"] for r in e["attn_logit_max"]), default=None),
               abs(e["logits"]["mean_log_z"])] for e in events if e["event"] == "telemetry"]
    init_loss = next((e["val_loss"] for e in evals if e["step"] == 0), None)
    final_loss = math.inf if status == "diverged" else final
    telemetry = [e for e in events if e["event"] == "telemetry"]
    batch_stats = evals[-1].get("val_loss_batch_stats") if evals else None
    data = config_data(run)  # config.json read once for both
    entropy = unigram_entropy(data)
    failure = failure_loss(data)
    return {"variant": run.variant, "lr": run.lr, "seed": run.seed, "status": status,
            "diverged": status == "diverged", "init_loss": init_loss, "final_loss": final_loss,
            "failure_loss": failure, "final_loss_capped": capped_loss(final_loss, failure),
            "grad_ratio": geometric_mean(grad_ratios(telemetry, None, "grad_l2")),
            "fc2_grad_ratio": geometric_mean(grad_ratios(telemetry, "fc2", "grad_mean_abs")),
            "ratio_curve": [[step, ratio] for step, ratio in grad_ratios(telemetry, None, "grad_l2", window=None)],
            "fc2_ratio_curve": [[step, ratio] for step, ratio in grad_ratios(telemetry, "fc2", "grad_mean_abs",
                                                                             window=None)],
            "val_loss_batch_stats": batch_stats if status == "done" else None,
            "leakage": final - batch_stats if status == "done" and batch_stats is not None else None,
            "unigram_entropy": entropy,
            "left_plateau": None if entropy is None or final_loss is None else final_loss < PLATEAU * entropy,
            "steps_survived": diverged["steps_survived"] if diverged else (evals[-1]["step"] if evals else None),
            "peak_lr": diverged["lr"] if diverged else (evals[-1].get("lr") if evals else None),
            "failed_op": op_text(failed) if failed else None,
            "grew_most": grew_most_text((diverged or {}).get("grew_most")),
            "criterion": criterion(diverged) if diverged else None,
            "spikes": sum(e["event"] == "spike" for e in events),
            "attn_logit_max": logits[-1][1] if logits else None, "log_z": logits[-1][2] if logits else None,
            # for the results page's figures: [step, lr, train loss] and [step, attention logit, |log Z|]
            "curve": [[e["step"], e["lr"], e["loss"]] for e in events if e["event"] == "train"],
            "logit_curve": logits}


def capped_loss(loss, failure):
    """min(L, F): a failed run's loss (inf) counts as the failure loss F = ln(V) (lab/claims.FAILURE_RULE), and a
    finished run's loss is capped there too, so that a paired difference stays finite and both arms failing gives
    0; None without both."""
    if loss is None or failure is None:
        return None
    return min(loss, failure)


def failure_loss(data):
    """ln(V) of the run's tokenizer, V from its config.json's data (config_data; the loss of a uniform guess,
    lab/claims.py's FAILURE_RULE); None without it."""
    vocab = data.get("vocab_size")
    return math.log(vocab) if isinstance(vocab, int) and vocab > 0 else None


def grad_ratios(telemetry, op, stat, window=RATIO_STEPS):
    """[(step, layer 0's gradient over the last layer's)] per telemetry step in window (first, last; None: all):
    with op None, the L2 norm over every parameter of the layer, sqrt(sum of grad_l2^2) (Spike No More Fig. 3);
    with an op, the mean of stat over that op's weight rows (NormFormer Fig. 3: mean |grad| of the second FC
    weight, op "fc2", stat "grad_mean_abs"). A step whose ratio is not a positive finite number is left out."""
    ratios = []
    for event in telemetry:
        if window and not window[0] <= event["step"] <= window[1]:
            continue
        rows = [r for r in event["weights"] if isinstance(r["layer"], int)
                and (op is None or r["op"] == op and r["name"].endswith("weight"))]
        if not rows:
            continue
        last = max(r["layer"] for r in rows)
        first_value, last_value = (layer_gradient([r for r in rows if r["layer"] == layer], op, stat)
                                   for layer in (0, last))
        ratio = first_value / last_value if last > 0 and last_value > 0 else math.nan
        if math.isfinite(ratio) and ratio > 0:
            ratios.append((event["step"], ratio))
    return ratios


def layer_gradient(rows, op, stat):
    if op is None:
        return math.sqrt(sum(r[stat] ** 2 for r in rows))
    return statistics.fmean(r[stat] for r in rows)


def geometric_mean(ratios):
    """exp of the mean log ratio over the steps; None for none."""
    return math.exp(statistics.fmean(math.log(ratio) for _, ratio in ratios)) if ratios else None


def unigram_entropy(data):
    """The val split's unigram entropy (nats a token) from the run's config.json's data (config_data), None without
    it (or with one train.py did not write)."""
    entropy = data.get("unigram_entropy")
    return entropy if isinstance(entropy, (int, float)) else None


def config_data(run):
    """The data's description in the run's config.json (data.py's meta), {} without it (or with one train.py did
    not write)."""
    try:
        config = run_reader.read_config(run.dir)
    except UsageError:
        return {}
    data = config.get("data") if config else None
    return data if isinstance(data, dict) else {}


def grew_most_text(grew):
    """Where no op crossed 65504 (train.py --fp16_overflow_fails): the op whose max |x| grew the most over the last
    steps, "q@k layer 0 (x75)", or None."""
    return f"{op_text(grew)} (x{grew['ratio']:.3g})" if grew else None


def op_text(record):
    """"q@k layer 0"; "logits" for an op outside the blocks (its layer is None)."""
    return record["op"] if record["layer"] is None else f"{record['op']} layer {record['layer']}"


def criterion(event):
    """The rule that ended a diverged run, in a word or two: the event's own "criterion" where train.py names it,
    else read from its reason (instruments.CRITERIA: nanonorm's rules, not NormFormer's)."""
    return event.get("criterion") or criterion_of(event["reason"])


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
    """Per variant: L(lr) = the median over seeds of the final val loss, each run's counted as the claims count it
    (min(L, F), a failed run at the failure loss F = ln(V): lab/claims.FAILURE_RULE), best LR, L*, LR sensitivity
    at the same F, and the median finite loss at initialization (inf where none is finite)."""
    rows = []
    for variant, group in group_by(records, ("variant",)).items():
        ran = [r for r in group if r["status"] != "unfinished"]
        counted = [r for r in ran if r["final_loss_capped"] is not None]
        by_lr = claims_lib.median_losses(ran, lrs)
        init = [r["init_loss"] for r in ran if r["init_loss"] is not None and math.isfinite(r["init_loss"])]
        failure = next((r["failure_loss"] for r in counted), None)
        best_lr = min(by_lr, key=by_lr.get) if by_lr else None
        rows.append({"variant": variant, "runs": len(ran), "diverged": sum(r["status"] == "diverged" for r in ran),
                     "best_lr": best_lr, "best_loss": by_lr[best_lr] if by_lr else None,
                     "init_loss": statistics.median(init) if init else math.inf, "failure_loss": failure,
                     "lr_sensitivity": claims_lib.lr_sensitivity(list(by_lr.values()), failure) if by_lr else None,
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


def metric_names(mode, lrs, records, claims=()):
    """The metrics a sweep compares: NAME@LR for each of the mode's metrics that its runs logged, and in lr mode
    best_loss (each variant at its own best LR, as NormFormer (final) §4, Table 1, tunes baseline and NormFormer
    separately); then the binary endpoints of a recipe's claims (left_plateau@LR, survived@LR)."""
    names = [f"{name}@{lr}" for lr in lrs for name in METRICS[mode]
             if any(r[name] is not None for r in records if r["lr"] == lr)]
    binary = [c.metric for c in claims if c.metric.partition("@")[0] in claims_lib.BINARY]
    return list(dict.fromkeys([*names, *(["best_loss"] if mode == "lr" else []), *binary]))


def metric_values(records, variant, metric):
    """(the seeds' values, the LR they are at) of a metric for a variant. A failed run (lab/claims.failed) is the
    worst value, inf where lower is better and -inf where higher is, as is a value that is not a finite number;
    in ramp mode its steps survived and LR reached are the metric itself."""
    ran = [r for r in records if r["variant"] == variant and r["status"] != "unfinished"]
    if metric == "best_loss":
        by_lr = group_by(ran, ("lr",))
        if not by_lr:
            return [], None
        lr = min(by_lr, key=lambda lr: statistics.median(r["final_loss"] for r in by_lr[lr]))
        return [r["final_loss"] for r in by_lr[lr]], lr
    name, _, lr = metric.partition("@")
    if name in claims_lib.BINARY:  # 1 or 0 a run, a failed run 0 (lab/claims.FAILURE_RULE)
        values = [claims_lib.binary_value(r, name) for r in ran if r["lr"] == lr]
        return ([] if None in values else values), lr
    worst = math.inf if recipes.BETTER[name] == "lower" else -math.inf
    values = [r[name] if name in claims_lib.AT_FAILURE or r[name] is None or counts_as_measured(r, r[name]) else worst
              for r in ran if r["lr"] == lr]
    return ([] if None in values else values), lr


def counts_as_measured(record, value):
    """A value of a run that did not fail (lab/claims.failed) and is a finite number."""
    return not claims_lib.failed(record) and math.isfinite(value)


def comparisons(records, mode, lrs, variants, reference, claims=()):
    """Each variant against its reference on every metric: medians, [min, max] and n per side, the difference of
    medians, p and the verdict. Where both sides ran the same seeds the test is paired by seed (the exact sign-flip
    test of lab/stats.py on the per-seed differences, a failed run counted by lab/claims.FAILURE_RULE, as a
    claim's; on a binary endpoint the exact McNemar test); else the exact Mann-Whitney test of the two samples (a
    failed run the worst value), or on a binary endpoint Fisher's exact test. A recipe's claims
    give the paper's direction for their (variant, metric), and for the variant's other metrics; a variant without
    a claim is read against "the variant is better"."""
    expected = {(c.variant, c.metric): c.expect for c in claims}
    by_variant = {c.variant: c.expect for c in claims}
    rows = []
    for variant, ref in references(variants, reference).items():
        for metric in metric_names(mode, lrs, records, claims):
            expect = expected.get((variant, metric), by_variant.get(variant, "better"))
            better = recipes.BETTER[metric.split("@")[0]]
            ours, theirs = (claims_lib.seed_values(records, v, metric, lrs) for v in (variant, ref))
            ours_all, our_lr = metric_values(records, variant, metric)
            theirs_all, their_lr = metric_values(records, ref, metric)
            if ours and set(ours) == set(theirs):
                result = paired(ours, theirs, better, expect)
            else:
                if not (ours_all and theirs_all):
                    continue
                binary = metric.partition("@")[0] in claims_lib.BINARY
                result = (unpaired_binary if binary else unpaired)(ours_all, theirs_all, better, expect)
            rows.append({"variant": variant, "reference": ref, "metric": metric, "lr": our_lr,
                         "reference_lr": their_lr, "claim": (variant, metric) in expected, **result})
    return rows


def spread(values):
    """Median, min and max; inf (a diverged run) stays inf."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def observed_side(lean, better):
    """"better", "worse" or "same": which way the variant leans (lean: the sign of the statistic its p is about,
    variant minus reference), for a metric where "higher" or "lower" is better."""
    if lean == 0:
        return "same"
    return "better" if (lean > 0) == (better == "higher") else "worse"


def paired(ours, theirs, better, expect):
    """A variant's per-seed values against its reference's on the same seeds ({seed: value} each): the sides'
    spread, the difference of medians, the exact sign-flip p of the differences, the direction read from their
    mean (the statistic the p is about), the minimum detectable mean difference and the verdict."""
    seeds = sorted(ours)
    diffs = [ours[s] - theirs[s] for s in seeds]
    p = stats.sign_flip_p(diffs)
    mean = statistics.fmean(diffs)
    side = observed_side(mean, better)
    # a description beside the claims: 200 simulated designs, not the claims' 2000 (2^n sign patterns each)
    mde = (stats.minimum_detectable_effect(len(seeds), statistics.stdev(diffs), trials=ROW_TRIALS)
           if len(seeds) > 1 else math.inf)
    a, b = spread([ours[s] for s in seeds]), spread([theirs[s] for s in seeds])
    return {"variant_values": a, "reference_values": b, "median_difference": a["median"] - b["median"],
            "p": float(p), "p_exact": f"{p.numerator}/{p.denominator}",
            "smallest_p": float(stats.smallest_sign_flip_p(len(seeds))), "observed": side, "expect": expect,
            "mde": mde, "verdict": verdict(p, side, expect, mde), "test": "paired sign-flip", "pairs": len(seeds)}


def unpaired(values, reference, better, expect):
    """A variant's values against its reference's where the two sides did not run the same seeds: the sides'
    spread, the difference of medians, the exact Mann-Whitney p, which side ranks better (from the rank sums, the
    statistic the p is about), the minimum detectable shift (from the finite values' pooled spread; nan where a
    side has fewer than two) and the verdict."""
    ours, theirs = spread(values), spread(reference)
    with_inf = math.isinf(ours["median"]) and math.isinf(theirs["median"])
    p = stats.permutation_p(values, reference)
    ranks = stats.doubled_ranks([float(v) for v in [*values, *reference]])
    lean = sum(ranks[:len(values)]) - len(values) * (len(values) + len(reference) + 1)
    side = observed_side(lean, better)
    finite = [[v for v in side_values if math.isfinite(v)] for side_values in (values, reference)]
    if min(len(f) for f in finite) < 2:
        mde = math.nan
    else:
        pooled = math.sqrt(statistics.fmean([statistics.variance(f) for f in finite]))
        mde = stats.rank_sum_mde(len(values), len(reference), pooled)
    return {"variant_values": ours, "reference_values": theirs,
            "median_difference": None if with_inf else ours["median"] - theirs["median"], "p": float(p),
            "p_exact": f"{p.numerator}/{p.denominator}",
            "smallest_p": float(stats.smallest_p(len(values), len(reference))), "observed": side, "expect": expect,
            "mde": mde, "verdict": verdict(p, side, expect, mde), "test": "Mann-Whitney"}


def unpaired_binary(values, reference, better, expect):
    """A binary endpoint (1 or 0 a run, lab/claims.BINARY) where the two sides did not run the same seeds: the
    sides' spread and shares, Fisher's exact test of the two shares (stats.fisher_p, Agresti §3.5.1), which side
    has the larger share, the smallest p these margins allow and the verdict; no power model for a binary endpoint,
    so the minimum detectable effect is unknown (nan)."""
    n, m = len(values), len(reference)
    yes, their_yes = sum(values), sum(reference)
    p = stats.fisher_p(yes, n, their_yes, m)
    side = observed_side(yes / n - their_yes / m, better)
    total = yes + their_yes
    smallest = min(stats.fisher_p(x, n, total - x, m) for x in range(max(0, total - m), min(total, n) + 1))
    ours, theirs = spread(values), spread(reference)
    return {"variant_values": ours, "reference_values": theirs, "median_difference": ours["median"] - theirs["median"],
            "shares": [yes / n, their_yes / m], "p": float(p), "p_exact": f"{p.numerator}/{p.denominator}",
            "smallest_p": float(smallest), "observed": side, "expect": expect, "mde": math.nan,
            "verdict": verdict(p, side, expect, math.nan), "test": "Fisher's exact"}


def verdict(p, side, expect, mde):
    """One row's verdict by the claims' rule (stats.verdict) at p < 0.05 uncorrected: these rows are every metric of
    every variant, a description beside the recipe's Holm-corrected claims. side, expect: "better" or "worse"."""
    toward = {"better": 1, "worse": -1, "same": 0}
    return stats.verdict(p, toward[side] * toward[expect], "positive", mde)


def comparison_markdown(rows):
    """The comparisons as a Markdown table, each side as the results page shows it."""
    lines = ["| variant | reference | metric | variant: median [min, max] | reference: median [min, max] | "
             "difference | test | p (uncorrected) | expected | verdict |", "|" + "---|" * 10]
    for row in rows:
        metric = row["metric"] + (f" (LR {row['lr']} vs {row['reference_lr']})" if row["metric"] == "best_loss" else "")
        lines.append(f"| {row['variant']} | {row['reference']} | {metric} | {side_text(row['variant_values'])} | "
                     f"{side_text(row['reference_values'])} | {value_text(row['median_difference'], plain=True)} | "
                     f"{row['test']} | {row['p']:.3g} | {row['expect']} | {row['verdict']} |")
    return "\n".join(lines)


def markdown(rows):
    """The summary rows as a Markdown table, with summary.csv's cells."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(value_text(row.get(c), plain=True) for c in columns) + " |" for row in rows]
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
    if not os.path.lexists(path):  # lexists: a broken symlink in its place is refused, not passed over
        return {}
    summary = schema.read_summary(path, REBUILD)
    schema.check_summary(path, {"wall_s": 0.0, **summary}, {"wall_s": schema.NUMBER}, REBUILD)
    found = schema.carried_meaning(summary)  # a NaN wall_s or a machine of "oops" would be carried into the new one
    if found:
        raise UsageError(f"{path}: {found}; {REBUILD}")
    return summary


DESIGN_ADVICE = ("design.json is the record of the designs sweep.py writes before a recipe's runs start (a list of "
                 "sha256, stage, recorded): put back the one the runs started under, or remove it to record the "
                 "design anew")


def design_record(out_dir):
    """The designs sweep.py recorded before the runs started (out_dir/design.json: hash, stage, time), [] if none; a
    file that is not that list (not JSON, a folder, a FIFO, a string) is a UsageError naming it."""
    path = os.path.join(out_dir, "design.json")
    if not os.path.lexists(path):
        return []
    try:
        entries = files.parse_json(files.read_own(path).decode("utf-8"))
    except OSError as e:  # a folder, a FIFO or a link there is files.NotAFile, a UsageError of its own
        raise UsageError(f"{path}: cannot read it ({e.strerror}); {DESIGN_ADVICE}") from None
    except ValueError:  # not UTF-8 (UnicodeDecodeError is one) or not JSON
        raise UsageError(f"{path}: not JSON; {DESIGN_ADVICE}") from None
    found = schema.mismatch(entries, [{"sha256": str, "stage": str}], "design")
    if found:
        raise UsageError(f"{path}: {found}; {DESIGN_ADVICE}")
    return entries


def threads(jobs):
    """The threads each run had: sweep.py's pool gives each of --jobs runs cores // jobs (lab/pool.py)."""
    return max(1, runtime.cpu_cores() // max(1, jobs))


def recipe_record(sweep):
    """The recipe as the results page reads it, with the flags this sweep ran (extra train.py flags may follow the
    recipe's) and its design (lab/claims.design)."""
    stage = recipes.REPLICATION if sweep.replicate else None
    record = {**recipes.describe(sweep.recipe, sweep.scale, sweep.jobs, stage), "train_argv": sweep.train_argv,
              "design_sha256": recipes.design_hash(sweep.recipe, sweep.scale, stage)}
    model_cfg, tc, _, _ = configs.resolve(configs.parse_flags(sweep.train_argv), machine=False)
    return {**record, "design": claims_lib.design(record, model_cfg, tc)}


def missing_runs(runs, records):
    """(failed, elsewhere): how many runs did not finish and are not running (they crashed, were refused or were
    killed: their .out says why), and how many are still running in another process or queued as a scheduler's job
    (lab/launch.queued)."""
    unfinished = [run for run, record in zip(runs, records) if record["status"] == "unfinished"]
    elsewhere = sum(files.held_by(run.dir) is not None or launch.queued(run) is not None for run in unfinished)
    return len(unfinished) - elsewhere, elsewhere


def no_verdict(total, failed, elsewhere):
    """Why a recipe's claims get no verdict, or None: a claim is judged on the whole design, so a run that failed to
    run (a crash, a refusal; a divergence is a result and counts by lab/claims.FAILURE_RULE) or is still running
    leaves the recipe without one."""
    if failed == total:
        return f"all {total} runs failed: they crashed or were refused, see their .out files"
    parts = ([f"{failed} of {total} runs failed: they crashed or were refused, see their .out files"] if failed
             else []) + ([f"{elsewhere} of {total} runs still running in another process or queued"] if elsewhere
                         else [])
    return "; ".join(parts) or None


@contextlib.contextmanager
def sweep_lock(out_dir):
    """The sweep folder's lock (flock on out_dir/sweep.lock), waited for and held while a summary is made: two
    sweeps writing one folder at once take turns, so neither loses the other's summary or wall time. The kernel
    drops it when its holder ends, however it ends. Opened without following a symlink: a link in its place is a
    WriteError, not a write through it."""
    path = os.path.join(out_dir, SWEEP_LOCK)
    try:
        lock = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as e:
        raise files.cannot_write(path, e) from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
    finally:
        os.close(lock)


def judge_recipe(sweep, records):
    """A recipe's claims judged on its runs (lab/claims.judge): after its pilot seeds, or, for its fresh-seed
    replicate, on every seed with each best_loss arm read at the LR the original pilot chose (a replicate chooses
    nothing)."""
    recipe = recipes.RECIPES[sweep.recipe]
    if sweep.replicate:
        return claims_lib.judge(records, sweep.claims, sweep.reference, sweep.lrs, 0, sweep.seeds,
                                fixed_lrs=sweep.best_lrs)
    return claims_lib.judge(records, sweep.claims, sweep.reference, sweep.lrs, recipe.pilot, recipe.tested_seeds)


def write_summary(sweep, runs, wall_s=0.0):
    """summary.json, summary.csv and Markdown tables on stdout. wall_s: this invocation's time running runs, added
    to the previous summary's, so the summary says how long the whole sweep took; where it ran nothing (0), the
    previous summary's machine, date and load stay, as they are the runs'. A recipe whose runs are not all finished
    publishes its claims' numbers without a verdict, and the summary says why (no_verdict). Returns the number of
    failed runs (missing_runs)."""
    try:
        os.makedirs(sweep.out_dir, exist_ok=True)
    except OSError as e:
        raise files.cannot_write(sweep.out_dir, e) from None
    with sweep_lock(sweep.out_dir):  # the runs and the previous summary read, and the new one written, in one turn
        records = [run_record(run) for run in runs]
        failed, elsewhere = missing_runs(runs, records)
        rows = ramp_rows(records) if sweep.mode == "ramp" else lr_rows(records, sweep.lrs)
        compared = (comparisons(records, sweep.mode, sweep.lrs, sweep.variants, sweep.reference,
                                sweep.claims) if sweep.reference else [])
        previous = previous_summary(sweep.out_dir)
        where = previous["machine"] if wall_s == 0 and "machine" in previous else machine()
        judged = judge_recipe(sweep, records) if sweep.recipe else []
        why = no_verdict(len(records), failed, elsewhere) if sweep.recipe else None
        for claim in judged if why else []:
            claim.update(verdict=f"no verdict ({why})", reading="no verdict")
        summary = {"mode": sweep.mode, "reference": sweep.reference, "variants": rows, "comparisons": compared,
                   "recipe": recipe_record(sweep) if sweep.recipe else None, "claims": judged, "no_verdict": why,
                   "failed_runs": failed, "running_elsewhere": elsewhere, "machine": where,
                   "design_record": design_record(sweep.out_dir), "threads": threads(sweep.jobs),
                   "stage": recipes.sweep_stage(sweep.pilot, sweep.replicate),
                   "wall_s": wall_s + previous.get("wall_s", 0.0), "runs": records}
        # inf (a diverged run's loss) is written as Infinity, which Python's json reads back
        files.write_atomic(os.path.join(sweep.out_dir, "summary.json"), json.dumps(summary, indent=1).encode())
        table = io.StringIO()
        writer = csv.DictWriter(table, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
        writer.writeheader()
        writer.writerows({k: value_text(v, plain=True) for k, v in row.items()} for row in rows)
        files.write_atomic(os.path.join(sweep.out_dir, "summary.csv"), table.getvalue().encode())
    if failed + elsewhere:
        print(f"{failed + elsewhere} of {len(records)} runs did not finish ({elsewhere} of them still running in "
              "another process or queued; see the others' .out files); the summary leaves them out")
    print(markdown(rows))
    if compared:
        print()
        print(comparison_markdown(compared))
    if judged:
        print()
        print("The recipe's claims, Holm-corrected together (docs/experiments.md's table):")
        print(claims_table(judged))
    return failed
