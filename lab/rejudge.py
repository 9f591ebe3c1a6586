"""
A recipe's record judged again by lab/claims.py as it stands, from the record's own runs and the design it recorded
(its claims, LRs, reference, seeds and pilot, not lab/recipes.py's): the runs are the data, fixed once they ran; how
they are reported (the power's bound, the intervals' words) is code that may improve after them. The tests, the
failure rule and the verdicts' rules are the design's: a record whose recorded test, interval or failure rule differs
from lab/claims.py's is refused, so that re-judging never changes how a claim was decided. The record's recipe, and
so its design hash, stay as the runs recorded them.
    python -m lab.rejudge docs/experiments/records/*.json
rewrites each record in place (atomically) and says which claims' numbers moved; then
    python plot.py --experiments=docs/experiments/records --out=docs
"""

import json
import sys

from engine import files
from engine import flags
from engine.flags import UsageError
from lab import claims as claims_lib
from lab import recipes
from lab import schema


def recorded_claims(recipe):
    """The recipes.Claim objects a record's recipe holds (recipes.describe writes them as dicts)."""
    return [recipes.Claim(**{**c, "minus": tuple(c["minus"]) if c.get("minus") else None}) for c in recipe["claims"]]


def rejudge(summary):
    """The summary with its claims judged again (lab/claims.judge) on its runs, as sweep.py judged them: after the
    pilot seeds, planned pairs the tested seeds, a replicate's best_loss arms at the LRs its design fixed."""
    recipe = summary["recipe"]
    replicate = recipe.get("stage") == recipes.REPLICATION
    pilot = recipe.get("pilot", 0)
    judged = claims_lib.judge(summary["runs"], recorded_claims(recipe), recipe["reference"], recipe["lrs"], pilot,
                              len(recipe["seed_list"]) - pilot, recipe.get("best_lrs") if replicate else None)
    withheld = summary.get("no_verdict")
    for claim in judged if withheld else []:
        claim.update(verdict=f"no verdict ({withheld})", reading="no verdict")
    return {**summary, "claims": judged}


def same_rules(path, summary):
    """A UsageError where the record's test, interval or failure rule is not lab/claims.py's: judged again, its
    claims would be decided by rules its design did not fix."""
    design = summary["recipe"]["design"]
    for key, now in (("test", claims_lib.TEST), ("interval", claims_lib.INTERVAL),
                     ("failure_rule", claims_lib.FAILURE_RULE)):
        if design.get(key) != now:
            raise UsageError(f"{path}: its {key.replace('_', ' ')} is not lab/claims.py's; a record is re-judged "
                             "only under the rules its design fixed")


def moved(old, new):
    """The keys of a claim whose values re-judging changed."""
    return sorted(k for k in new if json.dumps(old.get(k), sort_keys=True) != json.dumps(new[k], sort_keys=True))


def main(argv):
    if flags.wants_help(argv) or not argv:
        print(__doc__.strip())
        return 0 if argv else 2
    try:
        summaries = [(path, schema.read_summary(path)) for path in argv]
        for path, summary in summaries:
            if not summary.get("recipe"):
                raise UsageError(f"{path}: not a recipe's summary (no recipe); give docs/experiments/records/*.json")
            if summary["recipe"].get("name") not in recipes.RECIPES:
                raise UsageError(f"{path}: its recipe is not in lab/recipes.py; one of {', '.join(recipes.RECIPES)}")
            same_rules(path, summary)
        for path, summary in summaries:
            new = rejudge(summary)
            changes = sorted({k for old, c in zip(summary["claims"], new["claims"]) for k in moved(old, c)})
            files.write_atomic(path, json.dumps(new, indent=1).encode())
            print(f"{path}: {', '.join(changes) if changes else 'unchanged'}")
    except UsageError as e:
        return flags.fail("lab/rejudge.py", e)
    except files.WriteError as e:
        print(f"lab/rejudge.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
