"""
The judgement of a recipe's claims (lab/recipes.py) from its runs' records (lab/summary.run_record). A claim is a
per-seed contrast, d_s = value(variant, s) - value(reference, s), or for an interaction
d_s = (value(variant, s) - value(reference, s)) - (value(minus[0], s) - value(minus[1], s)), over the seeds that
every arm involved ran (the arms share seeds, so their data order, initialization draws and evaluation windows pair
up). d_s is signed so that positive is the paper's expected direction. A failed run counts by FAILURE_RULE, fixed
before the runs. Then, per claim:
  p        the exact two-sided sign-flip permutation p of the mean of the d_s (TEST; lab/stats.py)
  p_holm   Holm's adjustment over the recipe's tested claims (the family: every tested claim of the recipe, one
           without pairs entering as p = 1); a descriptive claim (recipes.Claim.tested False) has its own p and
           interval, no p_holm and the verdict "descriptive"
  effect   the mean of d with the interval that inverts the same test and its achieved coverage (INTERVAL),
           in the expected-direction sign; difference: the same in the metric's own sign, variant minus reference.
           A tested claim's interval is at the family's level, 1 - 0.05 / m (Bonferroni over the m tested claims),
           so a "smaller than" reading, which rests on it, is corrected for the family as p_holm is
  power    of the design for the claim's effect (recipes.Claim.effect, times |the reference's median| when
           relative), at alpha = 0.05 / m (Holm's first step, the conservative case), n = the pairs, the differences'
           spread = their observed sd (the recipe's own spread)
  mde      the smallest mean effect the design detects with 80% power at that alpha and sd
  verdict  agrees, disagrees, smaller than the target, or not detected (stats.verdict), read against the
           target effect, whose origin (the paper's number or nanonorm's choice) the claim records; "not detected"
           where every run behind every arm's value failed on every seed (unmeasured): then FAILURE_RULE, not a
           measurement, gave every d
A binary endpoint (left_plateau@LR, survived@LR: 1 or 0 a run) is judged by the same test on d in {-1, 0, 1}, the
exact McNemar test on the discordant pairs; its effect is the difference of the two arms' shares over the pairs.
The gradient ratios (layer 0 over the last layer) count as |ln ratio|: NormFormer Fig. 3 and Spike No More Fig. 3
claim the layers' gradients come closer together, so a ratio that overshoots below 1 is uneven too. best_loss with
a pilot (recipes.Claim.pilot) reads each arm at the LR of its lowest median loss over the first pilot seeds, and
pairs only the seeds after them.
"""

import math
import statistics

from lab import recipes
from lab import stats

ALPHA = stats.ALPHA
CONFIDENCE = 0.95
TARGET_POWER = 0.8
# a claim's metric -> the run record's field holding it; final_loss_capped: min(L, the failure loss)
FIELDS = {"final_loss": "final_loss_capped", "steps_survived": "steps_survived", "peak_lr": "peak_lr",
          "spikes": "spikes", "grad_ratio": "grad_ratio", "fc2_grad_ratio": "fc2_grad_ratio",
          "attn_logit_max": "attn_logit_max", "log_z": "log_z", "left_plateau": "left_plateau"}
# what a failed run measures: the LR ramp's failure time is the metric itself
AT_FAILURE = ("steps_survived", "peak_lr")
BINARY = ("left_plateau", "survived")
# scored as |ln ratio|: 0 where the layers' gradients are even
LOG_RATIOS = ("grad_ratio", "fc2_grad_ratio")
DESCRIPTIVE = "descriptive"
# the telemetry steps whose gradient ratios a run's grad_ratio and fc2_grad_ratio average (early training, where
# NormFormer Fig. 3 and Spike No More Fig. 3 read them)
RATIO_STEPS = (10, 100)
# a run has left the unigram plateau when its final val loss is below this share of the val split's unigram entropy
PLATEAU = 0.9
# What the page prints for every claim. The failure loss is ln(V), not a run's own L_0 (Wortsman et al. 2023 §3's
# cap): arms of different architectures start from different L_0 (normformer_lr, seeds 0-5: nf_baseline 5.63-5.95,
# nf_normformer 5.12-5.73), so with each run's own L_0 a pair whose arms both fail differs by the gap between their
# initial losses; the reference's L_0 is undefined where its own initial loss is NaN. ln(V), a uniform guess over
# the tokenizer's V tokens, is one number for every arm, seed and LR of a sweep, fixed by the tokenizer before any
# run, and near every L_0 of a standard init (logits near 0).
FAILURE_RULE = ("a run that diverged or whose loss is not finite (a NaN at initialization included) has failed; "
                "its final val loss counts as ln(V), the loss of a uniform guess over the tokenizer's V tokens "
                "(bytes: ln 256 = 5.545 nats), the same for every arm, seed and LR, and every finished run's loss "
                "is capped there too, min(L, ln V), so a pair whose arms both fail has d = 0; a failed run's other "
                "metrics (spikes, gradient ratios, logits) are not measurements: it counts as the worst value any "
                "finished run of the sweep had at that LR (no finished run: no value); a seed on which no LR got "
                "below ln(V) has the LR sensitivity ln(V), the largest any seed can have; steps survived and LR "
                "reached are measured at the failure; for survived and left the plateau a failed run counts as 0; "
                "an unfinished run is missing: its seed leaves the claim's pairs, and the claim counts it")
