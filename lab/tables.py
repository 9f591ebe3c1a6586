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
