# SPDX-License-Identifier: Apache-2.0
"""Two-sample chi-square test of categorical samples (no vLLM): do two samples of outcomes (token sequences, say)
come from one distribution? Used by the served mixed-source check (bench/soak/mixed.py) and the sampling tests
(tests/support/stats.py). Categories seen fewer than `min_count` times in both samples together are pooled into one
bin, so sparse tails do not break the chi-square approximation; the p-value is the regularised upper incomplete gamma
function (torch.special.gammaincc), the chi-square survival function."""
from __future__ import annotations

import collections
from collections.abc import Hashable, Mapping

MIN_COUNT = 10  # a category seen fewer times (both samples together) is pooled with the other rare ones


def chi2_sf(stat: float, df: int) -> float:
    """P(X >= stat) for X ~ chi-square with df degrees of freedom (1.0 for df 0: one bin tests nothing)."""
    import torch

    if df <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(max(stat, 0.0) / 2, dtype=torch.float64)))


def chi2_isf(p: float, df: int) -> float:
    """The statistic whose survival is p (chi2_sf's inverse, by bisection)."""
    lo, hi = 0.0, float(df) + 10.0
    while chi2_sf(hi, df) > p:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_sf(mid, df) > p else (lo, mid)
    return hi


def chi2_two_sample(a: Mapping[Hashable, int], b: Mapping[Hashable, int],
                    min_count: int = MIN_COUNT) -> tuple[float, int]:
    """(statistic, degrees of freedom) of the 2 x C contingency table of two samples' category counts (rare
    categories pooled, `MIN_COUNT`; the pooled bin left out when both samples have none in it)."""
    a, b = collections.Counter(a), collections.Counter(b)
    na0, nb0 = sum(a.values()), sum(b.values())
    if na0 == 0 or nb0 == 0:
        raise ValueError(f"chi-square: an empty sample ({na0} and {nb0} outcomes)")
    pooled = a + b
    cats = [k for k, v in pooled.items() if v >= min_count]
    rows = [[x[k] for k in cats] + [sum(x.values()) - sum(x[k] for k in cats)] for x in (a, b)]
    if rows[0][-1] + rows[1][-1] == 0:
        rows = [r[:-1] for r in rows]
    na, nb = sum(rows[0]), sum(rows[1])
    stat = 0.0
    for j in range(len(rows[0])):
        tot = rows[0][j] + rows[1][j]
        for r, n in ((rows[0], na), (rows[1], nb)):
            e = tot * n / (na + nb)
            stat += (r[j] - e) ** 2 / e
    return stat, len(rows[0]) - 1


def chi2_two_sample_pvalue(a: Mapping[Hashable, int], b: Mapping[Hashable, int],
                           min_count: int = MIN_COUNT) -> float:
    """p-value of a chi-square test that two samples of categories come from the same distribution (categories seen
    fewer than min_count times pooled into one)."""
    return chi2_sf(*chi2_two_sample(a, b, min_count))


def size_to_reject(a: Mapping[Hashable, int], b: Mapping[Hashable, int], alpha: float,
                   min_count: int = MIN_COUNT) -> float | None:
    """Roughly how many times larger both samples must be for a difference of the size seen to reach p < alpha
    about half the time: the statistic's excess over its null mean (df) grows with the sample size, so the factor is
    (the statistic at alpha - df) / (statistic - df). None where no excess was seen."""
    stat, df = chi2_two_sample(a, b, min_count)
    if stat <= df or df == 0:
        return None
    return max(1.0, (chi2_isf(alpha, df) - df) / (stat - df))