TEST = ("exact two-sided sign-flip permutation test of the mean paired difference over seeds (a binary endpoint: "
        "the same test on the discordant pairs, the exact McNemar test)")
INTERVAL = ("the mean paired difference with the interval of the shifts the same test does not reject (the "
            "order statistics of the 2^n - 1 subset means, Hartigan 1969) at the family's level, 1 - 0.05 / m for "
            "a recipe of m tested claims (Bonferroni: a 'smaller than' reading rests on the interval, and is so "
            "corrected for the family as the p-values are by Holm), 95% for a descriptive claim, printed with its "
            "achieved coverage 1 - 2k / 2^n (at 95%: 6 pairs 96.9%, 8 pairs 95.3%, 10 pairs 95.1%; at 98.3%, m = "
            "3: 8 pairs 98.4%) for differences symmetric about the true mean; where the pairs are too few for the "
            "level (at 95%: 5 or fewer) the test rejects no shift, and the range [min, max] is printed at the "
            "coverage 1 - 2 / 2^n it has, too low to exclude anything; a binary endpoint: the counts of discordant "
            "pairs, no interval")


def failed(record):
    """A diverged run, or one whose loss at initialization is not finite."""
    init = record.get("init_loss")
    return record["status"] == "diverged" or (init is not None and not math.isfinite(init))


def finished(records, variant):
    return [r for r in records if r["variant"] == variant and r["status"] != "unfinished"]


def seed_values(records, variant, metric, lrs, pilot=0):
    """{seed: the variant's value of metric}, a failed run counted by FAILURE_RULE: NAME@LR from the run at that LR,
    lr_sensitivity from the seed's runs at every LR of lrs, best_loss at the variant's best LR (the lowest median;
    with pilot, over the sweep's first pilot seeds, which are then left out). A seed whose value is missing (an
    unfinished run, no telemetry) is left out."""
    ran = finished(records, variant)
    if metric == "lr_sensitivity":
        return {seed: value for seed in sorted({r["seed"] for r in ran})
                if (value := seed_lr_sensitivity([r for r in ran if r["seed"] == seed], lrs)) is not None}
    if metric == "best_loss":
        chosen = pilot_seeds(records, pilot)
        lr = read_at(records, variant, lrs, pilot)
        return {r["seed"]: r["final_loss_capped"] for r in ran
                if r["lr"] == lr and r["seed"] not in chosen and r["final_loss_capped"] is not None}
    name, _, lr = metric.partition("@")
    at_lr = [r for r in ran if r["lr"] == lr]
    if name in BINARY:
        return {r["seed"]: value for r in at_lr if (value := binary_value(r, name)) is not None}
    if name == "final_loss" or name in AT_FAILURE:
        return {r["seed"]: r[FIELDS[name]] for r in at_lr if r[FIELDS[name]] is not None}
    worst = worst_value(records, name, lr)
    values = {r["seed"]: worst if not measured(r, name) else scored(r, name) for r in at_lr}
    return {seed: value for seed, value in values.items() if value is not None}


def read_at(records, variant, lrs, pilot):
    """The LR a best_loss claim reads the variant at: its best LR over the pilot seeds (every seed without one)."""
    return best_lr(finished(records, variant), lrs, pilot_seeds(records, pilot))


