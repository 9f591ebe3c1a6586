"""
The text of a summary's numbers, one rule for every table that shows them: sweep.py's Markdown tables and
summary.csv, and the results page (docs/experiments.md). A NaN, or an infinity that is not a diverged run's loss,
is never printed as a number: it reads "n/a".
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
    if isinstance(value, float) and not math.isfinite(value) and not plain:
        return "n/a"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def finite_number(value):
    return isinstance(value, (int, float)) and math.isfinite(value)


def known(value):
    """value where it is a finite number, else None."""
    return value if finite_number(value) else None


def side_text(side):
    """One side of a comparison: median [min, max], n seeds."""
    return f"{value_text(side['median'])} [{value_text(side['min'])}, {value_text(side['max'])}], n = {side['n']}"


def signed(value):
    """A number to 3 significant digits with its sign: +0.0213, -1.2."""
    return "n/a" if known(value) is None else f"{value:+.3g}"


def interval_text(estimate, interval):
    """An estimate and its confidence interval: "+0.0213 [+0.004, +0.035]"; the estimate alone without one (a
    binary endpoint)."""
    if known(estimate) is None:
        return "n/a"
    if interval is None:
        return signed(estimate)
    return f"{signed(estimate)} [{signed(interval[0])}, {signed(interval[1])}]"


def p_value_text(p):
    return "n/a" if known(p) is None else f"{p:.3g}"


def power_text(power):
    return "n/a" if known(power) is None else f"{power:.0%}"


def mde_text(mde):
    """The minimum detectable effect; inf where too few pairs can reach the level at all."""
    if mde is not None and math.isinf(mde):
        return "none reachable"
    return value_text(known(mde))


def coverage_text(coverage):
    """An interval's achieved coverage, "96.9%" (a discrete test's interval is rarely exactly 95%)."""
    return "n/a" if known(coverage) is None else f"{coverage:.1%}"


def whose_text(claim):
    return "nanonorm's choice" if claim.get("target_origin") == "nanonorm" else "the paper's"


def metric_unit(metric):
    """The unit of a claim's metric on the CPU recipes (byte tokens: a loss is in nats per byte)."""
    name = metric.partition("@")[0]
    return {"steps_survived": "steps", "peak_lr": "LR", "final_loss": "nats per byte", "best_loss": "nats per byte",
            "lr_sensitivity": "nats per byte", "spikes": "spikes a run", "attn_logit_max": "logit",
            "log_z": "nats", "grad_ratio": "|ln ratio|", "fc2_grad_ratio": "|ln ratio|",
            "left_plateau": "share of runs", "survived": "share of runs"}[name]


def target_value_text(claim):
    """The target effect in the metric's unit and whose it is: "0.009 nats per byte (the paper's)"."""
    return f"{value_text(known(claim['effect_to_detect']))} {metric_unit(claim['metric'])} ({whose_text(claim)})"


def target_text(claim):
    """The effect the design is powered for, in the metric's unit, whose it is, and its source."""
    text = target_value_text(claim)
    if claim["relative"]:
        text += f", {claim['effect_claimed']:.0%} of the reference's median"
    return f"{text}: {claim['effect_source']}"


def metric_label(metric):
    """A claim's metric in words (no "|": the label goes into Markdown tables)."""
    name, _, lr = metric.partition("@")
    return {"steps_survived": f"steps survived, LR ramp to {lr}", "peak_lr": f"LR reached, ramp to {lr}",
            "final_loss": f"final val loss at LR {lr}", "best_loss": "final val loss, each at its best LR",
            "spikes": f"loss spikes at LR {lr}", "attn_logit_max": f"max attention logit at the end, LR {lr}",
            "log_z": f"abs(mean log Z) at the end, LR {lr}",
            "lr_sensitivity": "LR sensitivity (Wortsman et al.), nats",
            "left_plateau": f"left the unigram plateau, LR {lr}", "survived": f"survived, LR {lr}",
            "grad_ratio": f"abs ln(layer 0 / last layer gradient L2 norm), LR {lr}",
            "fc2_grad_ratio": f"abs ln(layer 0 / last layer mean abs grad of fc2), LR {lr}"}[name]


def chosen_lr_text(claim):
    """For a claim read at each arm's best LR: the LR each arm was read at ("" for other claims)."""
    chosen = claim.get("chosen_lr")
    if not chosen:
        return ""
    return " (read at: " + ", ".join(f"{arm} {lr}" for arm, lr in chosen.items()) + ")"


def comparison_text(claim):
    """"nf_normformer vs nf_baseline" or, for an interaction, "(a vs b) - (c vs d)"."""
    text = f"{claim['variant']} vs {claim['reference']}"
    if claim["minus"]:
        text = f"({text}) - ({claim['minus'][0]} vs {claim['minus'][1]})"
    return f"{text}, expected {claim['expect']}"


def claims_table(claims):
    """A recipe's claims with every number its verdict rests on."""
    lines = ["| comparison | metric | the paper's number | target effect (unit, whose: source) | effect: mean d "
             "[interval] (+: the paper's direction) | variant - reference [interval] | interval's coverage | n pairs "
             "| p | p (Holm) | a-priori power for the target (pilot sd's 80% upper bound) | observed MDE (80% power) | "
             "verdict |",
             "|" + "---|" * 13]
    for c in claims:
        lines.append(f"| {comparison_text(c)} | {metric_label(c['metric'])}{chosen_lr_text(c)} | {c['paper_number']} | "
                     f"{target_text(c)} | {interval_text(c['effect'], c['effect_ci'])} | "
                     f"{interval_text(c['difference'], c['difference_ci'])} | {coverage_text(c.get('ci_coverage'))} | "
                     f"{c['n']} | {p_value_text(c['p'])} | {p_value_text(c['p_holm'])} | {power_text(c['power'])} | "
                     f"{mde_text(c['mde'])} | {c['verdict']} |")
    return "\n".join(lines)
