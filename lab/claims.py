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
           relative), at alpha = 0.05 / m (Holm's first step, the conservative case), n = the planned pairs, the
           differences' spread = the pilot sd's 80% one-sided upper bound (SD_BOUND; power_at_estimate: at the
           pilot sd itself, which 3 seeds cannot carry); power_tested: the same at the tested pairs' own sd
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
# a-priori power is planned at this one-sided upper confidence bound of the pilot's sd (stats.sd_upper_bound): the sd
# of 3 pilot pairs is 2.1x short of its 80% bound, so a power from the estimate claims more than 3 seeds show
SD_BOUND = 0.8
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
CONTROL = "control (outside the family: the paper predicts no gap here)"
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
FAILURE, SECOND = "failure rule", "second rule"
SECOND_RULE = ("only what no failed run touched: for the LR sensitivity, the LRs of the grid where no arm's run "
               "failed on that seed (each arm's optimum over those); for any other metric, the seeds on which no run "
               "behind any arm's value failed; the steps survived, the LR reached and the binary endpoints are "
               "measured at the failure and keep every seed")
SECOND_KEYS = ("n", "seeds", "differences", "p", "p_holm", "effect", "effect_ci", "ci_coverage", "reading")
# a best-LR claim reads each arm at an interior point of its grid whose neighbours are at most this far apart
BRACKET_SPACING = 2.0
MOST_PAIRS = 16  # pairs_for_power looks no further: 16 seeds is past a CPU recipe's budget
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
    lr_sensitivity from the seed's runs at every LR of lrs (the arm alone: claims pair it with paired_sensitivities),
    best_loss at the variant's best LR (the lowest median; with pilot, over the sweep's first pilot seeds). A seed
    whose value is missing (an unfinished run, no telemetry) is left out."""
    ran = finished(records, variant)
    if metric == "lr_sensitivity":
        return {seed: value for seed in sorted({r["seed"] for r in ran})
                if (value := seed_lr_sensitivity([r for r in ran if r["seed"] == seed], lrs)) is not None}
    if metric == "best_loss":
        lr = read_at(records, variant, lrs, pilot)
        return {r["seed"]: r["final_loss_capped"] for r in ran
                if r["lr"] == lr and r["final_loss_capped"] is not None}
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
    """The sweep's first pilot seeds: they choose an arm's LR and fix the design's power, and are never tested."""
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


def bracket_problem(runs, lrs, seeds, spacing):
    """Why an arm's best LR (the lowest median loss over seeds) is not a bracketed optimum, or None where it is: the
    grid has fewer than 3 LRs, the best is its lowest or highest LR, or (spacing, for best_loss) a neighbour of the
    best is more than spacing times away from it. LRs are compared as numbers, whatever order lrs lists them in."""
    grid = sorted(lrs, key=float)
    if len(grid) < 3:
        return f"a grid of {len(grid)} LR{'s' if len(grid) != 1 else ''} cannot bracket an optimum"
    best = best_lr(runs, grid, seeds)
    if best is None:
        return "no run has a loss"
    i = grid.index(best)
    if i in (0, len(grid) - 1):
        return f"its best LR, {best}, is the grid's {'lowest' if i == 0 else 'highest'}"
    if spacing:
        wide = [lr for lr in (grid[i - 1], grid[i + 1]) if max(float(lr), float(best)) / min(float(lr), float(best))
                > spacing * (1 + 1e-9)]
        if wide:
            return f"its best LR, {best}, has a neighbour ({wide[0]}) more than {spacing:g}x away"
    return None