def pilot_seeds(records, pilot):
    """The sweep's first pilot seeds: they choose an arm's LR and are not tested."""
    return set(sorted({r["seed"] for r in records})[:pilot])


def median_losses(runs, lrs, seeds=()):
    """{lr: the median loss, min(L, ln V), over the runs of seeds (every seed where seeds is empty)}, in the order
    of lrs, for each LR where a run has a loss."""
    by_lr = {lr: [r["final_loss_capped"] for r in runs if r["lr"] == lr and (not seeds or r["seed"] in seeds)
                  and r["final_loss_capped"] is not None] for lr in lrs}
    return {lr: statistics.median(losses) for lr, losses in by_lr.items() if losses}


def best_lr(runs, lrs, seeds):
    """The LR of lrs with the lowest median loss (median_losses; the first of a tie); None where no run has one."""
    by_lr = median_losses(runs, lrs, seeds)
    return min(by_lr, key=by_lr.get) if by_lr else None


def scored(record, name):
    """A run's value of a metric as the claims score it: a gradient ratio as |ln ratio|, the rest as recorded."""
    value = record[FIELDS[name]]
    if name in LOG_RATIOS and value is not None:
        return abs(math.log(value)) if value > 0 else math.inf
    return value


def measured(record, name):
    """Whether a run's value of a metric is a measurement: the run did not fail and its value is a finite number."""
    value = scored(record, name)
    return not failed(record) and value is not None and math.isfinite(value)


def worst_value(records, name, lr):
    """The worst value of a metric over every finished run of the sweep at lr that measured it (the largest where
    lower is better): what a failed run counts as, the same for every arm; None where no run measured it."""
    values = [scored(r, name) for r in records
              if r["lr"] == lr and r["status"] != "unfinished" and measured(r, name)]
    if not values:
        return None
    return max(values) if recipes.BETTER[name] == "lower" else min(values)


def binary_value(record, name):
    """1 or 0: the run survived (did not fail), or it left the unigram plateau (a failed run did not); None
    where the plateau is unknown (no unigram entropy)."""
    if failed(record):
        return 0
    if name == "survived":
        return 1
    return None if record["left_plateau"] is None else int(record["left_plateau"])


def lr_sensitivity(losses, failure):
    """Wortsman et al. 2023 §3, E_lr[min(L(lr), F) - L*] over the LR grid, L* = min_lr min(L(lr), F), with the
    failure loss F = ln(V) (FAILURE_RULE) in the place of their L_0: a failed run's loss (inf, NaN capped at F)
    counts as F. Where no LR got below F there is no L* to measure from, and the sensitivity is F, the largest any
    grid can have (every min(L, F) <= F, and L* >= 0); None without F."""
    if failure is None:
        return None
    capped = [min(loss, failure) for loss in losses]
    best = min(capped)
    if best >= failure:
        return failure
    return statistics.fmean(loss - best for loss in capped)


def seed_lr_sensitivity(runs, lrs):
    """One variant's and seed's LR sensitivity (lr_sensitivity over its capped final losses); None unless every LR
    of the grid finished."""
    by_lr = {r["lr"]: r for r in runs}
    if any(by_lr.get(lr) is None or by_lr[lr]["final_loss_capped"] is None for lr in lrs):
        return None
    return lr_sensitivity([by_lr[lr]["final_loss_capped"] for lr in lrs], by_lr[lrs[0]]["failure_loss"])


def expected_sign(metric, expect):
    """+1 where variant minus reference is positive in the paper's direction: a lower-is-better metric flips the
    sign, a claim that the variant is worse flips it again."""
    sign = 1 if recipes.BETTER[metric.partition("@")[0]] == "higher" else -1
    return sign if expect == "better" else -sign


def arms(claim, reference):
    """The arms a claim involves: variant, reference and, for an interaction, the two of the subtracted contrast."""
    return [claim.variant, claim.reference or reference, *(claim.minus or ())]


def contrast(records, claim, reference, lrs):
    """(seeds, d_s in the metric's sign, d_s in the expected-direction sign, {arm: {seed: value}}) over the seeds
    present in every arm."""
    involved = arms(claim, reference)
    values = {arm: seed_values(records, arm, claim.metric, lrs, claim.pilot) for arm in involved}
    seeds = sorted(set.intersection(*(set(v) for v in values.values())))
    variant, ref = involved[:2]
    raw = []
    for s in seeds:
        d = values[variant][s] - values[ref][s]
        if claim.minus:
            d -= values[claim.minus[0]][s] - values[claim.minus[1]][s]
        raw.append(d)
    sign = expected_sign(claim.metric, claim.expect)
    return seeds, raw, [sign * d for d in raw], values


