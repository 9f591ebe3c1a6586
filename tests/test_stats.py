"""lab/stats.py: every exact p-value, Holm's adjustment and interval against cases enumerated by hand, the interval of
the mean against the sign-flip test it inverts (brute force) and its coverage by simulation, the sign-flip test
against scipy's exact Wilcoxon, McNemar and Fisher tests, and the Monte Carlo power against the t-test's."""

import itertools
import math
import statistics
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats as scipy_stats

from lab import stats


# The paired sign-flip test

def test_sign_flip_p_three_pairs_by_hand():
    # d = 1, 2, 3, sum 6. The 8 flips give +-1 +-2 +-3 = 6, 4, 2, 0, 0, -2, -4, -6: only 6 and -6 are as far
    # from 0 as the observed sum, so p = 2/8. Three pairs can never go below 1/4.
    assert stats.sign_flip_p([1.0, 2.0, 3.0]) == Fraction(1, 4)
    assert stats.sign_flip_p([-1.0, -2.0, -3.0]) == Fraction(1, 4)
    assert stats.smallest_sign_flip_p(3) == Fraction(1, 4)


def test_sign_flip_p_four_pairs_by_hand():
    # d = 1, -2, 3, 4, sum 6. The 16 flips of 1, 2, 3, 4: 10, 8, 6, 4, 4, 2, 0, -2 (no flip; flip 1; 2; 1+2; 3;
    # 1+3; 2+3; 1+2+3) and their negatives. |sum| >= 6: 10, 8, 6, -6, -8, -10: p = 6/16 = 3/8
    assert stats.sign_flip_p([1.0, -2.0, 3.0, 4.0]) == Fraction(3, 8)


def test_sign_flip_p_zeros_and_the_smallest_p():
    # a zero difference is its own flip: d = 0, 1 gives sums 1, 1, -1, -1, all as far out as the observed 1
    assert stats.sign_flip_p([0.0, 1.0]) == 1
    assert stats.sign_flip_p([0.5, 1.5, 2.5, 3.5, 4.5]) == Fraction(2, 32) == stats.smallest_sign_flip_p(5)
    with pytest.raises(ValueError, match="finite"):
        stats.sign_flip_p([1.0, math.inf])


def test_sign_flip_p_compares_sums_exactly():
    # 0.1 + 0.2 and 0.3 are different binary fractions; 0.5 + 0.25 and 0.75 are the same one: flipping 0.75
    # gives sum 0 exactly, a flip that rounding in float sums could miss or add. Flips of 0.5, 0.25, 0.75 (sum
    # 1.5): 1.5, 0.5, 1.0, 0.0, and negatives: |sum| >= 1.5 twice, p = 2/8
    assert stats.sign_flip_p([0.5, 0.25, 0.75]) == Fraction(1, 4)
    # d = 0.1, 0.2, -0.3: the observed sum is about 0 but not 0 in exact arithmetic, and the flip of every sign
    # gives its negative, so at least the observed and the all-flipped count
    assert stats.sign_flip_p([0.1, 0.2, -0.3]) >= Fraction(2, 8)
    # d = -0.1, -0.3, 0.1, -0.3, sum -0.6: the flips of the two 0.3s to one sign give (0.3 + 0.3) +- 0.1 +- 0.1 =
    # 0.8, 0.6, 0.6, 0.4, of which three tie with or pass |-0.6|, twice over (both signs); with the 0.3s of
    # opposite signs |sum| <= 0.2. 6 of 16. Summed in floats, 0.3 + 0.3 + 0.1 - 0.1 and the observed sum round
    # apart and a tie is lost (5/16).
    assert stats.sign_flip_p([-0.1, -0.3, 0.1, -0.3]) == Fraction(3, 8)


