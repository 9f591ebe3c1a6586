"""
The paired statistics of a recipe's claims, over seeds: the exact two-sided sign-flip permutation test, Holm's
step-down adjustment, the Hodges-Lehmann estimate with its confidence interval, and the power and minimum detectable
effect of a design by Monte Carlo.
"""

import functools
import itertools
import math
import statistics

import numpy as np

POWER_SIMULATIONS = 4000
POWER_SEED = 0  # the simulated designs are the same at every call: a page generated twice shows the same power


@functools.lru_cache(maxsize=None)
def sign_patterns(n):
    """Every assignment of signs to n paired differences: a 2^n x n array of +-1."""
    return np.array(list(itertools.product((1.0, -1.0), repeat=n)))


def sign_flip_p(diffs):
    """Exact two-sided p of the paired sign-flip permutation test: the share of the 2^n sign assignments whose
    |sum| is at least the observed |sum| (under no difference each difference is as likely negative as positive)."""
    d = np.asarray(diffs, dtype=float)
    if d.size == 0 or not np.all(np.isfinite(d)):
        raise ValueError("the sign-flip test needs at least one difference, all finite")
    sums = np.abs(sign_patterns(d.size) @ d)
    # a relative tolerance: sums equal in exact arithmetic may differ in the last bits
    return float(np.mean(sums >= abs(d.sum()) * (1 - 1e-12)))


def holm(ps):
    """Holm's step-down adjusted p-values, in the order given: the k-th smallest p times (m - k + 1), kept
    non-decreasing, at most 1."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adjusted, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def hodges_lehmann(diffs, confidence=0.95):
    """The Hodges-Lehmann estimate of a paired shift (the median of the Walsh averages (d_i + d_j) / 2, i <= j) and
    its confidence interval from the exact distribution of Wilcoxon's signed-rank statistic: (estimate, low, high).
    With too few pairs for the confidence asked, the interval is the range of the Walsh averages."""
    d = sorted(float(x) for x in diffs)
    n = len(d)
    walsh = sorted((d[i] + d[j]) / 2 for i in range(n) for j in range(i, n))
    # the exact null distribution of W+ (the sum of the ranks with a positive sign): counts by subset sum
    counts = [1] + [0] * (n * (n + 1) // 2)
    for rank in range(1, n + 1):
        for total in range(len(counts) - 1, rank - 1, -1):
            counts[total] += counts[total - rank]
    tail = (1 - confidence) / 2
    k, cumulative = 0, counts[0] / 2 ** n
    while cumulative <= tail:  # ends at the smallest k with P(W+ <= k) > tail
        k += 1
        cumulative += counts[k] / 2 ** n
    # Hollander and Wolfe §3.3: drop the c = k - 1 smallest and largest Walsh averages, P(W+ <= c) <= tail
    drop = min(max(k - 1, 0), (len(walsh) - 1) // 2)
    return statistics.median(walsh), walsh[drop], walsh[-1 - drop]


@functools.lru_cache(maxsize=None)
def _power_of_standardized(n, shift, alpha):
    """Power of the sign-flip test at level alpha for n pairs drawn from Normal(shift, 1)."""
    rng = np.random.default_rng(POWER_SEED)
    draws = rng.standard_normal((n, POWER_SIMULATIONS)) + shift
    sums = np.abs(sign_patterns(n) @ draws)
    p = np.mean(sums >= np.abs(draws.sum(0)) * (1 - 1e-12), axis=0)
    return float(np.mean(p < alpha))


def power(n, sd, delta, alpha):
    """The probability that the exact sign-flip test at level alpha detects a true mean paired difference delta
    with n pairs whose differences spread with standard deviation sd (normal), by Monte Carlo."""
    if n < 1:
        return 0.0
    if sd == 0:
        return 1.0 if delta != 0 and 2 / 2 ** n < alpha else 0.0
    return _power_of_standardized(n, round(abs(delta) / sd, 6), alpha)


def mde(n, sd, alpha, target=0.8):
    """The minimum detectable effect: the smallest true mean paired difference the design detects with
    probability `target` (power), in the units of sd; inf where no effect can reach it (2 / 2^n >= alpha)."""
    if n < 1 or 2 / 2 ** n >= alpha:
        return math.inf
    if sd == 0:
        return 0.0
    low, high = 0.0, 1.0
    while _power_of_standardized(n, round(high, 6), alpha) < target:
        low, high = high, high * 2
    for _ in range(16):  # to 1/2^16 of the bracket
        middle = (low + high) / 2
        if _power_of_standardized(n, round(middle, 6), alpha) < target:
            low = middle
        else:
            high = middle
    return high * sd
