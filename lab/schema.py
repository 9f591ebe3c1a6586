"""
What the readers of nanonorm's files take from them, checked by hand so that a foreign file is refused with one line
before anything is summed or drawn: the shapes of the events plot.py draws (train.py's log.jsonl) and of summary.json
(sweep.py), held against a value by engine/run_reader.mismatch (which also checks every log line for the fields its
readers rely on), and read_summary(), the one reader of a summary.json.

A shape is what engine/run_reader.mismatch reads (a dict: an object with at least these keys, and so on).
check_values() holds a summary to what a shape cannot say (an LR is a number, a finished run has a loss, a claim's n
is a count, its metric one of lab/recipes.py's, the page's text one line) and a recipe's summary to what its recipe
declares (its claims judged one for one, its design the one its hash names), carried_meaning() what a re-run carries
forward (a finite wall time, a machine), and check_recipe_name() a recipe's name to a plain name, as the results
page names files after it.
"""

import json
import math
import re

from engine import files
from engine import flags
from engine.flags import UsageError
from engine.run_reader import JSON_NAMES, LAYER, mismatch  # the one shape checker, shared with the log's reader
from lab import recipes

NUMBER = (int, float)
MAYBE_NUMBER = (int, float, type(None))

# what plot.py draws from the events beyond what engine/run_reader.EVENT_FIELDS holds every log line to (read_log,
# which plot.py reads logs with, refuses an event without a step, a train event without its loss and LR, and so on)
EVENTS = {
    "train": {"grad_norm": MAYBE_NUMBER},  # None: an fp16 overflow step
    "spike": {"loss": NUMBER},
    "telemetry": {"gains": [{"layer": LAYER, "op": str, "name": str, "mean": NUMBER, "std": NUMBER, "min": NUMBER,
                             "max": NUMBER}],
                  "attn_logit_max": [{"layer": int}],
                  "norm_stats": [{"layer": LAYER, "op": str, **{f"{stat}_{k}": NUMBER for stat in ("psi2", "nu")
                                                                for k in ("mean", "min", "max")}}]},
    "headroom": {"ops": [{"layer": LAYER, "op": str, "pass": str, "max_abs": NUMBER}]},
}
STATUSES = {"done", "diverged", "unfinished"}  # lab/summary.run_record's
PLAIN_NAME = re.compile(r"[A-Za-z0-9_-]+")  # lab/recipes.py's names: a file name inside --out, no path
VARIANT_NAME = re.compile(r"[A-Za-z0-9_.=+-]+")  # sweep.py's variants (FOLDER_NAME): printed on the page as they are
SHA256 = re.compile(r"[0-9a-f]{64}")
MODES = {"lr", "ramp"}  # sweep.py --mode
EXPECT = {"better", "worse"}  # lab/recipes.Claim.expect
# a sweep's summary.json as plot.py's loss-vs-LR plot reads it (LR_SWEEP: an --mode=lr sweep's)
SWEEP = {"mode": MODES}
LR_SWEEP = {"variants": [{"variant": str, "init_loss": NUMBER}],
            "runs": [{"variant": str, "lr": str, "status": STATUSES, "final_loss": MAYBE_NUMBER}]}
# a recipe's summary.json as the results page reads it
SIDE = {"median": None, "min": None, "max": None, "n": None}
INTERVAL = (list, type(None))
CLAIM = {"variant": str, "reference": str, "minus": (list, type(None)), "metric": str, "expect": EXPECT,
         "paper_number": str, "effect_source": str, "relative": bool, "effect_claimed": NUMBER,
         "effect_to_detect": MAYBE_NUMBER, "n": int, "p": MAYBE_NUMBER, "p_holm": MAYBE_NUMBER,
         "effect": MAYBE_NUMBER, "effect_ci": INTERVAL, "difference": MAYBE_NUMBER, "difference_ci": INTERVAL,
         "power": MAYBE_NUMBER, "mde": MAYBE_NUMBER, "verdict": str, "diverged": dict, "arm_medians": dict}
