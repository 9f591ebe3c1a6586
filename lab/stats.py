"""
The statistics that judge a claim: exact tests, Holm's correction, effects with intervals, and power.

Paired by seed (every run scored on the same evaluation windows, train.py): the seed-by-seed differences
d_i = variant_i - reference_i go to an exact two-sided sign-flip permutation test of their mean (under no effect
each d_i is as likely to be -d_i); the effect is that mean, its interval the set of shifts the same test does not
reject (the order statistics of the 2^n - 1 subset means, Hartigan 1969), and its direction the sign of the mean,
so test, estimate, interval and verdict read one statistic. A binary endpoint (a run survived, left the plateau)
is the same test on differences in {-1, 0, 1}: the exact McNemar test, a sign test on the discordant pairs;
unpaired, Fisher's exact test. The exact Wilcoxon signed-rank test and the Hodges-Lehmann estimates cross-check
and serve the unpaired rows: the exact Mann-Whitney permutation test and the Hodges-Lehmann shift. The p-values of a
recipe's claims are Holm-corrected together; a claim the test does not detect is reported with the observed minimum
detectable effect of its pairs (Monte Carlo power of the sign-flip test). Exact p-values are Fractions.
References: Hartigan 1969, "Using subsample values as typical values" (JASA 64), Theorem 1; Hollander, Wolfe &
Chicken, Nonparametric Statistical Methods (3rd ed.), §3.1-3.2 (signed-rank test, Hodges-Lehmann estimate and
interval), §4.1-4.3 (rank-sum test, shift); Agresti, Categorical Data Analysis (3rd ed.), §3.5.1 (Fisher's exact
test), §11.1 (McNemar's test); Holm 1979, "A simple sequentially rejective multiple test procedure".
"""

import math
import statistics
from fractions import Fraction
from itertools import combinations

import numpy as np

ALPHA = 0.05
POWER = 0.8  # the power at which the minimum detectable effect is read


def finite(values, what):
    values = [float(v) for v in values]
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"{what} must be finite (a diverged run's inf has no difference; compare it unpaired, "
                         "by ranks)")
    return values


# Paired by seed

def exact_integers(values):
    """values (floats) as integers with one common scale: a float is a binary fraction, so these are exact and
    the sign-flip sums below compare without rounding."""
    fractions = [Fraction(v) for v in values]
    scale = math.lcm(*(f.denominator for f in fractions)) if fractions else 1
    return [int(f * scale) for f in fractions]


def sign_flip_p(differences):
    """Exact two-sided p of the paired sign-flip permutation test, as a Fraction: the share of the 2^n ways to
    flip the signs of the n differences whose sum is at least as far from 0 as the observed sum. (A flip set S
    turns the sum T into T - 2 sum_S d_i; the subset sums are enumerated, so n up to about 20.)"""
    d = exact_integers(finite(differences, "paired differences"))
    if not d:
        raise ValueError("the sign-flip test needs at least one paired difference")
    total = sum(d)
    subset_sums = [0]
    for value in d:
        subset_sums += [s + value for s in subset_sums]
    hits = sum(abs(total - 2 * s) >= abs(total) for s in subset_sums)
    return Fraction(hits, 2 ** len(d))


def smallest_sign_flip_p(n):
    """The smallest p the sign-flip test gives with n pairs: all flipped or none, 2 / 2^n."""
    return Fraction(2, 2 ** n)


def wilcoxon_p(differences):
    """Exact two-sided p of the Wilcoxon signed-rank test (scipy), for cross-checking the sign-flip test."""
    from scipy.stats import wilcoxon  # lab only: train.py never needs scipy
    return float(wilcoxon(finite(differences, "paired differences"), method="exact").pvalue)


