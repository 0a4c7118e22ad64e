# SPDX-License-Identifier: Apache-2.0
"""The q hand-off of adaptive drafting (integration/drafting/block_sampling.py `hand_off_probs`, the persistent
buffer of integration/draft_probs.py), replayed over two steps through the real classes, as vLLM's runner reads it:
for every request with drafts it slices that request's first num_draft cells (`_get_spec_decode_draft_probs`).

Step N-1: batch row 0 is a sampled request verifying a sampled DFlash draft (q peaked on token 3). Step N: row 1
verifies a sampled DFlash draft, row 0 (sampled) a prompt-lookup proposal, row 2 (greedy) a lookup proposal, row 3
a merged proposal (lookup, then DFlash slots). Before the fix the lookup row was verified against step N-1's q and a
token of target probability 0.20 came out every time (shared/reference/review-scripts/q_stale.py). Imports vLLM (its
logger, through block_sampling), starts no engine."""
import collections
from types import SimpleNamespace as NS

import numpy as np
import pytest
import torch
from support.stats import chi2_two_sample_pvalue

from vllm_dflash.integration.draft_probs import DraftProbs
from vllm_dflash.integration.drafting.block_sampling import hand_off_probs
from vllm_dflash.integration.sampled_verify import rejection_sample_sampled

pytestmark = pytest.mark.vllm
K, V = 2, 8
P_TARGET = torch.tensor([0.05, 0.05, 0.05, 0.5, 0.05, 0.2, 0.05, 0.05])  # the target's p at the verified position


def _replay():
    """-> (drafter after step N, the dense q each request should have been verified against: {row: [K, V]})."""
    d = NS(num_speculative_tokens=K, _q_buffer=DraftProbs(K, V, torch.arange(V)), _last_draft_probs=None,
           _runner=NS(input_batch=NS(req_ids=["a", "b", "c", "e"])))
    peaked = torch.full((V,), 0.1 / (V - 1))
    peaked[3] = 0.9
    # step N-1: rows 0 and 3 sampled DFlash, q at both slots
    step = NS(drafter=d, block_q=(torch.tensor([0, 1, 6, 7]), peaked.repeat(4, 1), torch.tensor([True] * 4)))
    hand_off_probs(step, [0, 3], [np.array([3, 3]), np.array([3, 3])], [(0, 2), (0, 2)])
    assert d._last_draft_probs is not None
    # step N: row 1 sampled DFlash (q flat); row 0 sampled lookup [5, 6]; row 2 greedy lookup [4]; row 3 sampled,
    # merged: lookup slot 0 = 1, DFlash slot 1 (q flat)
    flat = torch.full((V,), 1.0 / V)
    step = NS(drafter=d, block_q=(torch.tensor([2, 3, 7]), flat.repeat(3, 1), torch.tensor([True] * 3)))
    d._last_draft_probs = None
    hand_off_probs(step, [0, 1, 2, 3], [np.array([5, 6]), np.array([2, 2]), np.array([4]), np.array([1, 2])],
                   [None, (0, 2), None, (1, 2)])
    hot = torch.nn.functional.one_hot
    want = {0: torch.stack([hot(torch.tensor(5), V), hot(torch.tensor(6), V)]).float(),
            1: flat.repeat(2, 1), 2: torch.stack([hot(torch.tensor(4), V).float(), torch.zeros(V)]),
            3: torch.stack([hot(torch.tensor(1), V).float(), flat])}
    return d, want


def test_every_cell_with_a_draft_is_this_steps_q():
    """Each request's cells are this step's q (DFlash slots of sampled requests) or one-hot at the proposed token
    (lookup, merged lookup slots, greedy rows); every cell no proposal names is zero, not an earlier step's q."""
    d, want = _replay()
    got = d._last_draft_probs
    assert got is not None and got.shape == (4, K, V)
    for row, q in want.items():
        assert torch.equal(got[row], q), (row, got[row])


def test_lookup_row_keeps_the_targets_distribution():
    """vLLM's rule (the plugin's `rejection_sample_sampled`, the same rule) on the lookup row's first slot (token 5,
    target probability 0.20) with the q handed over: the committed token follows the target's p (chi-square against
    direct draws from p); with step N-1's stale q (the bug) the same test fails."""
    d, _ = _replay()
    n, g = 20_000, torch.Generator().manual_seed(0)

    def emitted(q_row):
        out = rejection_sample_sampled(torch.full((n,), 5), [1] * n, 1, q_row.repeat(n, 1),
                                       torch.log(P_TARGET).repeat(n, 1), torch.zeros(n, 1, dtype=torch.long), {},
                                       lambda: torch.rand(n, dtype=torch.float64, generator=g))
        return collections.Counter(out[:, 0].tolist())

    direct = collections.Counter(torch.multinomial(P_TARGET, n, replacement=True, generator=g).tolist())
    assert chi2_two_sample_pvalue(direct, emitted(d._last_draft_probs[0, :1])) > 1e-3
    stale = torch.full((V,), 0.1 / (V - 1))
    stale[3] = 0.9  # what the buffer held before the fix
    assert chi2_two_sample_pvalue(direct, emitted(stale[None])) < 1e-3, "negative control not detected"