RECIPE_SUMMARY = {
    "mode": MODES,
    "recipe": {"name": str, "title": str, "order": int, "scale": {"cpu", "gpu"}, "paper": str, "quote": str,
               "reference": str, "figure": {"ramp", "loss_vs_lr", "depth", "grad_ratio", "metric"}, "variants": [str],
               "lrs": [str], "claims": [{"variant": str, "metric": str, "expect": EXPECT, "paper_number": str,
                                         "effect_source": str, "minus": (list, type(None))}],
               "deviations": str, "command": str, "train_argv": [str],
               "design": {"variants": [str], "lrs": [str], "seeds": [int], "steps": int, "test": str, "family": str,
                          "power_alpha": NUMBER,
                          "eval_windows": {"eval_iters": int, "batch_size": int, "windows": int, "block_size": int,
                                           "tokens": int}}},
    "claims": [CLAIM],
    "machine": {"hardware": None, "load": NUMBER, "torch": None, "date": None},
    "wall_s": NUMBER,
    "variants": [{"variant": str}],
    "runs": [{"variant": str, "lr": str, "status": STATUSES, "final_loss": MAYBE_NUMBER,
              "final_loss_capped": MAYBE_NUMBER, "peak_lr": MAYBE_NUMBER, "steps_survived": MAYBE_NUMBER,
              "spikes": int, "curve": [[NUMBER, NUMBER, NUMBER]]}],  # [step, lr, train loss]
}
# a variant row that names how its runs ended (the results page's recipe section) also needs the counts:
# named key -> what it needs
ENDED_ROW = {"criterion": {"criterion_count": int, "runs": int}, "failed_op": {"failed_op_count": int},
             "grew_most": {"grew_most_count": int}}
SUMMARY_ALLOWED = ("plot.py reads the summary.json that sweep.py writes; move it away and run the sweep's command "
                   "again to rebuild it from the runs' logs")


def read_summary(path, advice=SUMMARY_ALLOWED):
    """A summary.json as a dict; a UsageError naming the file, what is wrong with it and then advice where it is not
    a file, not JSON or not an object."""
    problem = files.not_a_file(path)
    if problem:
        raise UsageError(f"{path} is {problem}; {advice}")
    try:
        with open(path, "rb") as f:
            summary = files.parse_json(f.read().decode("utf-8"))
    except OSError as e:
        raise UsageError(f"{path}: cannot read it ({e.strerror}); {advice}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text; {advice}") from None
    except ValueError:
        raise UsageError(f"{path}: not JSON; {advice}") from None
    if not isinstance(summary, dict):
        raise UsageError(f"{path}: {JSON_NAMES[type(summary)]}, not an object; {advice}")
    return summary


def check_summary(path, summary, shape, advice=SUMMARY_ALLOWED):
    """A UsageError naming the file and the first place where summary is not of the shape."""
    found = mismatch(summary, shape, "")
    if found:
        raise UsageError(f"{path}: {found}; {advice}")


def is_lr(text):
    """An LR as sweep.py names it: a positive finite number of the flags' one grammar."""
    return bool(flags.FLOAT_TEXT.fullmatch(text)) and 0 < float(text) < math.inf


def check_values(path, summary, advice=SUMMARY_ALLOWED):
    """A UsageError naming path where a run's LR is not a number, a finished run has no final loss, or a variant
    row's L(lr) column is not a number at an LR: the plots read each as a number. The summary has its shape."""
    for i, run in enumerate(summary["runs"]):
        if not is_lr(run["lr"]):
            raise UsageError(f"{path}: runs[{i}].lr is {json.dumps(run['lr'])[:40]}, not a positive number; {advice}")
        if run["status"] == "done" and not isinstance(run["final_loss"], NUMBER):
            raise UsageError(f"{path}: runs[{i}] is done without a final_loss; {advice}")
    for i, row in enumerate(summary["variants"]):
        for key in (k for k in row if k.startswith("L(")):
            if not (key.endswith(")") and is_lr(key[2:-1])):
                found = f"variants[{i}].{key} is not L(an LR)"
            else:
                found = mismatch(row[key], NUMBER, f"variants[{i}].{key}")
            if found:
                raise UsageError(f"{path}: {found[:80]}; {advice}")
    # a summary that names a recipe is one: it has the rest of a recipe's summary (the claims) before its meaning
    found = (mismatch(summary, RECIPE_SUMMARY, "") or recipe_meaning(summary) or names_meaning(summary)
             or declared_meaning(summary) or design_meaning(summary)) if summary.get("recipe") else None
    if found:
        raise UsageError(f"{path}: {found}; {advice}")


def carried_meaning(summary):
    """What is wrong with the fields a re-run carries over from a summary into the new one (its wall time and
    machine: lab/summary.previous_summary), or None: wall_s a finite number >= 0, the machine an object whose load
    is one. Fields a summary does not hold are not asked for. The page itself shows a NaN wall time or load as
    unknown (lab/tables), so only a re-run, which would carry them forward, refuses them."""
    wall = summary.get("wall_s", 0.0)
    if not (type(wall) in NUMBER and math.isfinite(wall) and wall >= 0):
        return f"wall_s is {json.dumps(wall)[:40]}, not a finite number of seconds >= 0"
    machine = summary.get("machine")
    if machine is None:
        return None
    found = mismatch(machine, {"hardware": str, "load": NUMBER, "torch": str, "date": str}, "machine")
    if found:
        return found
    if not (math.isfinite(machine["load"]) and machine["load"] >= 0):
        return f"machine.load is {machine['load']}, not a finite number >= 0"
    return None


