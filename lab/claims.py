"""
The judgement of a recipe's claims (lab/recipes.py) from its runs' records (lab/summary.run_record). A claim is a
per-seed contrast, d_s = value(variant, s) - value(reference, s), or for an interaction
d_s = (value(variant, s) - value(reference, s)) - (value(minus[0], s) - value(minus[1], s)), over the seeds that
every arm involved ran (the arms share seeds, so their data order, initialization draws and evaluation windows pair
up). d_s is signed so that positive is the paper's expected direction. Then, per claim:
  p        the exact two-sided sign-flip permutation p over the 2^n sign assignments of the d_s (lab/stats.py)
  p_holm   Holm's adjustment over the recipe's claims (the family: every claim of the recipe)
  effect   the Hodges-Lehmann estimate of d with its 95% CI (expected-direction sign); difference: the same in the
           metric's own sign, variant minus reference
  power    of the design for the claim's effect (recipes.Claim.effect, times |the reference's median| when
           relative), at alpha = 0.05 / m (Holm's first step, the conservative case), n = the pairs, the differences'
           spread = their observed sd (the recipe's own spread)
  mde      the smallest effect the design detects with 80% power at that alpha and sd
  verdict  "agrees" where p_holm < 0.05 and the effect is positive, "disagrees" where p_holm < 0.05 and it is
           negative, else "not detected" with the MDE
"""

import math
import statistics

from lab import recipes
from lab import stats

ALPHA = stats.ALPHA
CONFIDENCE = 0.95
TARGET_POWER = 0.8
# a claim's metric -> the run record's field holding it; a diverged run's final loss is capped at L_0
FIELDS = {"final_loss": "final_loss_capped", "steps_survived": "steps_survived", "peak_lr": "peak_lr",
          "spikes": "spikes", "grad_ratio": "grad_ratio", "fc2_grad_ratio": "fc2_grad_ratio",
          "attn_logit_max": "attn_logit_max", "log_z": "log_z"}
# the telemetry steps whose gradient ratios a run's grad_ratio and fc2_grad_ratio average (early training, where
# NormFormer Fig. 3 and Spike No More Fig. 3 read them)
RATIO_STEPS = (10, 100)
# a run has left the unigram plateau when its final val loss is below this share of the val split's unigram entropy
PLATEAU = 0.9
TEST = "exact two-sided paired sign-flip permutation test over seeds"


def finished(records, variant):
    return [r for r in records if r["variant"] == variant and r["status"] != "unfinished"]


def seed_values(records, variant, metric, lrs):
    """{seed: the variant's value of metric}: NAME@LR from the run at that LR (final_loss capped at L_0),
    lr_sensitivity from the seed's runs at every LR of lrs, best_loss at the variant's best LR by median. A seed
    whose value is missing (an unfinished run, no telemetry) is left out."""
    ran = finished(records, variant)
    if metric == "lr_sensitivity":
        return {seed: value for seed in sorted({r["seed"] for r in ran})
                if (value := seed_lr_sensitivity([r for r in ran if r["seed"] == seed], lrs)) is not None}
    if metric == "best_loss":
        by_lr = {lr: [r for r in ran if r["lr"] == lr and r["final_loss_capped"] is not None] for lr in lrs}
        by_lr = {lr: runs for lr, runs in by_lr.items() if runs}
        if not by_lr:
            return {}
        best = min(by_lr, key=lambda lr: statistics.median(r["final_loss_capped"] for r in by_lr[lr]))
        return {r["seed"]: r["final_loss_capped"] for r in by_lr[best]}
    name, _, lr = metric.partition("@")
    return {r["seed"]: r[FIELDS[name]] for r in ran if r["lr"] == lr and r[FIELDS[name]] is not None}


def seed_lr_sensitivity(runs, lrs):
    """One variant's and seed's LR sensitivity (Wortsman et al. 2023 §3): the mean over the LR grid of
    min(L(lr), L_0) - min_lr L(lr); None unless every LR of the grid finished."""
    by_lr = {r["lr"]: r for r in runs}
    if any(by_lr.get(lr) is None or by_lr[lr]["final_loss_capped"] is None for lr in lrs):
        return None
    best = min(by_lr[lr]["final_loss"] for lr in lrs)  # L*, of the losses themselves
    if not math.isfinite(best):
        return None
    return statistics.fmean(by_lr[lr]["final_loss_capped"] - best for lr in lrs)


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
    values = {arm: seed_values(records, arm, claim.metric, lrs) for arm in involved}
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
    """Every claim of a recipe judged (see the module docstring); Holm over all of them, a claim without pairs
    counting as p = 1."""
    results = [judge_one(records, claim, reference, lrs, len(claims)) for claim in claims]
    adjusted = stats.holm([r["p"] if r["p"] is not None else 1.0 for r in results])
    for result, p_holm in zip(results, adjusted):
        result["p_holm"] = p_holm if result["p"] is not None else None
        result["verdict"] = verdict(result)
    return results