def signed_rank_counts(n):
    """counts[t]: how many of the 2^n sign patterns give the signed-rank statistic T+ = t, t = 0 .. n(n+1)/2 (the
    number of subsets of {1, .., n} summing to t)."""
    counts = [1] + [0] * (n * (n + 1) // 2)
    for rank in range(1, n + 1):
        for t in range(len(counts) - 1, rank - 1, -1):
            counts[t] += counts[t - rank]
    return counts


def order_statistic_interval(sorted_values, counts, alpha):
    """[v_(k), v_(N+1-k)] of N sorted values, k the largest with P(S <= k - 1) <= alpha / 2 under the null
    distribution counts of the matching rank statistic S (Hollander, Wolfe & Chicken §3.3 and §4.3), and its
    exact coverage 1 - 2 P(S <= k - 1). Where even k = 1 is too wide for 1 - alpha, k = 1 and the coverage
    it reaches is returned (the interval is then [min, max])."""
    total, below, k = sum(counts), 0, 0  # below: total x P(S <= k - 1)
    while 2 * (below + counts[k]) <= alpha * total:  # k + 1 is allowed too
        below += counts[k]
        k += 1
    if k == 0:
        k, below = 1, counts[0]  # even [min, max] covers less than 1 - alpha
    return sorted_values[k - 1], sorted_values[-k], 1 - 2 * below / total


def hodges_lehmann_paired(differences, alpha=ALPHA):
    """The Hodges-Lehmann estimate of the paired difference, the median of the n(n+1)/2 Walsh averages
    (d_i + d_j) / 2, i <= j, and its distribution-free interval from the sorted Walsh averages and the exact
    signed-rank distribution: {"estimate", "low", "high", "confidence"} (confidence: the interval's exact
    coverage, 1 - alpha or more where n allows it)."""
    d = finite(differences, "paired differences")
    walsh = sorted((d[i] + d[j]) / 2 for i in range(len(d)) for j in range(i, len(d)))
    low, high, confidence = order_statistic_interval(walsh, signed_rank_counts(len(d)), alpha)
    return {"estimate": statistics.median(walsh), "low": low, "high": high, "confidence": confidence}


def subset_means(differences):
    """The means of the 2^n - 1 nonempty subsets of the differences, sorted, as exact Fractions."""
    sums = [(Fraction(0), 0)]  # (sum, size) of every subset; a float is a binary fraction, so these are exact
    for value in finite(differences, "paired differences"):
        sums += [(total + Fraction(value), size + 1) for total, size in sums]
    return sorted(total / size for total, size in sums[1:])


def mean_interval(differences, alpha=ALPHA):
    """The mean of the paired differences and the interval of the shifts theta that the two-sided sign-flip test
    of d - theta does not reject at p < alpha: [m_(k), m_(N+1-k)] of the N = 2^n - 1 sorted subset means,
    {"estimate", "low", "high", "confidence"}. Flipping a set S of d - theta leaves the sum at least as far out
    exactly when the mean of S lies on the far side of theta, so p(theta) counts subset means (the interval is the
    test inverted, for any data, ties included), and for differences symmetric about theta the 2^n gaps between
    the subset means each hold theta with probability 1 / 2^n (Hartigan 1969, Theorem 1): the number S of subset
    means below theta is uniform on 0 .. 2^n - 1, so the interval's coverage is exactly 1 - 2k / 2^n (6 pairs:
    [min, max], 1 - 2/64 = 96.9%; 8 pairs: 1 - 12/256 = 95.3%), never less for symmetric differences."""
    means = subset_means(differences)
    low, high, confidence = order_statistic_interval(means, [1] * (len(means) + 1), alpha)
    return {"estimate": statistics.fmean(finite(differences, "paired differences")), "low": float(low),
            "high": float(high), "confidence": confidence}


# Unpaired

def doubled_ranks(values):
    """2 x the rank of each value among all (1-based), ties sharing their mean rank: 2 x a midrank is an
    integer, so the rank sums below are compared exactly. inf ranks above every finite value and ties with inf."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for i in order[start:end + 1]:
            ranks[i] = start + end + 2  # 2 x the mean of the 1-based ranks start+1 .. end+1
        start = end + 1
    return ranks


def permutation_p(a, b):
    """Exact two-sided p-value of the Mann-Whitney U test, as a Fraction: over all C(n+m, n) ways to relabel the
    pooled values as n "a" and m "b", the share whose rank sum of a is at least as far from its mean under no
    difference, n (n+m+1) / 2, as the observed one. Ties use midranks and stay in the relabelings as observed
    (the exact conditional test), so two diverged runs with equal values are handled exactly."""
    values = [float(v) for v in [*a, *b]]
    if any(math.isnan(v) for v in values):
        raise ValueError("a NaN has no rank; count a diverged run as inf (the worst value), not NaN")
    n, total = len(a), len(values)
    if n == 0 or n == total:
        raise ValueError("each side needs at least one value")
    ranks = doubled_ranks(values)
    center = n * (total + 1)  # 2 x the mean rank sum of a
    observed = abs(sum(ranks[:n]) - center)
    hits = sum(abs(sum(ranks[i] for i in chosen) - center) >= observed for chosen in combinations(range(total), n))
    return Fraction(hits, math.comb(total, n))


def fisher_p(a_yes, a_n, b_yes, b_n):
    """Exact two-sided p of Fisher's test of a binary endpoint in two unpaired samples (a_yes of a_n against b_yes
    of b_n), as a Fraction: given the margins, a's count of yes is hypergeometric; p sums the probabilities of
    every count no more likely than the observed one (Agresti §3.5.1, and scipy's fisher_exact)."""
    yes, total = a_yes + b_yes, a_n + b_n
    if not (0 <= a_yes <= a_n and 0 <= b_yes <= b_n) or a_n == 0 or b_n == 0:
        raise ValueError("each side needs at least one run, and its yes count from 0 to its runs")
    ways = {x: math.comb(yes, x) * math.comb(total - yes, a_n - x)
            for x in range(max(0, a_n - (total - yes)), min(yes, a_n) + 1)}
    return Fraction(sum(w for w in ways.values() if w <= ways[a_yes]), math.comb(total, a_n))


def smallest_p(n, m):
    """The smallest p the test can give with n and m values a side: the two complete separations."""
    return Fraction(2, math.comb(n + m, n))


def rank_sum_counts(n, m):
    """counts[u]: how many of the C(n+m, n) labelings give the Mann-Whitney statistic U = u, u = 0 .. nm
    (the coefficients of the Gaussian binomial [n+m choose n], by the recurrence on the largest value's side)."""
    table = {(0, j): [1] for j in range(m + 1)}
    for i in range(1, n + 1):
        table[(i, 0)] = [1]
        for j in range(1, m + 1):
            # the largest value is an "a" (it beats all j b's: U grows by j) or a "b" (U unchanged)
            with_a, with_b = [0] * j + table[(i - 1, j)], table[(i, j - 1)]
            size = max(len(with_a), len(with_b))
            table[(i, j)] = [(with_a[u] if u < len(with_a) else 0) + (with_b[u] if u < len(with_b) else 0)
                             for u in range(size)]
    return table[(n, m)]


def hodges_lehmann_shift(a, b, alpha=ALPHA):
    """The Hodges-Lehmann shift of a over b, the median of the n m differences a_i - b_j, and its
    distribution-free interval from the sorted differences and the exact Mann-Whitney distribution:
    {"estimate", "low", "high", "confidence"}, as hodges_lehmann_paired."""
    a, b = finite(a, "values"), finite(b, "values")
    if not a or not b:
        raise ValueError("each side needs at least one value")
    shifts = sorted(x - y for x in a for y in b)
    low, high, confidence = order_statistic_interval(shifts, rank_sum_counts(len(a), len(b)), alpha)
    return {"estimate": statistics.median(shifts), "low": low, "high": high, "confidence": confidence}


# A family of claims

def holm(p_values):
    """Holm's step-down adjusted p-values, in the order given: sorted ascending, the i-th (from 1) of m becomes
    max over j <= i of min(1, (m - j + 1) p_(j)), so they never decrease along the sorted order and a claim is
    significant at level alpha after correction iff its adjusted p < alpha (Holm 1979)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted, running = [None] * m, 0
    for step, i in enumerate(order):
        running = max(running, min(1, (m - step) * p_values[i]))
        adjusted[i] = running
    return adjusted


# Power of the paired design

def sign_matrix(n):
    """All 2^n sign patterns of n pairs, one a row, as a float array."""
    bits = (np.arange(2 ** n)[:, None] >> np.arange(n)) & 1
    return 1.0 - 2.0 * bits


def sd_upper_bound(sd, n, confidence=0.8):
    """The one-sided upper confidence bound of a standard deviation estimated from n normal values: sd x
    sqrt((n - 1) / chi2_(1 - confidence)(n - 1)), chi2_q the q quantile of chi-square with n - 1 degrees of freedom
    ((n - 1) s^2 / sigma^2 is chi-square; e.g. Sheskin, Handbook of Parametric and Nonparametric Statistical
    Procedures, Test 3). At 80%: 2.12x the estimate from 3 values, 1.46x from 6, 1.21x from 16. None below 2 values."""
    from scipy.stats import chi2  # lab only: train.py never needs scipy
    if sd is None or n < 2:
        return None
    return sd * math.sqrt((n - 1) / chi2.ppf(1 - confidence, n - 1))


def sign_flip_power(n, delta, sd, alpha=ALPHA, trials=2000, seed=0):
    """The probability that the two-sided sign-flip test of n pairs finds p < alpha when the paired differences
    are normal with mean delta and standard deviation sd (the pilot's, for the a-priori power), by Monte Carlo:
    `trials` designs drawn from a fixed rng seed, the same standard normal draws for every delta, so power grows
    smoothly with delta. For a claim among m Holm-corrected ones pass alpha / m: the level of Holm's first step, so
    the power it gives is a lower bound for every claim. 0 where the smallest attainable p, 2 / 2^n, is not below
    alpha."""
    if smallest_sign_flip_p(n) >= alpha:
        return 0.0
    z = np.random.default_rng(seed).standard_normal((trials, n))
    signs = sign_matrix(n)
    hits = 0
    for chunk in np.array_split(delta + sd * z, max(1, trials * 2 ** n // 2 ** 22)):  # 32 MB of sums at a time
        sums = np.abs(chunk @ signs.T)  # every flip's |sum|, a row per design
        observed = np.abs(chunk.sum(axis=1, keepdims=True))
        # relative tolerance: the all-flipped pattern gives exactly -observed, summed in another order
        p = (sums >= observed * (1 - 1e-9)).mean(axis=1)
        hits += int((p < alpha).sum())
    return hits / trials


def minimum_detectable_effect(n, sd, alpha=ALPHA, power=POWER, trials=2000, seed=0, tolerance=1e-3):
    """The smallest mean paired difference delta whose sign-flip power with n pairs reaches `power`, by bisection
    on delta (to tolerance x sd); inf where the test cannot reach alpha with n pairs."""
    if smallest_sign_flip_p(n) >= alpha:
        return math.inf
    return smallest_powerful_effect(lambda delta: sign_flip_power(n, delta, sd, alpha, trials, seed), sd, power,
                                    tolerance)


def smallest_powerful_effect(power_at, sd, power=POWER, tolerance=1e-3):
    """The smallest delta with power_at(delta) >= power (power_at grows with delta), by doubling and bisection to
    tolerance x sd."""
    if sd == 0:
        return 0.0
    low, high = 0.0, sd
    while power_at(high) < power:
        low, high = high, 2 * high
    while high - low > tolerance * sd:
        middle = (low + high) / 2
        low, high = (low, middle) if power_at(middle) >= power else (middle, high)
    return high


# Power of the unpaired design

def rank_sum_power(n, m, delta, sd, alpha=ALPHA, trials=2000, seed=0):
    """The probability that the exact two-sided Mann-Whitney test finds p < alpha when n values are normal with
    mean delta and m with mean 0, both with standard deviation sd, by Monte Carlo as sign_flip_power: continuous
    draws have no ties, so each design's p is read from the exact null distribution of U (rank_sum_counts)."""
    counts = np.array(rank_sum_counts(n, m), dtype=float)
    distance = np.abs(np.arange(len(counts)) - n * m / 2)
    p_of_u = np.array([counts[distance >= d].sum() for d in distance]) / counts.sum()
    z = np.random.default_rng(seed).standard_normal((trials, n + m))
    a, b = delta + sd * z[:, :n], sd * z[:, n:]
    u = (a[:, :, None] > b[:, None, :]).sum(axis=(1, 2))  # U: the pairs (a_i, b_j) with a_i > b_j
    return float((p_of_u[u] < alpha).mean())


def rank_sum_mde(n, m, sd, alpha=ALPHA, power=POWER, trials=2000, seed=0, tolerance=1e-3):
    """The smallest shift of n values over m whose Mann-Whitney power reaches `power`; inf where the test cannot
    reach alpha with n and m values."""
    if smallest_p(n, m) >= alpha:
        return math.inf
    return smallest_powerful_effect(lambda delta: rank_sum_power(n, m, delta, sd, alpha, trials, seed), sd, power,
                                    tolerance)


def verdict(p_holm, effect, expect, mde, alpha=ALPHA, interval=None, target=None, whose="the paper's"):
    """A claim's verdict, one of four readings, in this order:
      "disagrees"     Holm-adjusted p < alpha and the effect against the paper's direction;
      "smaller than"  the interval's end on the paper's side falls short of the target effect (interval: [low, high]
                      of the effect, target > 0 in the paper's direction): the target is excluded, whether or not
                      the effect was detected ("detected in its direction" or "not detected" says which);
      "agrees"        Holm-adjusted p < alpha and the effect in the paper's direction (its interval reaching the
                      target where one is given);
      "not detected"  otherwise, with the minimum detectable effect of the design: "too noisy to tell".
    A zero effect has no direction, so it never agrees or disagrees. effect: the variant's estimated difference
    from the reference; expect: "positive" or "negative", its sign in the paper; whose: whose target it is, "the
    paper's" or "nanonorm's target" (a choice where the paper gives no number)."""
    if expect not in ("positive", "negative"):
        raise ValueError(f"expect={expect!r}: the paper's direction is 'positive' or 'negative'")
    toward = effect if expect == "positive" else -effect  # the effect in the paper's direction
    detected = p_holm < alpha and toward != 0
    if detected and toward < 0:
        return "disagrees"
    if interval is not None and target is not None:
        reach = max(interval) if expect == "positive" else -min(interval)  # the interval's end on the paper's side
        if reach < target:
            how = "detected in its direction" if detected else "not detected"
            return f"smaller than {whose} ({how}; the interval ends at {reach:.3g}, short of {target:.3g})"
    if detected:
        return "agrees"
    if math.isinf(mde):
        return "not detected (no effect is detectable with these seeds)"
    if math.isnan(mde):
        return "not detected (the spread, and so the minimum detectable effect, is unknown)"
    if mde == 0:  # no spread at all: with enough seeds only identical arms are not detected
        return "not detected (no difference on any seed)"
    return f"not detected (observed minimum detectable effect {mde:.3g})"
