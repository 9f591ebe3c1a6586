"""
A tested claim against its fresh-seed replicate (sweep.py --recipe=NAME --replicate, lab/recipes.Replication): the
same design on seeds the project had never run, judged by lab/claims.py as the original was, within the replicate's
own family (its tested claims, Holm-adjusted together). A claim's replicate is found by what it compares (variant,
reference, metric and any subtracted contrast), so that one replicate can hold the claims of two recipes run on the
same seeds (NormFormer's two widths).

The reading, in this order:
  "not run"                         the replicate has no p (no pairs, or no verdict: runs missing);
  "replicates"                      the original was significant (p (Holm) < 0.05) and the replicate is too, in the
                                    same direction; or neither was;
  "same direction, not significant" the original was significant, the replicate's mean d has its sign and p (Holm)
                                    >= 0.05;
  "does not replicate"              otherwise: the replicate's mean d points the other way, or it detects an effect
                                    where the original detected none.
The replicate's a-priori power comes from the original's tested pairs, a pilot of 6-16 pairs: their sd's 80% upper
bound (lab/claims.SD_BOUND), the replicate's planned pairs, the original's target and the replicate's level
(alpha / m of its family), all fixed before the replicate ran.
"""

import statistics

from lab import claims as claims_lib
from lab import recipes
from lab import stats

NOT_RUN, REPLICATES, SAME_DIRECTION, NOT_REPLICATED = ("not run", "replicates", "same direction, not significant",
                                                       "does not replicate")


def key(claim):
    """What a claim compares: (variant, reference, metric, the subtracted contrast or None)."""
    return claim["variant"], claim["reference"], claim["metric"], tuple(claim["minus"]) if claim["minus"] else None


def significant(claim):
    """+1 or -1, the sign of a tested claim's mean d where p (Holm) < 0.05; 0 where it is not significant."""
    if claim["p_holm"] is None or claim["p_holm"] >= claims_lib.ALPHA or not claim["effect"]:
        return 0
    return 1 if claim["effect"] > 0 else -1


def reading(original, replicate):
    """The replicate's reading of the original claim (the module docstring's rules, in their order)."""
    if replicate is None or replicate["p_holm"] is None or replicate.get("reading") == "no verdict":
        return NOT_RUN
    first, again = significant(original), significant(replicate)
    if first == again:
        return REPLICATES
    if first and not again and replicate["effect"] is not None and replicate["effect"] * first > 0:
        return SAME_DIRECTION
    return NOT_REPLICATED


def power(original, replicate):
    """The replicate's a-priori power for the original's target: its planned pairs at the level of its family's
    first Holm step, the differences spread as the original's tested pairs' sd's upper bound; None where the
    original has no sd or no target."""
    bound = stats.sd_upper_bound(original.get("sd"), original["n"], claims_lib.SD_BOUND)
    if bound is None or original["effect_to_detect"] is None or original["endpoint"] != "continuous":
        return None
    return stats.sign_flip_power(replicate["planned_pairs"], original["effect_to_detect"], bound,
                                 replicate["alpha_first_step"])


def replicates_by_key(replications):
    """{claim key: (the replicate's summary, its claim)} over every replicate summary."""
    return {key(c): (summary, c) for summary in replications for c in summary["claims"]}


def post_hoc(claim, originals):
    """A claim that only a replicate tests (NormFormer's width interaction), judged on the original seeds that every
    one of its arms ran, from the original recipes' runs together, each arm at the LR its replicate reads (its
    original pilot's pick): descriptive, as the original seeds suggested the claim. None where an arm has no
    original runs."""
    arms = [claim["variant"], claim["reference"], *(claim["minus"] or ())]
    found = [s for s in originals if set(arms) & set(s["recipe"]["variants"])]
    if not found or not set(arms) <= {a for s in found for a in s["recipe"]["variants"]}:
        return None
    runs = [r for s in found for r in s["runs"] if r["variant"] in arms]
    pilot = found[0]["recipe"]["pilot"]
    fixed = recipes.RECIPES[found[0]["recipe"]["name"]].replication.best_lrs
    fields = ("variant", "metric", "expect", "paper_number", "effect_source", "target_origin", "relative", "reference")
    as_claim = recipes.Claim(**{k: claim[k] for k in fields}, effect=claim["effect_claimed"],
                             minus=tuple(claim["minus"]), tested=False)
    # pair_up keeps the seeds every arm ran: the tested seeds the two recipes share
    return claims_lib.judge(runs, [as_claim], claim["reference"], sorted({r["lr"] for r in runs}, key=float), pilot,
                            None, fixed)[0]


def lr_check(summary):
    """The grid check of a replicate (recipes.Replication.lr_check): per arm, its median final loss over the check
    seeds at its chosen LR and at each neighbour, and the grid's error, how much lower the best neighbour's median
    is (0 where the chosen LR is the best of the three): [(arm, chosen LR, {lr: median}, error)]."""
    recipe = summary["recipe"]
    check = recipe.get("check_lrs") or {}
    seeds = set(recipe["seed_list"][:recipe.get("check_seeds", 0)])
    rows = []
    for arm, neighbours in check.items():
        chosen = recipe["best_lrs"][arm]
        medians = {}
        for lr in sorted([chosen, *neighbours], key=float):
            losses = [r["final_loss_capped"] for r in summary["runs"] if r["variant"] == arm and r["lr"] == lr
                      and r["seed"] in seeds and r["final_loss_capped"] is not None]
            if losses:
                medians[lr] = statistics.median(losses)
        best = min(medians.values()) if medians else None
        error = medians[chosen] - best if chosen in medians else None
        rows.append((arm, chosen, medians, error))
    return rows