def judge(records, claims, reference, lrs):
    """Every claim of a recipe judged (see the module docstring); Holm over the tested ones, a claim without pairs
    counting as p = 1, so that it stays in the family fixed before the runs; descriptive claims outside it."""
    family = sum(claim.tested for claim in claims)
    results = [judge_one(records, claim, reference, lrs, family) for claim in claims]
    tested = [r for r in results if r["tested"]]
    adjusted = stats.holm([r["p"] if r["p"] is not None else 1.0 for r in tested])
    for result, p_holm in zip(tested, adjusted):
        result["p_holm"] = p_holm if result["p"] is not None else None
    for result in results:
        result["verdict"] = verdict(result)
        result["reading"] = reading(result["verdict"])
    return results


def judge_one(records, claim, reference, lrs, family):
    seeds, raw, signed, values = contrast(records, claim, reference, lrs)
    ref = claim.reference or reference
    n = len(seeds)
    alpha = ALPHA / max(family, 1)
    name = claim.metric.partition("@")[0]
    ref_median = statistics.median(values[ref][s] for s in seeds) if seeds else None
    # best_loss: the LR each arm is read at, chosen by its pilot seeds (all seeds without a pilot)
    chosen = ({arm: read_at(records, arm, lrs, claim.pilot) for arm in arms(claim, reference)}
              if name == "best_loss" else None)
    to_detect = claim.effect * abs(ref_median) if claim.relative and ref_median is not None else claim.effect
    sweep_seeds = {r["seed"] for r in records}
    result = {"variant": claim.variant, "reference": ref, "minus": list(claim.minus) if claim.minus else None,
              "metric": claim.metric, "expect": claim.expect, "better": recipes.BETTER[name],
              "endpoint": "binary" if name in BINARY else "continuous",
              "paper_number": claim.paper_number, "effect_source": claim.effect_source, "relative": claim.relative,
              "target_origin": claim.target_origin, "tested": claim.tested, "pilot": claim.pilot,
              "effect_claimed": claim.effect, "p_holm": None,
              "reference_median": ref_median, "effect_to_detect": to_detect, "seeds": seeds, "n": n,
              "differences": raw, "family": family, "alpha_first_step": alpha,
              "unmeasured": sum(unmeasured(records, claim, reference, s, chosen) for s in seeds),
              "diverged": {arm: sum(failed(r) for r in records if r["variant"] == arm and r["seed"] in seeds
                                    and run_counts(r, claim.metric)) for arm in arms(claim, reference)},
              "missing": {arm: len(sweep_seeds - set(values[arm])) for arm in arms(claim, reference)},
              "arm_medians": {arm: statistics.median(values[arm][s] for s in seeds) if seeds else None
                              for arm in arms(claim, reference)},
              "chosen_lr": chosen,
              "p": None, "effect": None, "effect_ci": None, "difference": None, "difference_ci": None,
              "ci_coverage": None, "discordant": None, "mean": None, "sd": None, "power": None, "mde": None}
    if n == 0:
        return result
    sign = expected_sign(claim.metric, claim.expect)
    result.update(p=float(stats.sign_flip_p(signed)), mean=statistics.fmean(signed))
    if name in BINARY:
        # McNemar: only the discordant pairs carry information; no power model for a binary target
        result.update(effect=result["mean"], difference=sign * result["mean"],
                      discordant=[sum(d > 0 for d in signed), sum(d < 0 for d in signed)],
                      mde=math.inf if stats.smallest_sign_flip_p(n) >= alpha else math.nan)
        return result
    # a tested claim's interval at the family's level, as the test behind "smaller than" (INTERVAL)
    interval = stats.mean_interval(signed, alpha if claim.tested else 1 - CONFIDENCE)
    low, high = interval["low"], interval["high"]
    sd = statistics.stdev(signed) if n >= 2 else None
    result.update(effect=interval["estimate"], effect_ci=[low, high], ci_coverage=interval["confidence"],
                  difference=sign * interval["estimate"], difference_ci=sorted([sign * low, sign * high]), sd=sd,
                  # one pair: no spread, and no p below 1, so no effect is detectable
                  power=stats.sign_flip_power(n, to_detect, sd or 0.0, alpha),
                  mde=stats.minimum_detectable_effect(n, sd or 0.0, alpha, TARGET_POWER))
    return result