def flat_pilot(runs, lrs, seeds):
    """{"range", "noise"} where an arm's pilot is flat, None where it is not: the range of its median losses over the
    grid is within the pilot's noise, the median over the grid of the range of the seeds' losses at one LR. The pick
    on a flat pilot is still the lowest median (best_lr, fixed before the runs), but any LR of the grid would give
    the same loss within that range, so the page says so (deepnorm_depth's Post-LN at 18 and 36 layers: on the
    unigram plateau at every LR)."""
    by_lr = {lr: [r["final_loss_capped"] for r in runs if r["lr"] == lr and r["seed"] in seeds
                  and r["final_loss_capped"] is not None] for lr in lrs}
    by_lr = {lr: losses for lr, losses in by_lr.items() if len(losses) >= 2}
    if len(by_lr) < 2:
        return None
    medians = [statistics.median(losses) for losses in by_lr.values()]
    spread = max(medians) - min(medians)
    noise = statistics.median(max(losses) - min(losses) for losses in by_lr.values())
    return {"range": spread, "noise": noise} if spread <= noise else None


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


def paired_sensitivities(records, involved, lrs, seed, rule=FAILURE):
    """{arm: its LR sensitivity on seed} for a claim's arms, each against its own optimum L*_arm = min_lr L(lr)
    (Wortsman et al. 2023 §3): the mean over the grid of its excess L(lr) - L*_arm. Under FAILURE_RULE a failed run
    (or one at ln V) counts as the excess E = ln V - min over the arms of L*_arm, the same number for every arm on
    the seed, and every excess is capped at E: an arm whose optimum is lower is not charged more for the same
    failures (with ln V - L*_arm, a variant 0.1 nats better at every LR, failing where the reference fails, came
    out less stable). Under SECOND_RULE only the LRs where no arm failed count, each arm's L* over those. None where
    an arm lacks a finished run at an LR of the grid (or, second rule, no LR is left)."""
    losses = {}
    for arm in involved:
        by_lr = {r["lr"]: r for r in finished(records, arm) if r["seed"] == seed}
        if any(by_lr.get(lr) is None or by_lr[lr]["final_loss_capped"] is None for lr in lrs):
            return None
        losses[arm] = [(by_lr[lr]["final_loss_capped"], by_lr[lr]) for lr in lrs]
    failure = next(iter(losses.values()))[0][1]["failure_loss"]
    bad = [any(failed(losses[arm][i][1]) or losses[arm][i][0] >= failure for arm in involved) for i in range(len(lrs))]
    if rule == SECOND:
        kept = [i for i in range(len(lrs)) if not bad[i]]
        if not kept:
            return None
        return {arm: statistics.fmean(losses[arm][i][0] - min(losses[arm][j][0] for j in kept) for i in kept)
                for arm in involved}
    optimum = {arm: min(loss for loss, _ in losses[arm]) for arm in involved}
    excess = failure - min(optimum.values())
    return {arm: statistics.fmean(excess if failed(run) or loss >= failure else min(loss - optimum[arm], excess)
                                  for loss, run in losses[arm]) for arm in involved}


def chosen_lrs(records, claim, reference, lrs, pilot):
    """{arm: the LR it is read at} for a best_loss claim, each chosen by its pilot seeds (read_at); None otherwise."""
    if claim.metric != "best_loss":
        return None
    return {arm: read_at(records, arm, lrs, pilot) for arm in arms(claim, reference)}


def claim_values(records, claim, reference, lrs, pilot, rule):
    """{arm: {seed: value}} for a claim's arms, every seed of the sweep (pilot ones too): lr_sensitivity paired on
    each seed (paired_sensitivities), the rest per arm (seed_values). Under SECOND_RULE a seed on which a run behind
    any arm's value failed is left out (the metrics a failure is a measurement of keep every seed)."""
    involved = arms(claim, reference)
    if claim.metric == "lr_sensitivity":
        values = {arm: {} for arm in involved}
        for seed in sorted({r["seed"] for r in records}):
            found = paired_sensitivities(records, involved, lrs, seed, rule)
            for arm, value in (found or {}).items():
                values[arm][seed] = value
        return values
    values = {arm: seed_values(records, arm, claim.metric, lrs, pilot) for arm in involved}
    name = claim.metric.partition("@")[0]
    if rule == SECOND and name not in AT_FAILURE and name not in BINARY:
        chosen = chosen_lrs(records, claim, reference, lrs, pilot)
        hit = {s for s in {r["seed"] for r in records} for arm in involved
               if any_failed(records, arm, s, claim.metric, chosen[arm] if chosen else None)}
        values = {arm: {s: v for s, v in by_seed.items() if s not in hit} for arm, by_seed in values.items()}
    return values


