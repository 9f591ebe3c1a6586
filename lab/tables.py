"""
The text of a summary's numbers, one rule for every table that shows them: sweep.py's Markdown tables and
summary.csv, and the results page (docs/experiments.md).
"""

import math


def value_text(value, plain=False):
    """A number to 4 significant digits. None is "n/a" and +inf (a diverged run's loss, the worst value) "diverged";
    plain (summary.csv and the Markdown table printed beside it, cells a spreadsheet reads as numbers): "" and
    "inf"."""
    if value is None:
        return "" if plain else "n/a"
    if value == math.inf and not plain:
        return "diverged"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def side_text(side):
    """One side of a comparison: median [min, max], n seeds."""
    return f"{value_text(side['median'])} [{value_text(side['min'])}, {value_text(side['max'])}], n = {side['n']}"


def signed(value):
    """A number to 3 significant digits with its sign: +0.0213, -1.2."""
    return "n/a" if value is None else f"{value:+.3g}"


def interval_text(estimate, interval):
    """An estimate and its confidence interval: "+0.0213 [+0.004, +0.035]"."""
    if estimate is None:
        return "n/a"
    return f"{signed(estimate)} [{signed(interval[0])}, {signed(interval[1])}]"


def p_value_text(p):
    return "n/a" if p is None else f"{p:.3g}"


def power_text(power):
    return "n/a" if power is None else f"{power:.0%}"


def mde_text(mde):
    """The minimum detectable effect; inf where too few pairs can reach the level at all."""
    if mde is not None and math.isinf(mde):
        return "none reachable"
    return value_text(mde)
