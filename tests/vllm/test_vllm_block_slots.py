# SPDX-License-Identifier: Apache-2.0
"""The draft-vocabulary argmax at the verified block slots alone (integration/block_rows.py `verified_positions`),
inside real vLLM (CPU, float32, adaptive drafting, synchronous scheduling).

Four requests decode together under a fixed plan (by arrival): request 0 verifies 2 DFlash tokens, request 1 none,
request 2 five, request 3 a merged proposal of every slot (its lookup tokens first). Checked: at every verified slot
the draft is the same token as with the argmax over every slot (`verified_positions` forced off, the control); the
slots left out hold the mask id in the trimmed run and real drafts in the control (so the trimmed path ran); the
output is the target's greedy output in both."""
import pytest

from support.block_plan import block_prompts, run_fixed_plan

pytestmark = pytest.mark.vllm

PROMPTS = block_prompts(seed=7)
MAX_TOKENS = 24
# by order of arrival: 2 DFlash tokens, none, 5 DFlash tokens, a merged proposal of every slot
PLAN = [("dflash", 2), ("none", 0), ("dflash", 5), ("merged", None)]


@pytest.fixture(scope="module")
def results(pair):
    r = run_fixed_plan(pair, True, PLAN, "verified_positions", PROMPTS, MAX_TOKENS)
    return {"base": r["base"], "trimmed": r["test"], "full": r["control"]}


def test_output_is_the_targets(results):
    assert results["trimmed"]["tokens"] == results["base"]["tokens"]
    assert results["full"]["tokens"] == results["base"]["tokens"]


def test_verified_slots_equal_the_full_argmax(results):
    trimmed, full = results["trimmed"]["probe"]["blocks"], results["full"]["probe"]["blocks"]
    assert trimmed and len(trimmed) == len(full)
    for i, (a, b) in enumerate(zip(trimmed, full)):
        assert a["rows"].keys() == b["rows"].keys(), i
        for req, ((lo, hi), drafts) in a["rows"].items():
            assert b["rows"][req][0] == [lo, hi]
            assert drafts[lo:hi] == b["rows"][req][1][lo:hi], (i, req, lo, hi)


def test_slots_left_out_hold_the_mask_in_the_trimmed_run_only(results):
    def left_out(blocks):
        return [t for b in blocks for (lo, hi), d in b["rows"].values() for t in d[:lo] + d[hi:]]

    trimmed, full = results["trimmed"]["probe"]["blocks"], results["full"]["probe"]["blocks"]
    mask = trimmed[0]["mask"]
    assert any(hi - lo < 7 for b in trimmed for (lo, hi), _ in b["rows"].values())  # the plan left slots out
    assert left_out(trimmed) and all(t == mask for t in left_out(trimmed))
    assert any(t != mask for t in left_out(full))  # the control drafted them
