# SPDX-License-Identifier: Apache-2.0
"""`IdlePlanBackoff` (adaptive/idle_plans.py): a batch-size bucket whose plans keep drafting nothing plans every
`every`-th step only, until a plan drafts again; in the controller, the steps in between look nothing up."""
import numpy as np
import pytest

from support.clock import StepClock
from vllm_dflash.adaptive.controller import AdaptiveController
from vllm_dflash.adaptive.idle_plans import IdlePlanBackoff


def test_backoff_plans_every_few_steps_after_idle_plans_and_resets_on_a_draft():
    b = IdlePlanBackoff(idle=3, every=4)
    for _ in range(3):  # three plans that drafted nothing: planning every step until then
        assert not b.skip(5)
        b.planned(5, drafted=False)
    assert [b.skip(5) for _ in range(3)] == [True, True, True] and not b.skip(5)  # the 4th step plans
    assert not b.skip(2)  # another bucket is unaffected
    b.planned(5, drafted=True)  # that plan drafted: planning every step again
    assert [b.skip(5) for _ in range(4)] == [False] * 4
    with pytest.raises(ValueError, match="every 0"):
        IdlePlanBackoff(every=0)


def test_controller_skips_lookups_between_idle_plans():
    """Prompt lookup only: a history without a repeat gives no draft for 8 planned steps; then the request's text
    repeats, and its lookup is drafted at the next planned step (the 4th), not in the three skipped before it. The
    steps in between look nothing up; after a draft every step plans again."""
    c = AdaptiveController(4, mode="ngram", clock=StepClock())
    calls = []
    lookup = c._lookup
    c._lookup = lambda r, h: calls.append(r) or lookup(r, h)
    plain = np.arange(100, 140)
    for i in range(8):
        assert c.propose(c.plan(["r"], [plain[: 10 + i]], query_tokens=1, decode_only=True), None) == [[]]
    assert len(calls) == 8
    repeat = np.array([3, 4, 5, 6, 7, 8, 3, 4, 5])
    outs = [c.propose(c.plan(["r"], [repeat], query_tokens=1, decode_only=True), None) for _ in range(4)]
    assert outs[:3] == [[[]]] * 3 and outs[3] == [[6, 7, 8, 3]] and len(calls) == 9
    c.plan(["r"], [repeat], query_tokens=1, decode_only=True)
    assert len(calls) == 10  # planned again at once