def contrast(records, claim, reference, lrs, pilot=0, rule=FAILURE):
    """(seeds, d_s in the metric's sign, d_s in the expected-direction sign, {arm: {seed: value}}) over the tested
    seeds (those after the pilot) present in every arm."""
    values = claim_values(records, claim, reference, lrs, pilot, rule)
    tested = {r["seed"] for r in records} - pilot_seeds(records, pilot)
    return (*pair_up(values, claim, reference, tested), values)


def pair_up(values, claim, reference, seeds):
    """(seeds, d_s in the metric's sign, d_s in the expected-direction sign) over those of seeds present in every
    arm of values ({arm: {seed: value}})."""
    involved = arms(claim, reference)
    seeds = sorted(set(seeds).intersection(*(set(values[arm]) for arm in involved)))
    variant, ref = involved[:2]
    raw = []
    for s in seeds:
        d = values[variant][s] - values[ref][s]
        if claim.minus:
            d -= values[claim.minus[0]][s] - values[claim.minus[1]][s]
        raw.append(d)
    sign = expected_sign(claim.metric, claim.expect)
    return seeds, raw, [sign * d for d in raw]


def judge(records, claims, reference, lrs, pilot=0, planned=None, fixed_lrs=None):
    """Every claim of a recipe judged (see the module docstring), under FAILURE_RULE and again under SECOND_RULE;
    Holm over the tested ones, a claim without pairs or without a bracketed optimum counting as p = 1, so that it
    stays in the family fixed before the runs; descriptive claims outside it. pilot: the sweep's first seeds that
    choose LRs and fix the a-priori power; they are never tested. planned: the tested seeds of the design (default:
    the sweep's seeds after the pilot), the n of the a-priori power. fixed_lrs ({arm: LR}, a replicate's): where a
    best_loss claim reads each arm, chosen by the original's pilot, so that the replicate chooses nothing (its
    other LRs, the grid check's, do not enter the claim, and no bracket is checked again)."""
    first = judge_rule(records, claims, reference, lrs, pilot, FAILURE, planned, fixed_lrs=fixed_lrs)
    # the second rule is judged against the same target, fixed before the runs: a relative target recomputed
    # without the failed runs would scale with a reference median the failures no longer count in
    targets = [result["effect_to_detect"] for result in first]
    results = [first, judge_rule(records, claims, reference, lrs, pilot, SECOND, planned, targets, fixed_lrs)]
    for result, second in zip(*results):
        if any(result["diverged"].values()):
            result["second_rule"] = {key: second[key] for key in SECOND_KEYS}
        result["verdict"] = verdict(result)
        result["reading"] = reading(result["verdict"])
    return results[0]


def judge_rule(records, claims, reference, lrs, pilot, rule, planned=None, targets=None, fixed_lrs=None):
    family = sum(claim.tested for claim in claims)
    results = []
    for i, claim in enumerate(claims):
        fixed = bool(fixed_lrs) and claim.metric == "best_loss"  # a replicate's arm, read at its original's LR
        results.append(judge_one(at_fixed_lrs(records, fixed_lrs) if fixed else records, claim, reference, lrs,
                                 family, pilot, rule, planned, targets[i] if targets else None, bracket=not fixed))
    tested = [r for r in results if r["tested"]]
    adjusted = stats.holm([r["p"] if r["p"] is not None and not r["unbracketed"] else 1.0 for r in tested])
    for result, p_holm in zip(tested, adjusted):
        result["p_holm"] = p_holm if result["p"] is not None else None
    for result in results:
        result["verdict"] = verdict(result)
        result["reading"] = reading(result["verdict"])
    return results


