# SPDX-License-Identifier: Apache-2.0
"""Adaptive drafting under overlap scheduling, without vLLM: the drafter's token-history mirror, its source choice
(`AdaptiveController.plan_overlap` / `propose_overlap`) and draft-forward decision, the scheduler-side
`LengthPlanner`, and the guard's arm filter."""
import numpy as np

from vllm_dflash.adaptive.controller import AdaptiveController
from vllm_dflash.adaptive.history import TokenHistory
from vllm_dflash.adaptive.lengths import ANY, LengthPlanner, expected_accepted
from vllm_dflash.adaptive.policy import SpeculationGuard


def test_history_mirror_follows_prefill_and_decode():
    h = TokenHistory()
    h.start("r", np.array([1, 2, 3, 4, 5]))
    # prefill with a 2-token cached prefix: query = positions 2..4, then the sampled token 9 at position 5
    assert h.commit("r", 2, np.array([3, 4, 5]), 9).tolist() == [1, 2, 3, 4, 5, 9]
    # decode step: query [9, d1, d2] at 5..7, d2 rejected -> accepted [9, d1=7], sampled 8
    assert h.commit("r", 5, np.array([9, 7]), 8).tolist() == [1, 2, 3, 4, 5, 9, 7, 8]
    # a long run grows the buffer and keeps the prefix
    for t in range(200):
        out = h.commit("r", 7 + t, np.array([8 if t == 0 else 100 + t - 1]), 100 + t)
    assert out[:8].tolist() == [1, 2, 3, 4, 5, 9, 7, 8] and out[-1] == 299 and len(out) == 208


def test_history_hole_disables_the_request():
    h = TokenHistory()
    h.start("r", np.array([1, 2, 3]))
    assert h.commit("r", 10, np.array([7]), 8) is None  # positions 3..9 never seen
    h.drop(["r"])
    assert "r" not in h


def _overlap(c, req_ids, hists, block, verified, forwards=None):
    """One overlap step as the drafter runs it: plan, the draft forward only if the plan needs it, propose."""
    plan = c.plan_overlap(req_ids, hists, verified)
    if plan.needs_block and forwards is not None:
        forwards.append(len(req_ids))
    anchors = np.array([h[-1] if h is not None else 0 for h in hists], dtype=np.int64)
    return c.propose_overlap(plan, block if plan.needs_block else None, anchors)


def test_overlap_picks_the_source_and_pads_to_k():
    c = AdaptiveController(k_max=4, mode="both")
    hist = np.array([5, 6, 7, 8, 9, 5, 6, 7], dtype=np.int64)  # suffix [5, 6, 7] occurred: lookup -> [8, 9, 5, 6]
    block = np.array([[40, 41, 42, 43]])
    out = _overlap(c, ["a"], [hist], block, [(0, 0)])
    assert out.tolist() == [[8, 9, 5, 6]]  # n-gram prior 0.7 beats DFlash 0.5 at equal length
    assert c._pending["a"].source == "ngram"
    # the scheduler verified 3 of them and 0 were accepted: n-gram acceptance of this request falls, DFlash wins
    for _ in range(6):
        out = _overlap(c, ["a"], [hist], block, [(3, 0)])
        if c._pending["a"].source == "dflash":
            break
    assert out.tolist() == [[40, 41, 42, 43]] and c._pending["a"].source == "dflash"
    assert c.acceptance.rates("a", "ngram")[0] < 0.3
    # a short lookup alone is padded with its last token; no lookup -> the anchor (newest token) repeated
    c2 = AdaptiveController(k_max=4, mode="ngram")
    short = np.array([1, 2, 3, 1, 2], dtype=np.int64)  # [1, 2] -> [3, 1, 2] (3 tokens)
    assert _overlap(c2, ["b"], [short], None, [(0, 0)]).tolist() == [[3, 1, 2, 2]]
    assert _overlap(c2, ["c"], [np.array([1, 2, 3], dtype=np.int64)], None, [(0, 0)]).tolist() == [[3, 3, 3, 3]]
    assert "c" not in c2._pending  # no proposal: nothing to score


def test_overlap_merges_short_lookups_with_the_block():
    """'both' and 'merged': a lookup shorter than k is completed by the DFlash block (slots m..k-1); when the
    scheduler reports the outcome its lookup slots are scored as prompt lookup and its block slot as 'merged'."""
    short = np.array([1, 2, 3, 1, 2], dtype=np.int64)  # [1, 2] -> [3, 1, 2]
    block = np.array([[40, 41, 42, 43]])
    for mode in ("both", "merged"):
        c = AdaptiveController(k_max=4, mode=mode)
        assert _overlap(c, ["a"], [short], block, [(0, 0)]).tolist() == [[3, 1, 2, 43]], mode
        assert c._pending["a"].source == "merged"
        _overlap(c, ["a"], [short], block, [(4, 3)])  # the 3 lookup tokens accepted, the block's 43 not
        assert c.acceptance.req["a"].keys() == {"ngram", "merged"}
        acc, att = c.acceptance.req["a"]["ngram"]
        assert acc.tolist() == [1, 1, 1, 0] and att.tolist() == [1, 1, 1, 0]
        acc, att = c.acceptance.req["a"]["merged"]
        assert acc.tolist() == [0, 0, 0, 0] and att.tolist() == [0, 0, 0, 1]