def judge_one(records, claim, reference, lrs, family):
    seeds, raw, signed, values = contrast(records, claim, reference, lrs)
    ref = claim.reference or reference
    n = len(seeds)
    alpha = ALPHA / family
    ref_median = statistics.median(values[ref][s] for s in seeds) if seeds else None
    to_detect = claim.effect * abs(ref_median) if claim.relative and ref_median is not None else claim.effect
    result = {"variant": claim.variant, "reference": ref, "minus": list(claim.minus) if claim.minus else None,
              "metric": claim.metric, "expect": claim.expect, "better": recipes.BETTER[claim.metric.partition("@")[0]],
              "paper_number": claim.paper_number, "effect_source": claim.effect_source, "relative": claim.relative,
              "effect_claimed": claim.effect, "reference_median": ref_median, "effect_to_detect": to_detect,
              "seeds": seeds, "n": n, "differences": raw, "family": family, "alpha_first_step": alpha,
              "diverged": {arm: sum(r["diverged"] for r in records if r["variant"] == arm and r["seed"] in seeds
                                    and run_counts(r, claim.metric)) for arm in arms(claim, reference)},
              "arm_medians": {arm: statistics.median(values[arm][s] for s in seeds) if seeds else None
                              for arm in arms(claim, reference)},
              "p": None, "effect": None, "effect_ci": None, "difference": None, "difference_ci": None,
              "ci_coverage": None, "mean": None, "sd": None, "power": None, "mde": None}
    if n == 0:
        return result
    hl = stats.hodges_lehmann_paired(signed, 1 - CONFIDENCE)
    low, high = hl["low"], hl["high"]
    sign = expected_sign(claim.metric, claim.expect)
    result.update(p=float(stats.sign_flip_p(signed)), effect=hl["estimate"], effect_ci=[low, high],
                  ci_coverage=hl["confidence"], difference=sign * hl["estimate"],
                  difference_ci=sorted([sign * low, sign * high]), mean=statistics.fmean(signed))
    if n >= 2:
        sd = statistics.stdev(signed)
        result.update(sd=sd, power=stats.sign_flip_power(n, to_detect, sd, alpha),
                      mde=stats.minimum_detectable_effect(n, sd, alpha, TARGET_POWER))
    return result


def run_counts(record, metric):
    """Whether a run enters a claim's metric: the one at its LR, or any LR for lr_sensitivity and best_loss."""
    _, _, lr = metric.partition("@")
    return not lr or record["lr"] == lr


def verdict(result):
    """agrees / disagrees with the paper's direction where Holm's p < 0.05 (by the sign of the Hodges-Lehmann
    effect, positive the paper's direction), else not detected, with the MDE (stats.verdict)."""
    if result["p_holm"] is None:
        return "not run yet"
    mde = result["mde"] if result["mde"] is not None else math.inf
    return stats.verdict(result["p_holm"], result["effect"], "positive", mde, ALPHA)


def design(recipe_record, model_cfg, tc):
    """What summary.json records of a recipe's design: variants, LRs, seeds, steps, evaluation windows, the
    metrics, the test, the family and each claim's effect and its source. tc: the runs' TrainConfig."""
    claims = recipe_record["claims"]
    windows = tc.eval_iters * tc.batch_size
    return {"variants": recipe_record["variants"], "reference": recipe_record["reference"],
            "lrs": recipe_record["lrs"], "seeds": recipe_record["seed_list"], "steps": tc.max_iters,
            "eval_windows": {"eval_iters": tc.eval_iters, "batch_size": tc.batch_size, "windows": windows,
                             "block_size": model_cfg.block_size, "tokens": windows * model_cfg.block_size},
            "metrics": list(dict.fromkeys(c["metric"] for c in claims)), "test": TEST,
            "family": f"the recipe's {len(claims)} claim{'s' if len(claims) > 1 else ''}, Holm-adjusted together",
            "alpha": ALPHA, "power_alpha": ALPHA / max(len(claims), 1), "target_power": TARGET_POWER,
            "effects": [{"variant": c["variant"], "metric": c["metric"], "effect": c["effect"],
                         "relative": c["relative"], "source": c["effect_source"]} for c in claims]}