def at_fixed_lrs(records, fixed_lrs):
    """The runs of the arms of fixed_lrs ({arm: LR}) at that LR alone, and every run of the other arms."""
    return [r for r in records if r["variant"] not in fixed_lrs or r["lr"] == fixed_lrs[r["variant"]]]


def judge_one(records, claim, reference, lrs, family, pilot=0, rule=FAILURE, planned=None, target=None, bracket=True):
    values = claim_values(records, claim, reference, lrs, pilot, rule)
    chosen_seeds = pilot_seeds(records, pilot)
    sweep_seeds = {r["seed"] for r in records}
    seeds, raw, signed = pair_up(values, claim, reference, sweep_seeds - chosen_seeds)
    pilot_pairs, pilot_raw, pilot_signed = pair_up(values, claim, reference, chosen_seeds)
    ref = claim.reference or reference
    n = len(seeds)
    alpha = ALPHA / max(family, 1)
    name = claim.metric.partition("@")[0]
    ref_median = statistics.median(values[ref][s] for s in seeds) if seeds else None
    pilot_median = statistics.median(values[ref][s] for s in pilot_pairs) if pilot_pairs else None
    chosen = chosen_lrs(records, claim, reference, lrs, pilot)
    unbracketed = {arm: problem for arm in arms(claim, reference)
                   if bracket and name in ("best_loss", "lr_sensitivity") and (problem := bracket_problem(
                       finished(records, arm), lrs, chosen_seeds, BRACKET_SPACING if name == "best_loss" else None))}
    flat = {arm: found for arm in arms(claim, reference) if name == "best_loss" and chosen_seeds and bracket
            and (found := flat_pilot(finished(records, arm), lrs, chosen_seeds))}
    # the target is fixed before the tested seeds: a relative one scales with the pilot's reference median
    scale = pilot_median if pilot_median is not None else ref_median
    to_detect = claim.effect * abs(scale) if claim.relative and scale is not None else claim.effect
    to_detect = to_detect if target is None else target  # the first rule's, where this judges the second
    planned = len(sweep_seeds - chosen_seeds) if planned is None else planned
    pilot_sd = statistics.stdev(pilot_signed) if len(pilot_signed) >= 2 else None
    pilot_bound = stats.sd_upper_bound(pilot_sd, len(pilot_signed), SD_BOUND)
    continuous = name not in BINARY
    planning = continuous and pilot_sd is not None and to_detect is not None and rule == FAILURE
    result = {"variant": claim.variant, "reference": ref, "minus": list(claim.minus) if claim.minus else None,
              "metric": claim.metric, "expect": claim.expect, "better": recipes.BETTER[name],
              "endpoint": "continuous" if continuous else "binary",
              "paper_number": claim.paper_number, "effect_source": claim.effect_source, "relative": claim.relative,
              "target_origin": claim.target_origin, "tested": claim.tested, "pilot_seeds": pilot_pairs,
              "pilot_differences": pilot_raw,
              "pilot_sd": pilot_sd, "pilot_sd_bound": pilot_bound, "control": claim.control,
              "effect_claimed": claim.effect, "p_holm": None,
              "reference_median": ref_median, "effect_to_detect": to_detect, "seeds": seeds, "n": n,
              "differences": raw, "family": family, "alpha_first_step": alpha,
              "unmeasured": sum(unmeasured(records, claim, reference, s, chosen) for s in seeds),
              "diverged": {arm: sum(failed(r) for r in records if r["variant"] == arm and r["seed"] in seeds
                                    and run_counts(r, claim.metric)) for arm in arms(claim, reference)},
              "missing": {arm: len(sweep_seeds - chosen_seeds - set(values[arm])) for arm in arms(claim, reference)},
              "arm_medians": {arm: statistics.median(values[arm][s] for s in seeds) if seeds else None
                              for arm in arms(claim, reference)},
              "chosen_lr": chosen, "unbracketed": unbracketed, "flat_pilot": flat,
              # a priori: the planned pairs at the pilot sd's upper bound (SD_BOUND), and at the estimate beside it
              # (fixed before the tested seeds ran); the second rule keeps only SECOND_KEYS, so its power is not
              # computed
              "power": stats.sign_flip_power(planned, to_detect, pilot_bound, alpha) if planning else None,
              "power_at_estimate": stats.sign_flip_power(planned, to_detect, pilot_sd, alpha) if planning else None,
              "planned_pairs": planned,
              "pairs_for_power": pairs_for_power(to_detect, pilot_bound, alpha) if planning else None,
              "power_tested": None,
              "p": None, "effect": None, "effect_ci": None, "difference": None, "difference_ci": None,
              "ci_coverage": None, "discordant": None, "mean": None, "sd": None, "mde": None}
    if n == 0:
        return result
    sign = expected_sign(claim.metric, claim.expect)
    result.update(p=float(stats.sign_flip_p(signed)), mean=statistics.fmean(signed))
    if not continuous:
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
                  # observed: from the tested pairs' own spread, shown beside the verdict, never choosing the design
                  mde=stats.minimum_detectable_effect(n, sd or 0.0, alpha, TARGET_POWER),
                  power_tested=(stats.sign_flip_power(n, to_detect, sd, alpha)
                                if sd is not None and to_detect is not None and rule == FAILURE else None))
    return result


