# SPDX-License-Identifier: Apache-2.0
"""Statistics shared by the sampling tests (tests/unit/test_reference.py, tests/vllm/test_vllm_sampling.py)."""
import collections

import torch


def chi2_two_sample_pvalue(a: collections.Counter, b: collections.Counter, min_count: int = 10) -> float:
    """p-value of a chi-square test that two samples of categories come from the same distribution (categories seen
    fewer than min_count times pooled into one)."""
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
    df = len(rows[0]) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))