def recipe_meaning(summary):
    """What a recipe's summary.json says that its shape allows and its meaning does not, or None: what the results
    page would index, look up, plot or print from it (lab/results_page.py), checked before anything is written."""
    recipe, claims = summary["recipe"], summary["claims"]
    design = recipe["design"]
    for key in ("variants", "lrs", "seeds"):
        if not design[key]:
            return f"recipe.design.{key} is empty; a recipe's design has at least one"
    if not recipe["claims"] and recipe["figure"] in ("metric", "depth"):
        return f"recipe.claims is empty, and its figure ({recipe['figure']}) plots its first claim's metric"
    named = [(f"recipe.claims[{i}]", c) for i, c in enumerate(recipe["claims"])]
    for where, claim in named + [(f"claims[{i}]", c) for i, c in enumerate(claims)]:
        found = metric_meaning(claim["metric"])
        if found:
            return f"{where}.metric is {json.dumps(claim['metric'])[:40]}: {found}"
    for i, claim in enumerate(claims):
        found = claim_meaning(claim)
        if found:
            return f"claims[{i}].{found}"
    if recipe.get("mode", summary["mode"]) != summary["mode"]:
        return f"mode is {json.dumps(summary['mode'])}, where its recipe's is {json.dumps(recipe['mode'])[:40]}"
    for i, run in enumerate(summary["runs"]):
        if summary["mode"] == "ramp" and run["status"] == "diverged":
            for key in ("peak_lr", "steps_survived"):  # the ramp figure plots where each diverged run stopped
                if type(run[key]) not in NUMBER:
                    return f"runs[{i}] diverged in a ramp without its {key}"
    return printed_text(recipe, "recipe") or next(
        (found for i, claim in enumerate(claims) if (found := printed_text(claim, f"claims[{i}]"))), None)


def names_meaning(summary):
    """What is wrong with the variants and LRs a recipe's summary names, or None: each variant (of the recipe, its
    design, its claims, its runs and rows) one of sweep.py's names (letters, digits and _ . = + -), which the page
    prints and looks up as they are, and each LR of the recipe and its design a number."""
    recipe = summary["recipe"]
    named = [("recipe.reference", recipe["reference"])]
    named += [(f"recipe.variants[{i}]", v) for i, v in enumerate(recipe["variants"])]
    named += [(f"recipe.design.variants[{i}]", v) for i, v in enumerate(recipe["design"]["variants"])]
    for where, claims in (("recipe.claims", recipe["claims"]), ("claims", summary["claims"])):
        for i, claim in enumerate(claims):
            arms = [("variant", claim["variant"]), ("reference", claim.get("reference") or recipe["reference"])]
            arms += [(f"minus[{j}]", v) for j, v in enumerate(claim["minus"] or [])]
            named += [(f"{where}[{i}].{key}", v) for key, v in arms]
    named += [(f"{where}[{i}].variant", row["variant"]) for where in ("runs", "variants")
              for i, row in enumerate(summary[where])]
    for where, name in named:
        if not (isinstance(name, str) and VARIANT_NAME.fullmatch(name)):
            return f"{where} is {json.dumps(name)[:40]}, not a variant's name (letters, digits and _ . = + -)"
    for where, lrs in (("recipe.lrs", recipe["lrs"]), ("recipe.design.lrs", recipe["design"]["lrs"])):
        for i, lr in enumerate(lrs):
            if not is_lr(lr):
                return f"{where}[{i}] is {json.dumps(lr)[:40]}, not a positive number"
    return None


# what judge_one copies from a declared claim into its judged one: the page prints the judged one's
JUDGED_AS_DECLARED = ("variant", "metric", "expect", "minus", "paper_number", "effect_source", "relative", "tested",
                      "control", "target_origin")


def declared_meaning(summary):
    """Where a recipe's judged claims are not the claims its recipe declares, or None: claims[i] is recipe.claims[i]
    judged (lab/claims.judge: one result a declared claim, in order), so the page shows every claim the recipe made
    and no other (claims: [] left a recipe's claims off the page without a word)."""
    declared, judged = summary["recipe"]["claims"], summary["claims"]
    if len(judged) != len(declared):
        return (f"claims holds {len(judged)} judged claim{'s' * (len(judged) != 1)}, and recipe.claims declares "
                f"{len(declared)}; a recipe's summary judges each claim its recipe declares")
    for i, (result, claim) in enumerate(zip(judged, declared)):
        pairs = [(key, result.get(key), claim.get(key)) for key in JUDGED_AS_DECLARED if key in result or key in claim]
        pairs += [("reference", result["reference"], claim.get("reference") or summary["recipe"]["reference"]),
                  ("effect_claimed", result["effect_claimed"], claim.get("effect"))]
        for key, value, wanted in pairs:
            if value != wanted:
                return (f"claims[{i}].{key} is {json.dumps(value)[:40]}, where recipe.claims[{i}], the claim it "
                        f"judges, has {json.dumps(wanted)[:40]}")
    return None