def unmeasured(records, claim, reference, seed, chosen_lr):
    """Whether every run behind every arm's value on seed failed, so that FAILURE_RULE, not a measurement, gave its
    d: the run at the claim's LR, every LR for lr_sensitivity, the arm's chosen LR for best_loss. Never for the
    metrics a failure is a measurement of (steps survived, LR reached, survived, left the plateau)."""
    name = claim.metric.partition("@")[0]
    if name in AT_FAILURE or name in BINARY:
        return False
    return all(all_failed(records, arm, seed, claim.metric, chosen_lr[arm] if chosen_lr else None)
               for arm in arms(claim, reference))


def all_failed(records, variant, seed, metric, lr=None):
    """Whether the variant has runs on seed that count for metric (at lr, where given) and every one failed."""
    runs = [r for r in records if r["variant"] == variant and r["seed"] == seed and run_counts(r, metric)
            and (lr is None or r["lr"] == lr)]
    return bool(runs) and all(failed(r) for r in runs)


def run_counts(record, metric):
    """Whether a run enters a claim's metric: the one at its LR, or any LR for lr_sensitivity and best_loss."""
    _, _, lr = metric.partition("@")
    return not lr or record["lr"] == lr


def verdict(result):
    """One of the four readings of stats.verdict (the effect's sign read as the paper's direction), against the
    target effect and whose it is; "not run yet" without pairs. Only an interval of at least 95% coverage can
    exclude the target: with 5 pairs or fewer the interval is [min, max] at 1 - 2 / 2^n (2 pairs: 50%), too
    little to call an effect smaller than anything. The interval must reach the family's level, 1 - 0.05 / m
    (INTERVAL). Where every pair's d came from the failure rule (unmeasured), nothing was measured: not detected."""
    if not result.get("tested", True):
        return DESCRIPTIVE
    if result["p_holm"] is None:
        return "not run yet"
    if result["n"] and result.get("unmeasured") == result["n"]:
        return "not detected (every run behind both arms' values failed on every seed: the failure rule gave each d)"
    mde = result["mde"] if result["mde"] is not None else math.inf
    whose = "the paper's" if result["target_origin"] == "paper" else "nanonorm's target"
    level = 1 - result["alpha_first_step"]
    confident = result["ci_coverage"] is not None and result["ci_coverage"] >= level
    return stats.verdict(result["p_holm"], result["effect"], "positive", mde, ALPHA,
                         result["effect_ci"] if confident else None, result["effect_to_detect"], whose)


def reading(text):
    """The verdict's reading in a word or two, for the page to count and label: agrees, disagrees, smaller, not
    detected, not run yet or descriptive."""
    return "smaller" if text.startswith("smaller than") else text.split(" (")[0]


def design(recipe_record, model_cfg, tc):
    """What summary.json records of a recipe's design: variants, LRs, seeds, steps, evaluation windows, the
    metrics, the test, the family and each claim's effect and its source. tc: the runs' TrainConfig."""
    claims = recipe_record["claims"]
    tested = sum(c.get("tested", True) for c in claims)
    windows = tc.eval_iters * tc.batch_size
    return {"variants": recipe_record["variants"], "reference": recipe_record["reference"],
            "lrs": recipe_record["lrs"], "seeds": recipe_record["seed_list"], "steps": tc.max_iters,
            "eval_windows": {"eval_iters": tc.eval_iters, "batch_size": tc.batch_size, "windows": windows,
                             "block_size": model_cfg.block_size, "tokens": windows * model_cfg.block_size},
            "metrics": list(dict.fromkeys(c["metric"] for c in claims)), "test": TEST, "interval": INTERVAL,
            "failure_rule": FAILURE_RULE,
            "family": f"the recipe's {tested} tested claim{'s' if tested != 1 else ''}, Holm-adjusted together",
            "alpha": ALPHA, "power_alpha": ALPHA / max(tested, 1), "target_power": TARGET_POWER,
            "effects": [{"variant": c["variant"], "metric": c["metric"], "effect": c["effect"],
                         "relative": c["relative"], "source": c["effect_source"], "origin": c["target_origin"]}
                        for c in claims]}