def test_overlap_draft_forward_follows_this_steps_lookup():
    """No probing schedule: the block is drafted in exactly the steps where some request's chosen proposal holds
    DFlash tokens, decided from this step's lookups (and never for prompt lookup alone)."""
    full = np.array([5, 6, 7, 8, 9, 10, 5, 6], dtype=np.int64)  # [5, 6] -> [7, 8, 9, 10]: all 4 slots
    block = np.full((2, 4), 99)
    c = AdaptiveController(k_max=4, mode="both")
    forwards = []
    for _ in range(4):
        _overlap(c, ["a", "b"], [full, full], block, [(4, 4), (4, 4)], forwards)
    assert forwards == []
    _overlap(c, ["a", "b"], [full, np.array([1, 2, 3], dtype=np.int64)], block, [(4, 4), (4, 4)], forwards)
    assert forwards == [2]
    _overlap(c, ["a", "b"], [full, None], block, [(4, 4), (0, 0)], forwards)  # an incomplete history: no lookup
    assert forwards == [2, 2]
    n = AdaptiveController(k_max=4, mode="ngram")
    _overlap(n, ["a"], [np.array([1, 2, 3], dtype=np.int64)], block[:1], [(0, 0)], forwards)
    assert forwards == [2, 2]


def test_length_planner_learns_per_request_and_guard_turns_off():
    t = [0.0]
    p = LengthPlanner(k_max=4, clock=lambda: t[0])
    p.cost.alpha, p.cost.beta = 0.05, 0.001  # verification almost free: draft what is likely accepted
    for _ in range(30):
        ks, dec = p.plan(["good", "bad"])
        t[0] += 0.05
        p.observe(dec, [("good", 4, 4), ("bad", 4, 0)], num_tokens=10, tokens_out=6, decode_only=True)
    assert expected_accepted(p, "good", 4) > 3 > 1 > expected_accepted(p, "bad", 4)
    ks, _ = p.plan(["good", "bad"])
    assert ks[0] == 4 and ks[1] < ks[0]
    # when no speculation measures faster, the guard of this bucket turns speculation off for everyone
    g = p.guard(1)
    g.rate = {"plan": 10.0, "off": 20.0}
    g.arm = "off"
    ks, dec = p.plan(["good", "bad"])
    assert ks == [0, 0] and dec[:2] == (1, "off")
    p.forget(["good"])
    assert "bad" not in p.acceptance.req and ANY in p.acceptance.req["good"]


def test_planner_keeps_rates_per_lookup_context():
    """The same request gets long drafts where its tokens have a prompt-lookup match and none where they do not."""
    t = [0.0]
    p = LengthPlanner(k_max=4, clock=lambda: t[0])
    p.cost.alpha, p.cost.beta = 0.05, 0.01  # held: the steps below are not decode-only, so no cost samples
    for i in range(40):
        ctx = "match" if i % 2 else "nomatch"
        ks, dec = p.plan(["r"], contexts=[ctx])
        assert dec[2] == {"r": ctx}
        t[0] += 0.05
        p.observe(dec, [("r", 4, 4 if ctx == "match" else 0)], num_tokens=5, tokens_out=1, decode_only=False)
    assert p.plan(["r"], contexts=["match"])[0] == [4]
    assert p.plan(["r"], contexts=["nomatch"])[0] == [0]


def test_planner_skips_prefill_and_idle_steps():
    t = [0.0]
    p = LengthPlanner(k_max=2, clock=lambda: t[0])
    p.observe(None, [], 5, 1, True)
    t[0] += 5.0  # idle gap: not a step cost
    p.observe(None, [], 5, 1, True)
    t[0] += 0.01
    p.observe(None, [], 200, 1, False)  # prefill step: not a decode cost
    assert p.cost.num_obs == 0
    t[0] += 0.01
    p.observe(None, [], 5, 1, True)
    assert p.cost.num_obs == 1


def test_guard_drops_steps_decided_by_the_other_arm():
    g = SpeculationGuard(window=2)
    g.record(5, 1.0, arm="off")  # decided before the switch to 'plan': not this arm's sample
    assert g._n == 0
    g.record(5, 1.0, arm="plan")
    g.record(5, 1.0)
    assert g.rate["plan"] == 5.0 and g.arm == "off"