def design_meaning(summary):
    """What is wrong with the design hash a recipe's summary records, or None. sweep.py records recipe.design_sha256
    (lab/recipes.design_hash) in the summary and design.json before the runs start (design_record): it must be the
    hash of the design the summary's recipe holds (its name, scale, variants, LRs, seeds, flags and claims: an
    edited one, or another recipe's under this name, is not), and one that lab/recipes.py gives the recipe now or
    design_record holds (an earlier design, which the page marks as such). A summary without one says so on the
    page."""
    recipe = summary["recipe"]
    found = mismatch(summary.get("design_record", []), [{"sha256": str, "stage": str, "recorded": str}],
                     "design_record")
    recorded = recipe.get("design_sha256")
    if found or recorded is None:
        return found
    if not (isinstance(recorded, str) and SHA256.fullmatch(recorded)):
        return f"recipe.design_sha256 is {json.dumps(recorded)[:40]}, not a sha256 (64 hex digits)"
    own = recorded_design_hash(recipe)
    if recorded != own:
        return (f"recipe.design_sha256 is {recorded[:12]}..., not the hash of the design its recipe holds "
                f"({own[:12]}...: lab/recipes.design_hash of its name, scale, variants, LRs, seeds, flags and claims)")
    known = {entry["sha256"] for entry in summary.get("design_record", [])}
    if recipe["name"] in recipes.RECIPES:
        known.add(recipes.design_hash(recipe["name"], recipe["scale"]))
    if recorded not in known:
        return (f"recipe.design_sha256 is {recorded[:12]}..., neither the design lab/recipes.py holds now nor one "
                "sweep.py recorded before the runs (design_record)")
    return None


def recorded_design_hash(recipe):
    """lab/recipes.design_hash of the design a summary's recipe holds: its describe() fields, that is all but what
    lab/summary.recipe_record adds (the design's numbers and its hash), with the recipe's own flags (recipe_argv)
    as train_argv, where sweep.py records the runs' flags, the recipe's and any beyond."""
    described = {k: v for k, v in recipe.items() if k not in ("design", "design_sha256")}
    return recipes.described_hash({**described, "train_argv": recipe.get("recipe_argv", recipe["train_argv"])})


def metric_meaning(metric):
    """What is wrong with a claim's metric (name@lr, or a name alone), or None."""
    name, at, lr = metric.partition("@")
    if name not in recipes.BETTER:
        return f"no metric of lab/recipes.py (one of {', '.join(recipes.BETTER)})"
    if at and not is_lr(lr):
        return f"{json.dumps(lr)[:20]} is not an LR"
    return None


def claim_meaning(claim):
    """What is wrong with a judged claim's numbers, or None: n is a count, p-values and power are probabilities,
    the MDE a size, each interval two numbers in order. None or NaN is a number not known, which the page shows as
    such."""
    if claim["n"] < 0:
        return f"n is {claim['n']}, not a number of pairs >= 0"
    for key in ("p", "p_holm", "power"):
        value = claim[key]
        if value is not None and not math.isnan(value) and not 0 <= value <= 1:
            return f"{key} is {value}, not a probability in [0, 1]"
    if claim["mde"] is not None and claim["mde"] < 0:
        return f"mde is {claim['mde']}, not a size >= 0"
    for key in ("effect_ci", "difference_ci"):
        interval = claim[key]
        if interval is None:
            continue
        found = mismatch(interval, [NUMBER, NUMBER], key)
        if found or not interval[0] <= interval[1]:
            return found or f"{key} is {interval}, not an interval [low, high]"
    return None


def printed_text(record, where):
    """What is wrong with a string the page prints from a record, or None: each is one line of printable text, so
    that none adds a heading, a table row or a list item of its own to the page ("# ..." after a newline)."""
    for key, value in record.items():
        if isinstance(value, str) and not value.isprintable():
            return f"{where}.{key} is {json.dumps(value)[:40]}, not one line of printable text"
    return None


def check_recipe_name(path, summary, advice=SUMMARY_ALLOWED):
    """A recipe's name is a plain name: the results page writes its figure as <name>.png inside --out."""
    name = summary["recipe"]["name"]
    if not PLAIN_NAME.fullmatch(name):
        raise UsageError(f"{path}: recipe.name is {json.dumps(name)[:40]}, not a plain name (letters, digits, _ "
                         f"and -); {advice}")