@pytest.mark.parametrize("differences", [
    [0.5, -1.2, 2.3, 3.1, -0.2, 4.4, 1.7],
    [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
    [-0.3, 0.9, -2.5, 1.1, 0.4, -0.7, 2.2, 3.3, -1.9],
])
def test_sign_flip_on_signed_ranks_is_the_exact_wilcoxon_test(differences):
    """The signed-rank test is the sign-flip test of the signed ranks: scipy's exact Wilcoxon p must equal it."""
    magnitudes = sorted(abs(d) for d in differences)
    signed_ranks = [math.copysign(magnitudes.index(abs(d)) + 1, d) for d in differences]
    assert stats.wilcoxon_p(differences) == pytest.approx(float(stats.sign_flip_p(signed_ranks)), rel=1e-12)


# The binary endpoint, paired and unpaired

@pytest.mark.parametrize("b, c, ties", [(6, 0, 2), (7, 1, 0), (3, 5, 4), (10, 3, 1), (0, 0, 5), (8, 8, 1)])
def test_sign_flip_of_binary_differences_is_the_exact_mcnemar_test(b, c, ties):
    """d in {-1, 0, 1}: b pairs where only the variant succeeded, c where only the reference did, ties 0. The
    sign-flip p is the two-sided exact binomial test of b of b + c discordant pairs at 1/2 (scipy's)."""
    d = [1.0] * b + [-1.0] * c + [0.0] * ties
    expected = scipy_stats.binomtest(b, b + c, 0.5).pvalue if b + c else 1.0
    assert float(stats.sign_flip_p(d)) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("a_yes, a_n, b_yes, b_n", [(7, 8, 0, 8), (1, 8, 0, 8), (3, 5, 4, 9), (6, 6, 1, 7),
                                                    (0, 4, 0, 4), (2, 3, 10, 12), (5, 10, 5, 10)])
def test_fisher_p_is_scipys_exact_test(a_yes, a_n, b_yes, b_n):
    table = [[a_yes, a_n - a_yes], [b_yes, b_n - b_yes]]
    assert float(stats.fisher_p(a_yes, a_n, b_yes, b_n)) == pytest.approx(scipy_stats.fisher_exact(table).pvalue,
                                                                          rel=1e-12)


def test_fisher_p_by_hand_and_bad_counts():
    # 7 of 8 against 0 of 8: 7 yes in all. a's count x is hypergeometric, C(7, x) C(9, 8 - x) of C(16, 8) = 12870:
    # x = 7: 1 x 9 = 9; x = 0: 1 x 9 = 9, as likely; every other x is more likely (x = 1: 7 x 36). p = 18/12870
    assert stats.fisher_p(7, 8, 0, 8) == Fraction(18, 12870)
    with pytest.raises(ValueError, match="from 0 to its runs"):
        stats.fisher_p(9, 8, 0, 8)


# The unpaired Mann-Whitney test

def test_p_value_complete_separation_three_a_side():
    # 1, 2, 3 against 4, 5, 6: of the C(6, 3) = 20 relabelings only {1, 2, 3} and {4, 5, 6} are as far from the
    # mean rank sum as the observed one, so p = 2/20 = 1/10: three seeds a side can never reach 0.05
    assert stats.permutation_p([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == Fraction(1, 10)
    assert stats.permutation_p([6.0, 5.0, 4.0], [3.0, 1.0, 2.0]) == Fraction(1, 10)
    assert stats.smallest_p(3, 3) == Fraction(1, 10)


def test_p_value_complete_separation_four_a_side():
    # 2 of C(8, 4) = 70 relabelings: 1/35 < 0.05, the least number of seeds a recipe may run
    assert stats.permutation_p([5.0, 6.0, 7.0, 8.0], [1.0, 2.0, 3.0, 4.0]) == Fraction(1, 35)


def test_p_value_with_a_three_way_tie():
    # a = 3, 5, 5 and b = 1, 2, 5. Pooled and sorted: 1, 2, 3, 5, 5, 5; the three 5s share ranks 4, 5, 6, mean 5.
    # Doubled ranks: 1 -> 2, 2 -> 4, 3 -> 6, each 5 -> 10. a's doubled rank sum is 6 + 10 + 10 = 26; with no
    # difference it is 3 x (6 + 1) = 21 on average, so the observed distance is 5: count the 3-subsets of
    # {2, 4, 6, 10, 10, 10} (the 10s are three distinct runs) whose sum S has |S - 21| >= 5, i.e. S >= 26 or <= 16:
    #   three 10s:                 S = 30                      1 subset, counts
    #   two 10s (3 ways) + one of 2, 4, 6:   S = 22, 24, 26    only + 6 counts: 3 subsets
    #   one 10 (3 ways) + two of 2, 4, 6:    S = 16, 18, 20    only + 2 + 4 counts: 3 subsets
    #   no 10:                     S = 12                      1 subset, counts
    # 8 of C(6, 3) = 20: p = 2/5
    assert stats.permutation_p([3.0, 5.0, 5.0], [1.0, 2.0, 5.0]) == Fraction(2, 5)


def test_p_value_with_diverged_runs_as_inf():
    # losses, a diverged run counted as inf: a = 2.0, 2.1, inf, inf and b = inf, inf, inf, 3.0.
    # Sorted: 2.0, 2.1, 3.0, then five infs sharing ranks 4..8 (mean 6). Doubled ranks: 2, 4, 6 and 12 for each inf.
    # a's sum 2 + 4 + 12 + 12 = 30; the mean is 4 x (8 + 1) = 36, distance 6: count the 4-subsets with S <= 30 or
    # S >= 42, choosing j of {2, 4, 6} and 4 - j of the five 12s (C(5, 4 - j) ways):
    #   j = 0: S = 48                       C(5, 4) = 5 subsets, count
    #   j = 1: S = 36 + 2, 4 or 6           only 6 (S = 42): C(5, 3) = 10
    #   j = 2: S = 24 + 6, 8 or 10          only 2 + 4 (S = 30): C(5, 2) = 10
    #   j = 3: S = 12 + 12 = 24             C(5, 1) = 5
    # 30 of C(8, 4) = 70: p = 3/7
    assert stats.permutation_p([2.0, 2.1, math.inf, math.inf], [math.inf, math.inf, math.inf, 3.0]) == Fraction(3, 7)


def test_p_value_of_identical_sides_is_one_and_nan_is_refused():
    assert stats.permutation_p([7.0, 7.0, 7.0, 7.0], [7.0, 7.0, 7.0, 7.0]) == 1
    with pytest.raises(ValueError, match="NaN"):
        stats.permutation_p([1.0, math.nan], [2.0, 3.0])


# Holm

def test_holm_by_hand():
    # p = 0.01, 0.04, 0.03, 0.005 (m = 4). Sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06;
    # 0.04 x 1 = 0.04, raised to 0.06 so the adjusted values never decrease. Back in the given order:
    p = [Fraction(1, 100), Fraction(4, 100), Fraction(3, 100), Fraction(5, 1000)]
    assert stats.holm(p) == [Fraction(3, 100), Fraction(6, 100), Fraction(6, 100), Fraction(2, 100)]
    # capped at 1: 0.5 x 2 = 1, and 0.6 is raised to it; 0.6 x 2 = 1.2 is cut to 1, and 0.7 raised to it
    assert stats.holm([0.6, 0.5]) == [1, 1]
    assert stats.holm([0.6, 0.7]) == [1, 1]
    assert stats.holm([0.2]) == [0.2] and stats.holm([]) == []


# Hodges-Lehmann

def test_an_order_statistic_at_exactly_alpha_over_2_is_kept():
    """k is the largest with P(S <= k - 1) <= alpha / 2: at equality the interval keeps that order statistic and
    covers exactly 1 - alpha (80 equally likely values of S: P(S <= 1) = 2/80 = 0.025)."""
    assert stats.order_statistic_interval(list(range(79)), [1] * 80, 0.05) == (1, 77, 0.95)


def test_hodges_lehmann_paired_by_hand():
    # d = 1, 3, -2. Walsh averages (d_i + d_j) / 2, i <= j: 1, 2, -0.5, 3, 0.5, -2; sorted -2, -0.5, 0.5, 1, 2, 3,
    # median 0.75. With 3 pairs P(T+ = 0) = 1/8 > 0.025: no 95% interval exists, [min, max] covers 1 - 2/8
    assert stats.hodges_lehmann_paired([1.0, 3.0, -2.0]) == {"estimate": 0.75, "low": -2.0, "high": 3.0,
                                                            "confidence": 0.75}
    # d = 1 .. 8: the subsets of {1, .., 8} with sum <= 3 are {}, {1}, {2}, {3}, {1, 2}: P(T+ <= 3) = 5/256 <= 0.025
    # and P(T+ <= 4) = 7/256 > 0.025 ({4}, {1, 3} more), so the interval is the 4th smallest and 4th largest of the
    # 36 Walsh averages: 1, 1.5, 2, 2 (1+1, 1+2, 1+3, 2+2 halved) and 8, 7.5, 7, 7; coverage 1 - 10/256
    result = stats.hodges_lehmann_paired([float(i) for i in range(1, 9)])
    assert result == {"estimate": 4.5, "low": 2.0, "high": 7.0, "confidence": 1 - 10 / 256}


def test_interval_of_the_mean_by_hand():
    # d = 1, 2, 4: the 7 subset means 1, 1.5, 2, 7/3, 2.5, 3, 4. Three pairs: P(S = 0) = 1/8 > 0.025, no 95%
    # interval exists; [min, max] covers 1 - 2/8
    assert stats.mean_interval([1.0, 2.0, 4.0]) == {"estimate": 7 / 3, "low": 1.0, "high": 4.0, "confidence": 0.75}
    # d = 1 .. 8: k is the largest with 2k / 256 <= 0.05, 6. The smallest subset means: 1 ({1}), 1.5 ({1, 2}),
    # 2 ({2}, {1, 3}, {1, 2, 3}), then 7/3 ({1, 2, 4}): the 6th; by the symmetry d -> 9 - d the 6th largest is
    # 9 - 7/3 = 20/3. Coverage 1 - 12/256 = 95.3%
    result = stats.mean_interval([float(i) for i in range(1, 9)])
    assert result == {"estimate": 4.5, "low": 7 / 3, "high": 20 / 3, "confidence": 1 - 12 / 256}
    # 6 pairs: k = 1, [min, max], coverage 1 - 2/64 = 96.9%, not 95%
    assert stats.mean_interval([0.3, -0.1, 0.2, 0.5, 0.4, 0.1])["confidence"] == 1 - 2 / 64


def flip_p_at(differences, theta):
    """The two-sided sign-flip p of d - theta by brute force over every sign pattern, in exact Fractions."""
    shifted = [Fraction(d) - theta for d in differences]
    observed = abs(sum(shifted))
    signs = itertools.product((1, -1), repeat=len(shifted))
    hits = sum(abs(sum(s * x for s, x in zip(pattern, shifted))) >= observed for pattern in signs)
    return Fraction(hits, 2 ** len(shifted))


def test_interval_of_the_mean_is_the_sign_flip_test_inverted():
    """For 60 random designs of 6 to 9 pairs, ties and zeros included: the interval's ends (the k-th smallest and
    largest subset means, 2k / 2^n <= 0.05) are not rejected by the test of d - theta, the points halfway to the
    subset means next outside them are (p < 0.05), and p < 0.05 exactly where 0 lies outside."""
    rng = np.random.default_rng(3)
    for _ in range(60):
        n = int(rng.integers(6, 10))
        d = [float(x) for x in rng.choice([-0.5, -0.25, 0.0, 0.25, 0.75, 1.0, 1.5], n)]
        means = stats.subset_means(d)
        k = math.floor(stats.ALPHA * 2 ** n / 2)
        low, high = means[k - 1], means[-k]
        result = stats.mean_interval(d)
        assert (result["low"], result["high"], result["confidence"]) == (float(low), float(high), 1 - 2 * k / 2 ** n)
        assert flip_p_at(d, low) >= stats.ALPHA and flip_p_at(d, high) >= stats.ALPHA
        below, above = [m for m in means if m < low], [m for m in means if m > high]
        if below:
            assert flip_p_at(d, (below[-1] + low) / 2) < stats.ALPHA
        if above:
            assert flip_p_at(d, (above[0] + high) / 2) < stats.ALPHA
        assert (stats.sign_flip_p(d) < stats.ALPHA) == (not low <= 0 <= high)


def test_test_interval_and_effect_agree_where_mean_and_median_differ_in_sign():
    # seven pairs at -0.01 and six at +1: the median is -0.01 and the mean +0.456. The sign-flip p counts the
    # patterns that keep the six +1s on one side: 2 x 2^7 of 2^13 = 1/32; the interval (of the mean) excludes 0
    d = [-0.01] * 7 + [1.0] * 6
    assert statistics.median(d) < 0 < statistics.fmean(d)
    assert stats.sign_flip_p(d) == Fraction(1, 32)
    result = stats.mean_interval(d)
    assert result["estimate"] == pytest.approx(statistics.fmean(d)) and 0 < result["low"] <= result["high"]
    # the mirror: the mean negative, the median positive, not significant, and 0 inside
    d = [0.2] * 5 + [-1.0, -0.9, -0.8]
    assert statistics.fmean(d) < 0 < statistics.median(d)
    result = stats.mean_interval(d)
    assert stats.sign_flip_p(d) >= stats.ALPHA and result["low"] <= 0 <= result["high"] and result["estimate"] < 0


def test_the_interval_of_the_mean_covers_as_it_says():
    """Symmetric differences (normal, t with 3 degrees of freedom): the share of 2,000 intervals that hold the true
    mean is within Monte Carlo error of the stated coverage (Hartigan 1969: exact for symmetric continuous data)."""
    rng = np.random.default_rng(5)
    for n, draw in ((6, rng.standard_normal), (8, lambda size: rng.standard_t(3, size))):
        hits, stated = 0, None
        for _ in range(2000):
            result = stats.mean_interval(list(0.7 + draw(n)))
            hits += result["low"] <= 0.7 <= result["high"]
            stated = result["confidence"]
        assert hits / 2000 == pytest.approx(stated, abs=0.015)


def test_hodges_lehmann_shift_by_hand():
    # a = 10 .. 14, b = 0 .. 4: the 25 differences run from 6 (10 - 4) to 14, median 10. Under no shift U counts
    # 1, 1, 2, 3, ... of the C(10, 5) = 252 labelings at U = 0, 1, 2, 3: P(U <= 2) = 4/252 <= 0.025 < P(U <= 3)
    # = 7/252, so the interval is the 3rd smallest difference, 7 (6, 7, 7), and the 3rd largest, 13 (14, 13, 13)
    result = stats.hodges_lehmann_shift([10.0, 11.0, 12.0, 13.0, 14.0], [0.0, 1.0, 2.0, 3.0, 4.0])
    assert result == {"estimate": 10.0, "low": 7.0, "high": 13.0, "confidence": 1 - 8 / 252}
    assert stats.rank_sum_counts(5, 5)[:4] == [1, 1, 2, 3] and sum(stats.rank_sum_counts(5, 5)) == 252


# Power

def test_power_of_a_huge_effect_is_one_and_of_none_is_at_most_alpha():
    assert stats.sign_flip_power(6, delta=100.0, sd=1.0) == 1.0
    assert stats.sign_flip_power(8, delta=0.0, sd=1.0, trials=4000) <= stats.ALPHA + 0.01
    # 6 pairs: p is a multiple of 2/64 (a flip pattern and its negation tie), and only its smallest value, 2/64,
    # is below 0.05, where no effect puts it with probability 2/64: the exact size of the test
    assert stats.sign_flip_power(6, delta=0.0, sd=1.0, trials=4000) == pytest.approx(2 / 64, abs=0.01)


def test_power_is_zero_where_the_smallest_p_cannot_reach_the_level():
    # 5 pairs: the smallest p is 2/32 = 0.0625 >= 0.05; 6 pairs under Holm's first step for 2 claims (alpha / 2):
    # 2/64 = 0.031 >= 0.025
    assert stats.sign_flip_power(5, delta=100.0, sd=1.0) == 0.0
    assert stats.sign_flip_power(6, delta=100.0, sd=1.0, alpha=stats.ALPHA / 2) == 0.0
    assert stats.minimum_detectable_effect(5, sd=1.0) == math.inf


@pytest.mark.parametrize("n, delta", [(12, 0.8), (10, 1.0)])
def test_power_agrees_with_the_t_test(n, delta):
    """With normal differences the sign-flip test of the sum is asymptotically the one-sample t-test: its power
    is P(|T| > t_crit) for T noncentral t with n - 1 degrees of freedom and noncentrality delta sqrt(n) / sd."""
    t_crit = scipy_stats.t.ppf(1 - stats.ALPHA / 2, n - 1)
    noncentral = scipy_stats.nct(n - 1, delta * math.sqrt(n))
    expected = noncentral.sf(t_crit) + noncentral.cdf(-t_crit)
    assert stats.sign_flip_power(n, delta, 1.0, trials=4000) == pytest.approx(expected, abs=0.04)


def test_minimum_detectable_effect_is_where_power_reaches_80_percent_and_shrinks_with_n():
    mde = {n: stats.minimum_detectable_effect(n, sd=1.0, trials=1000) for n in (6, 8, 12)}
    assert mde[6] > mde[8] > mde[12] > 0
    for n, delta in mde.items():
        assert stats.sign_flip_power(n, delta, 1.0, trials=1000) >= stats.POWER
        assert stats.sign_flip_power(n, delta * 0.95, 1.0, trials=1000) < stats.POWER
    # linear in sd: the design sees delta / sd
    assert stats.minimum_detectable_effect(8, sd=2.0, trials=1000) == pytest.approx(2 * mde[8], rel=0.01)


def test_rank_sum_power_reads_the_exact_mann_whitney_p_of_each_draw():
    """The same standard normal draws as rank_sum_power's (its rng seed and shape), judged one by one by scipy's
    exact Mann-Whitney test: the share below 0.05 is the power, exactly."""
    n, m, delta, trials = 6, 5, 1.2, 300
    z = np.random.default_rng(7).standard_normal((trials, n + m))
    p = [scipy_stats.mannwhitneyu(delta + row[:n], row[n:], method="exact").pvalue for row in z]
    expected = sum(value < stats.ALPHA for value in p) / trials
    assert 0.2 < expected < 0.9  # the case tells something
    assert stats.rank_sum_power(n, m, delta, 1.0, trials=trials, seed=7) == expected


def test_rank_sum_power_huge_none_and_unreachable():
    assert stats.rank_sum_power(4, 4, delta=100.0, sd=1.0) == 1.0  # 2/70 < 0.05
    assert stats.rank_sum_power(5, 5, delta=0.0, sd=1.0, trials=4000) <= stats.ALPHA + 0.01
    # 3 a side: the smallest p is 2/20 = 0.1
    assert stats.rank_sum_power(3, 3, delta=100.0, sd=1.0) == 0.0
    assert stats.rank_sum_mde(3, 3, sd=1.0) == math.inf


def test_rank_sum_mde_is_where_power_reaches_80_percent():
    mde = stats.rank_sum_mde(6, 6, sd=1.0, trials=1000)
    assert stats.rank_sum_power(6, 6, mde, 1.0, trials=1000) >= stats.POWER
    assert stats.rank_sum_power(6, 6, mde * 0.95, 1.0, trials=1000) < stats.POWER
    assert mde > stats.minimum_detectable_effect(6, sd=1.0, trials=1000) / math.sqrt(2)  # unpaired sees less
    assert stats.rank_sum_mde(6, 6, sd=3.0, trials=1000) == pytest.approx(3 * mde, rel=0.01)


# The verdict

@pytest.mark.parametrize("p_holm, effect, expect, says", [
    (0.01, -0.2, "negative", "agrees"),
    (0.01, 0.2, "positive", "agrees"),
    (0.01, 0.2, "negative", "disagrees"),
    (0.01, -0.2, "positive", "disagrees"),
    (0.05, -0.2, "negative", "not detected (observed minimum detectable effect 0.123)"),
    (0.5, 0.2, "positive", "not detected (observed minimum detectable effect 0.123)"),
])
def test_verdict(p_holm, effect, expect, says):
    assert stats.verdict(p_holm, effect, expect, mde=0.1234) == says


def test_a_zero_effect_never_agrees_or_disagrees():
    # a significant p beside an effect of exactly 0 cannot come from one statistic; it is no direction either way
    for expect in ("positive", "negative"):
        assert stats.verdict(0.01, 0.0, expect, mde=0.1234) == \
            "not detected (observed minimum detectable effect 0.123)"


SHORT = "the interval ends at 0.015, short of 0.024)"


@pytest.mark.parametrize("p_holm, effect, expect, interval, says", [
    # not detected, the interval below the target: too small, not too noisy
    (0.5, 0.01, "positive", [-0.02, 0.015], "smaller than the paper's (not detected; " + SHORT),
    (0.5, -0.01, "negative", [-0.015, 0.02], "smaller than the paper's (not detected; " + SHORT),
    # detected in the paper's direction, but the whole interval short of the paper's effect
    (0.01, 0.01, "positive", [0.005, 0.015], "smaller than the paper's (detected in its direction; " + SHORT),
    # the interval reaches the target: agrees, or not detected with the MDE
    (0.01, 0.01, "positive", [0.005, 0.024], "agrees"),
    (0.5, 0.01, "positive", [-0.02, 0.03], "not detected (observed minimum detectable effect 0.123)"),
    (0.5, -0.01, "negative", [-0.03, 0.02], "not detected (observed minimum detectable effect 0.123)"),
    # significant against the paper: disagrees, though the interval is short of the target too
    (0.01, -0.01, "positive", [-0.015, -0.005], "disagrees"),
])
def test_verdict_smaller_than_the_target(p_holm, effect, expect, interval, says):
    assert stats.verdict(p_holm, effect, expect, mde=0.1234, interval=interval, target=0.024) == says


def test_verdict_names_whose_target_it_falls_short_of():
    says = stats.verdict(0.5, 0.01, "positive", 0.1, interval=[-0.02, 0.015], target=0.024,
                         whose="nanonorm's target")
    assert says.startswith("smaller than nanonorm's target (not detected;")


def test_verdict_without_a_detectable_effect_and_a_bad_direction():
    says = stats.verdict(0.2, 0.1, "positive", mde=math.inf)
    assert says == "not detected (no effect is detectable with these seeds)"
    assert stats.verdict(0.2, 0.1, "positive", mde=math.nan).endswith("the minimum detectable effect, is unknown)")
    assert stats.verdict(1.0, 0.0, "positive", mde=0.0) == "not detected (no difference on any seed)"
    with pytest.raises(ValueError, match="positive"):
        stats.verdict(0.01, 0.1, "better", mde=0.1)


def test_the_sign_flip_sums_are_compared_exactly_not_after_rounding_to_a_grid():
    # six equal differences of 1e-7: all flipped or none reach |sum|, p = 2/64. Scaled by 2^20 and rounded to
    # integers they would all be 0, every flip would tie and p would be 1
    assert stats.sign_flip_p([1e-7] * 6) == Fraction(2, 64)
    # one difference off the grid by 2^-30: the sums it tips past |sum| are counted exactly
    assert stats.sign_flip_p([1.0 + 2 ** -30, -1.0, 1.0, 1.0, 1.0, 1.0]) == Fraction(12, 64)  # on the grid: 14/64
