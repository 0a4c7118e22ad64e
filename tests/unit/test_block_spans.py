# SPDX-License-Identifier: Apache-2.0
"""The block slots a plan verifies (`StepPlan.block_spans`) and their positions in the draft forward's sampled layout
(`block_rows.verified_positions`), where the draft-vocabulary argmax runs alone. Checked on hand-made plans: a DFlash
proposal verifies slots 0..k-1, a merged one the slots after its lookup tokens, a merged one whose lookup covers k
(and prompt lookup, and no proposal) none; positions are request-major in the forward's own row order; a layout
where every slot is verified gives None (the plain argmax)."""
import numpy as np

from vllm_dflash.adaptive.controller import StepPlan
from vllm_dflash.integration.block_rows import verified_positions


def _plan() -> StepPlan:
    a = np.array
    lookups = [a([], dtype=np.int64), a([1, 2, 3, 4]), a([5, 6]), a([7, 8, 9]), a([], dtype=np.int64), a([3])]
    return StepPlan(req_ids=list("abcdef"), starts=[0] * 6, lookups=lookups,
                    sources=["dflash", "ngram", "merged", "merged", "none", "dflash"], ks=[3, 4, 6, 2, 0, 7])


def test_spans_follow_block_requests():
    p = _plan()
    assert p.block_requests() == [0, 2, 5]  # the merged proposal of 'd' (3 lookup tokens, k = 2) needs no block
    assert p.block_spans() == [(0, 3), (2, 6), (0, 7)]


def test_positions_in_the_forwards_row_order():
    K = 7
    spans = {4: (0, 3), 1: (2, 6), 6: (0, 7)}  # batch rows 1, 4, 6
    got = verified_positions([1, 4, 6], spans, K).tolist()
    assert got == [2, 3, 4, 5] + [7, 8, 9] + list(range(14, 21))
    # the full layout (the subset could not be built): rows keep their batch positions, a row without a span has none
    full = verified_positions(list(range(7)), spans, K).tolist()
    assert full == [1 * K + s for s in range(2, 6)] + [4 * K + s for s in range(3)] + [6 * K + s for s in range(7)]


def test_every_slot_verified_means_no_index():
    assert verified_positions([0, 2], {0: (0, 4), 2: (0, 4)}, 4) is None
    assert verified_positions([0, 2], {0: (0, 4), 2: (0, 3)}, 4).tolist() == [0, 1, 2, 3, 4, 5, 6]