def pairs_for_power(target, sd, alpha, most=MOST_PAIRS):
    """The fewest pairs (up to most) whose sign-flip power for target at the pilot's sd reaches TARGET_POWER, None
    where even most do not: what a pilot says the design needs."""
    for n in range(2, most + 1):
        if stats.sign_flip_power(n, target, sd, alpha) >= TARGET_POWER:
            return n
    return None


def unmeasured(records, claim, reference, seed, chosen_lr):
    """Whether every run behind every arm's value on seed failed, so that FAILURE_RULE, not a measurement, gave its
    d: the run at the claim's LR, every LR for lr_sensitivity, the arm's chosen LR for best_loss. Never for the
    metrics a failure is a measurement of (steps survived, LR reached, survived, left the plateau)."""
    name = claim.metric.partition("@")[0]
    if name in AT_FAILURE or name in BINARY:
        return False
    return all(all_failed(records, arm, seed, claim.metric, chosen_lr[arm] if chosen_lr else None)
               for arm in arms(claim, reference))


def any_failed(records, variant, seed, metric, lr=None):
    """Whether a run of the variant on seed that counts for metric (at lr, where given) failed."""
    return any(failed(r) for r in records if r["variant"] == variant and r["seed"] == seed and run_counts(r, metric)
               and (lr is None or r["lr"] == lr))


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
    target effect and whose it is; "not run yet" without pairs; "optimum not bracketed" (no verdict) where an arm's
    best LR on the pilot seeds is not an interior point of its grid (bracket_problem). Only an interval of at least
    95% coverage can exclude the target: with 5 pairs or fewer the interval is [min, max] at 1 - 2 / 2^n (2 pairs:
    50%), too little to call an effect smaller than anything. The interval must reach the family's level,
    1 - 0.05 / m (INTERVAL). Where every pair's d came from the failure rule (unmeasured), nothing was measured: not
    detected. Where the claim's arms had failed runs and SECOND_RULE reads otherwise, the verdict says it rests on
    the failure rule."""
    if not result.get("tested", True):
        return CONTROL if result.get("control") else DESCRIPTIVE
    if result["p_holm"] is None:
        return "not run yet"
    if result.get("unbracketed"):
        return "optimum not bracketed (" + "; ".join(f"{arm}: {why}" for arm, why in result["unbracketed"].items()) + \
            "): no verdict"
    text = rule_verdict(result)
    second = result.get("second_rule")
    if second and second["reading"] != reading(text):
        without = second["reading"] if second["n"] else "no pair is left"
        text += f"; rests on the failure rule (without the failed runs: {without})"
    return text


def rule_verdict(result):
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
    detected, not bracketed, not run yet, control or descriptive."""
    text = text.split("; rests on")[0]
    if text.startswith("optimum not bracketed"):
        return "not bracketed"
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
