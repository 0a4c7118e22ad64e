# SPDX-License-Identifier: Apache-2.0
"""Adaptive drafting policy without vLLM: prompt lookup, acceptance model, online cost model, planner, controller."""
import itertools

import numpy as np
import pytest

from support.clock import StepClock
from vllm_dflash.adaptive.controller import AdaptiveController, StepPlan, merge
from vllm_dflash.adaptive.ngram import prompt_lookup
from vllm_dflash.adaptive.policy import (AcceptanceModel, SpeculationGuard, StepCostModel, cumulative_acceptance,
                                         plan_lengths, predicted_speedup)
from vllm_dflash.serve.metric_names import COUNTERS, HISTOGRAMS, series_key


def _lookup_loop(h, k, lo, hi):
    h = list(h)
    for n in range(min(hi, len(h) - 1), lo - 1, -1):
        suf = h[-n:]
        for j in range(len(h) - 1 - n, -1, -1):  # latest occurrence ending before the last token
            if h[j:j + n] == suf:
                return h[j + n:j + n + k]
    return []


def test_prompt_lookup_matches_a_loop():
    rng = np.random.default_rng(0)
    for _ in range(500):
        h = rng.integers(0, int(rng.integers(2, 6)), size=int(rng.integers(1, 60)))
        lo = int(rng.integers(1, 4))
        hi = lo + int(rng.integers(0, 4))
        assert prompt_lookup(h, 5, lo, hi).tolist() == _lookup_loop(h, 5, lo, hi), (h.tolist(), lo, hi)


def test_prompt_lookup_ignores_matches_across_token_boundaries():
    """The lookup searches the ids' bytes: ids whose bytes overlap shifted (0, 1, 256, 65536, 2**40, ...) must not
    produce a match that straddles two ids, and int32 histories work like int64 ones."""
    rng = np.random.default_rng(1)
    alphabet = np.array([0, 1, 256, 257, 65536, 1 << 40, (1 << 40) + 256, 49151], dtype=np.int64)
    for _ in range(500):
        h = alphabet[rng.integers(0, int(rng.integers(2, len(alphabet) + 1)), size=int(rng.integers(1, 80)))]
        lo = int(rng.integers(1, 4))
        hi = lo + int(rng.integers(0, 4))
        assert prompt_lookup(h, 5, lo, hi).tolist() == _lookup_loop(h, 5, lo, hi), (h.tolist(), lo, hi)
    h32 = np.array([7, 256, 9, 7, 256], dtype=np.int32)
    assert prompt_lookup(h32, 3).tolist() == [9, 7, 256]


def test_prompt_lookup_copies_the_prompt():
    prompt = np.array([5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 6, 7])
    assert prompt_lookup(prompt, 4).tolist() == [8, 9, 10, 11]
    assert prompt_lookup(np.array([1, 2, 3]), 4).tolist() == []


def test_cost_model_recovers_a_line():
    m = StepCostModel(alpha=0.1, beta=0.0)  # a wrong prior
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 64))
        m.observe(n, 0.027 + 0.00185 * n + rng.normal(0, 0.0005))
    assert m.alpha == pytest.approx(0.027, abs=0.002) and m.beta == pytest.approx(0.00185, rel=0.1)


def test_cost_model_separates_request_cost_from_token_cost():
    """A batch draining from 32 requests to 1 while the plan's draft lengths move: T = 20 ms + 0.2 ms per query token
    + 1.5 ms per request. Fitted per request, the draft-token slope is the true 0.2 ms; one slope over n (no num_reqs)
    charges the per-request cost to every query token and reads it 2.5 times dearer or more."""
    rng = np.random.default_rng(0)
    two, one = StepCostModel(), StepCostModel()
    for step in range(300):  # down to 8 requests
        B = 32 - step // 12
        n = B + int(rng.integers(B, 2 * B + 1))  # 1..2 drafts per request on average
        t = 0.020 + 0.0002 * n + 0.0015 * B + rng.normal(0, 0.0005)
        two.observe(n, t, B)
        one.observe(n, t)
    assert two.beta == pytest.approx(0.0002, abs=0.0001) and two.delta == pytest.approx(0.0015, abs=0.0003)
    assert one.beta > 2.5 * 0.0002  # the one-slope fit
    assert two(60, 20) == pytest.approx(0.020 + 0.0002 * 60 + 0.0015 * 20, rel=0.05)


def test_cost_model_slopes_stay_non_negative():
    """Steps that got faster with more requests (noise, a machine speeding up) never make a request or a token
    'free': delta and beta are held at 0, not fitted negative, and the level still matches the data."""
    m = StepCostModel()
    rng = np.random.default_rng(1)
    for step in range(200):
        B = int(rng.integers(1, 33))
        m.observe(2 * B, 0.06 - 0.0005 * B + rng.normal(0, 0.0002), B)
    assert m.beta >= 0.0 and m.delta >= 0.0
    assert m(32, 16) == pytest.approx(0.052, rel=0.1)


def test_cost_model_separates_produced_token_cost_from_query_token_cost():
    """Served at concurrency 32 on two cores, each produced token costs streaming work that lands in the step time.
    T = 20 ms + 0.2 ms per query token + 0.3 ms per produced token, with produced tokens following drafted ones
    (acceptance 0.4-0.8): fitted per produced token (per_output), the draft-token slope is the true 0.2 ms; without
    it the draft tokens carry the produced tokens' cost and read at least 1.5 times dearer."""
    rng = np.random.default_rng(0)
    three, two = StepCostModel(per_output=True), StepCostModel()
    for step in range(400):
        B = 32 - step // 40
        drafted = int(rng.integers(0, 3 * B + 1))
        produced = B + int(rng.binomial(drafted, rng.uniform(0.4, 0.8)))
        t = 0.020 + 0.0002 * (B + drafted) + 0.0003 * produced + rng.normal(0, 0.0005)
        three.observe(B + drafted, t, B, produced)
        two.observe(B + drafted, t, B)
    assert three.beta == pytest.approx(0.0002, abs=0.00007) and three.gamma == pytest.approx(0.0003, abs=0.0001)
    assert two.beta > 1.5 * 0.0002 and two.gamma == 0.0
    assert three(60, 20, 40) == pytest.approx(0.020 + 0.0002 * 60 + 0.0003 * 40, rel=0.05)


def test_planner_drafts_more_when_produced_tokens_carry_their_own_cost():
    """The same measured step times, charged to produced tokens (gamma) rather than to query tokens: a proposal whose
    tokens are usually accepted is worth verifying in the first model, not in the second."""
    gains = [cumulative_acceptance(np.full(4, 0.8), 4)] * 32  # P(i) = 0.8^i
    dear = StepCostModel(alpha=0.020, beta=0.0005, delta=0.0)  # 0.5 ms a query token
    split = StepCostModel(alpha=0.020, beta=0.0002, delta=0.0, gamma=0.0003)  # 0.2 + 0.3 per produced token
    assert sum(plan_lengths(gains, split)) > sum(plan_lengths(gains, dear))


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_small_spd_solve_matches_lapack(n):
    """The cost model's LAPACK-free solve (Cholesky on the ridge normal equations) equals numpy.linalg.solve on
    badly scaled SPD systems like the fit's (columns 1, query tokens ~ 10-300, requests ~ 1-32, produced ~ 1-200)."""
    from vllm_dflash.adaptive.step_cost import _solve_spd

    rng = np.random.default_rng(n)
    for _ in range(100):
        X = rng.normal(size=(20, n)) * np.array([1.0, 300.0, 32.0, 200.0])[:n]
        A, y = X.T @ X + 1e-3 * np.eye(n), rng.normal(size=n)
        np.testing.assert_allclose(_solve_spd(A.tolist(), y.tolist()), np.linalg.solve(A, y), rtol=1e-7, atol=1e-12)


def test_cost_model_without_spread_keeps_the_slope():
    m = StepCostModel(alpha=0.03, beta=0.002)
    for _ in range(50):
        m.observe(8, 0.05)
    assert m(8) == pytest.approx(0.05, rel=0.05)


def _brute(gains, cost, extra=0):
    best, arg = -1.0, None
    for ks in itertools.product(*[range(len(g) + 1) for g in gains]):
        tok = len(gains) + sum(float(np.sum(g[:k])) for g, k in zip(gains, ks))
        v = tok / cost(len(gains) + extra + sum(ks))
        if v > best + 1e-12:
            best, arg = v, ks
    return best, arg


@pytest.mark.parametrize("seed", range(30))
def test_planner_is_optimal(seed):
    rng = np.random.default_rng(seed)
    B = int(rng.integers(1, 4))
    gains = [cumulative_acceptance(rng.uniform(0, 1, 4), int(rng.integers(0, 5))) for _ in range(B)]
    cost = StepCostModel(alpha=float(rng.uniform(0.01, 0.05)), beta=float(rng.uniform(0, 0.01)))
    ks = plan_lengths(gains, cost)
    tok = B + sum(float(np.sum(g[:k])) for g, k in zip(gains, ks))
    best, _ = _brute(gains, cost)
    assert tok / cost(B + sum(ks)) == pytest.approx(best, rel=1e-9)


def test_planner_turns_speculation_off_when_verification_is_dear():
    gains = [cumulative_acceptance(np.full(7, 0.2), 7)] * 8
    assert plan_lengths(gains, StepCostModel(alpha=0.027, beta=0.0019)) == [0] * 8  # 2-core CPU, batch 8
    assert all(k >= 1 for k in plan_lengths(gains, StepCostModel(alpha=0.03, beta=0.0)))  # flat cost: draft


def test_acceptance_model_tracks_a_request():
    a = AcceptanceModel(4, prior={"dflash": 0.5, "ngram": 0.5})
    for _ in range(20):
        a.observe("r", "ngram", 4, 4)
        a.observe("s", "ngram", 4, 0)
    assert a.rates("r", "ngram")[0] > 0.8 > 0.2 > a.rates("s", "ngram")[0]
    assert a.rates("new", "ngram")[0] == pytest.approx(a.global_rates("ngram")[0])
    assert a.rates("new", "dflash")[0] == pytest.approx(0.5)  # untouched source keeps its prior


def test_reexploration_fades_an_idle_request_back_to_the_global_rate():
    """Setting reexplore_steps: a request whose drafts failed is judged by its own record only while that record is
    fresh; each step it verifies no draft of the source fades the record (half-life in steps), so its rate returns to
    the global one and the planner tries it again. Without it (idle_decay 1) the record never changes."""
    for idle_decay, back in ((0.5 ** (1 / 8), True), (1.0, False)):
        a = AcceptanceModel(4, prior={"dflash": 0.6, "ngram": 0.5}, idle_decay=idle_decay)
        for _ in range(6):
            a.tick()
            a.observe("bad", "dflash", 4, 0)
            a.observe("busy", "dflash", 4, 0)
        low = a.rates("bad", "dflash")[0]
        assert low < 0.5 * a.global_rates("dflash")[0]
        for _ in range(80):  # "busy" keeps verifying (its record stays its own); "bad" drafts nothing
            a.tick()
            a.observe("busy", "dflash", 4, 0)
        g = a.global_rates("dflash")[0]
        if back:
            assert a.rates("bad", "dflash")[0] == pytest.approx(g, rel=0.05)
            assert a.rates_batch(["bad"], "dflash")[0, 0] == pytest.approx(a.rates("bad", "dflash")[0])
        else:
            assert a.rates("bad", "dflash")[0] < 0.5 * g
        assert a.rates("busy", "dflash")[0] < 0.5 * g  # observed every step: never faded


def test_reexploration_keeps_one_idle_step_unfaded():
    """The step right after an observation reads the record as it was (a request that drafts every step is never
    faded), and an observation after idle steps builds on the faded record."""
    a = AcceptanceModel(4, prior={"dflash": 0.6}, idle_decay=0.5)
    a.tick()
    a.observe("r", "dflash", 4, 0)
    before = a.rates("r", "dflash").copy()
    a.tick()
    assert np.allclose(a.rates("r", "dflash"), before)
    a.tick()
    a.tick()  # two steps with no observation past the first: the record is faded by 0.5 ** 2
    acc, att = a.req["r"]["dflash"]
    own_att = a._own("r", "dflash")[1]
    assert np.allclose(own_att, att * 0.25)
    a.observe("r", "dflash", 4, 4)
    assert np.allclose(a.req["r"]["dflash"][1], own_att * a.request_decay + 1.0)


class _Counts(dict):
    """A metrics sink that keeps the counters, one labelled by source under `<name>_<source>` (proposals_ngram)."""

    def inc(self, k, n=1.0, **labels):
        series_key(k, labels)  # a family the collector exports, with its labels
        k = "_".join((k, *labels.values()))
        self[k] = self.get(k, 0) + n

    def declare(self, *names, **labels):
        assert all(n in COUNTERS or n in HISTOGRAMS for n in names), names

    def observe(self, *a):
        pass

    def set(self, *a, **labels):
        pass


def _step(c, req_ids, hists, block, forwards=None, query_tokens=1):
    """One synchronous step as the drafter runs it: plan, the draft forward only if the plan needs it, propose."""
    plan = c.plan(req_ids, hists, query_tokens=query_tokens, decode_only=True)
    if plan.needs_block and forwards is not None:
        forwards.append(len(req_ids))
    return c.propose(plan, block if plan.needs_block else None)


def test_controller_prefers_the_source_that_gets_accepted():
    """A request whose text repeats: prompt lookup is right, the DFlash block is wrong -> n-gram wins, and the
    acceptance counters say so."""
    counts = _Counts()
    c = AdaptiveController(4, metrics=counts, clock=StepClock())
    text = [3, 4, 5, 6, 7, 8, 9, 10] * 60
    hist = np.array(text[:17])
    for _ in range(60):
        out = _step(c, ["r"], [hist], np.full((1, 4), 99), query_tokens=5)
        k = len(out[0])
        assert out[0] == text[len(hist): len(hist) + k] or counts.get("proposals_dflash", 0) > 0
        # the target accepts what matches `text`, then emits its own bonus token
        acc = 0
        while acc < k and out[0][acc] == text[len(hist) + acc]:
            acc += 1
        hist = np.array(text[: len(hist) + acc + 1])
    assert counts["accepted_tokens_ngram"] > 40 and counts.get("accepted_tokens_dflash", 0) == 0
    assert counts["proposals_ngram"] > 30 and c.guard.best == "plan"  # speculating pays: the guard keeps the plan
    assert counts["request_steps"] == 60


def test_controller_modes_and_errors():
    with pytest.raises(ValueError, match="adaptive mode"):
        AdaptiveController(4, mode="medusa")
    for mode, block in [("ngram", False), ("dflash", True), ("merged", True), ("both", True)]:
        c = AdaptiveController(4, mode=mode, clock=StepClock())
        # no prompt-lookup match: the block is needed wherever DFlash is a source
        assert c.plan(["r"], [np.array([1, 2, 3])], query_tokens=1, decode_only=True).needs_block is block, mode


def test_guard_turns_speculation_off_when_it_is_slower():
    g = SpeculationGuard(window=4, explore_every=3)
    arms = []
    for _ in range(60):
        arms.append(g.arm)
        g.record(10.0 if g.arm == "plan" else 12.0, 1.0)  # no speculation measures 20% faster
    assert g.best == "off" and g.rate["off"] == pytest.approx(12.0)
    steady = arms[16:]
    assert steady.count("off") > 2 * steady.count("plan") > 0  # mostly off, still re-measuring the plan
    h = SpeculationGuard(window=4, explore_every=3)
    for _ in range(40):
        h.record(15.0 if h.arm == "plan" else 12.0, 1.0)
    assert h.best == "plan"


def test_controller_obeys_the_guard():
    c = AdaptiveController(4, mode="ngram", clock=StepClock())
    c.guard.arm = "off"
    plan = c.plan(["r"], [np.array([3, 4, 5, 6, 3, 4, 5])], query_tokens=1, decode_only=True)
    assert not plan.needs_block and c.propose(plan, None) == [[]]
    d = AdaptiveController(4, mode="both", clock=StepClock())
    d.guard.arm = "off"
    no_match = np.array([1, 2, 3])
    assert not d.plan(["r"], [no_match], query_tokens=1, decode_only=True).needs_block  # the guard wins


def test_a_measured_off_step_reads_no_history():
    """Where 'off' was measured faster, a step plans nothing, so it reads none of the histories (the drafter's are
    lazy copies: none is made); the plan's starts still come from their lengths."""
    class Unread(list):
        lengths = [7]

        def __getitem__(self, i):
            raise AssertionError("a history was read")

        def __iter__(self):
            raise AssertionError("the histories were iterated")

    c = AdaptiveController(4, mode="both", clock=StepClock())
    c.guard.arm, c.guard.rate["off"] = "off", 10.0
    plan = c.plan(["r"], Unread([None]), query_tokens=1, decode_only=True)
    assert plan.ks == [0] and plan.starts == [7] and c.propose(plan, None) == [[]]


def test_guard_compares_each_window_with_both_of_its_flanks():
    """The plan is 20 % faster throughout, but the machine speeds up while the guard measures: the plan's first
    window (1.38 tokens/s) is slower than the 'off' window after it (1.55). Judged against the mean of the plan
    windows before and after it (1.86), 'off' loses; a sequential comparison would have turned speculation off."""
    g = SpeculationGuard(window=4, explore_every=2)
    arms, step = [], 0
    while g.rate["off"] is None or g._exploring or g._explored is not None:
        arms.append(g.arm)
        base = 1.0 + 0.1 * step  # the machine's speed, rising 10 % of its first step's per step
        g.record((1.2 if g.arm == "plan" else 1.0) * base, 1.0)
        step += 1
    assert arms == ["plan"] * 4 + ["off"] * 4 + ["plan"] * 4  # plan, off, then the plan again as its flank
    assert g.rate["off"] == pytest.approx(1.55) and g.rate["plan"] == pytest.approx((1.38 + 2.34) / 2)
    assert g.best == "plan" and g.arm == "plan"
    # the same drift, slowing down: still the plan
    h = SpeculationGuard(window=4, explore_every=2)
    for step in range(12):
        h.record((1.2 if h.arm == "plan" else 1.0) * (3.0 - 0.1 * step), 1.0)
    assert h.rate["off"] is not None and h.best == "plan"


def test_guard_backs_off_exploring_a_confirmed_loser():
    g = SpeculationGuard(window=2, explore_every=2, max_gap=8)
    arms = []
    for _ in range(400):
        arms.append(g.arm)
        g.record(10.0 if g.arm == "plan" else 12.0, 1.0)
    assert g.best == "off" and g.gap == 8
    windows = arms[::2]
    plan_windows = [i for i, a in enumerate(windows) if a == "plan"]
    gaps = np.diff(plan_windows[1:])  # after the first window: gaps between re-measurements grow to max_gap + 1
    assert gaps[0] < gaps[-1] == 9
    assert windows[-40:].count("plan") <= 5  # at most 1 window in 9 pays for exploration once confirmed


def test_guard_flip_resets_the_gap():
    g = SpeculationGuard(window=1, explore_every=2, max_gap=16)
    fast = "off"
    for i in range(300):
        if i == 150:
            fast = "plan"  # the machine changes: speculation now pays
        g.record(12.0 if g.arm == fast else 10.0, 1.0)
    assert g.best == "plan"


def test_controller_keeps_a_guard_per_batch_size():
    from vllm_dflash.adaptive.policy import batch_bucket

    assert [batch_bucket(n) for n in (1, 2, 3, 4, 7, 8, 31, 32)] == [0, 1, 1, 2, 2, 3, 4, 5]
    c = AdaptiveController(4, mode="ngram", clock=StepClock())
    c.guards[batch_bucket(32)] = SpeculationGuard()
    c.guards[batch_bucket(32)].arm = "off"  # at batch 32 speculation was measured slower
    hist = np.array([3, 4, 5, 6, 3, 4, 5])
    assert _step(c, ["r"], [hist], None) == [[6, 3, 4, 5]]  # batch 1: plan
    ids = [f"r{i}" for i in range(32)]
    assert _step(c, ids, [hist] * 32, None, query_tokens=32) == [[]] * 32  # batch 32: off
    assert c.guards[5].arm == "off" and c.guards[0].arm == "plan"


def test_merge_puts_lookup_tokens_first():
    block = np.array([40, 41, 42, 43])
    assert merge(np.array([7, 8]), block, 4).tolist() == [7, 8, 42, 43]  # block token j stays in slot j
    assert merge(np.zeros(0, dtype=np.int64), block, 4).tolist() == [40, 41, 42, 43]
    assert merge(np.array([7, 8, 9, 10, 11]), block, 4).tolist() == [7, 8, 9, 10]
    assert merge(np.array([7, 8]), None, 4).tolist() == [7, 8]  # not drafted: the lookup alone


def test_controller_merges_short_lookups_and_scores_each_part_as_its_source():
    """'both': a request whose lookup is shorter than k gets lookup + block tail (the merged source: the lookup's
    rates in its lookup slots, then the block-after-lookup rates, so it beats the bare lookup whenever the tail can
    be accepted); one with a full lookup gets the lookup; one without a match the block. A merged proposal's outcome
    scores its lookup slots as prompt lookup and its block slots as 'merged', and only slots the target reached."""
    counts = _Counts()
    c = AdaptiveController(4, mode="both", metrics=counts, clock=StepClock())
    c.cost.alpha, c.cost.beta = 0.03, 0.0  # verification is free: every request drafts its whole proposal
    short = np.array([1, 2, 3, 1, 2])  # [1, 2] -> [3, 1, 2]: 3 of 4 slots
    full = np.array([5, 6, 7, 8, 9, 10, 5, 6])  # [5, 6] -> [7, 8, 9, 10]
    none = np.array([11, 12, 13])
    block = np.array([[40, 41, 42, 43], [50, 51, 52, 53], [60, 61, 62, 63]])
    plan = c.plan(["s", "f", "n"], [short, full, none], query_tokens=3, decode_only=True)
    assert plan.sources == ["merged", "ngram", "dflash"] and plan.needs_block
    assert c.propose(plan, block) == [[3, 1, 2, 43], [7, 8, 9, 10], [60, 61, 62, 63]]
    att = {s: c.acceptance.att[s].copy() for s in ("dflash", "ngram", "merged")}
    # the target accepted 3, 1 (then its own token 5): 2 of the merged proposal, both lookup slots
    _step(c, ["s"], [np.concatenate([short, [3, 1, 5]])], block[:1])
    assert counts["accepted_tokens_merged"] == 2 and counts["proposals_merged"] == 1
    assert counts["drafted_tokens_merged"] == 4 and counts["request_steps"] == 4
    seen = c.acceptance.att["ngram"] - att["ngram"] * c.acceptance.decay  # slots whose outcome prompt lookup saw
    assert np.allclose(seen, [1, 1, 1, 0]), seen  # slots 1-2 accepted, slot 3 rejected; slot 4 never reached
    assert np.array_equal(c.acceptance.att["merged"], att["merged"])  # the block slot was never reached
    assert np.array_equal(c.acceptance.att["dflash"], att["dflash"])

    # the whole lookup accepted and the block's slot 4 too: lookup slots 1-3 to ngram, slot 4 to merged
    c2 = AdaptiveController(4, mode="both", clock=StepClock())
    c2.cost.alpha, c2.cost.beta = 0.03, 0.0
    plan = c2.plan(["s"], [short], query_tokens=1, decode_only=True)
    assert plan.sources == ["merged"]
    c2.propose(plan, block[:1])
    att = {s: (c2.acceptance.acc[s].copy(), c2.acceptance.att[s].copy()) for s in ("ngram", "merged")}
    _step(c2, ["s"], [np.concatenate([short, [3, 1, 2, 43, 9]])], block[:1])
    d = c2.acceptance.decay
    assert np.allclose(c2.acceptance.acc["ngram"] - att["ngram"][0] * d, [1, 1, 1, 0])
    assert np.allclose(c2.acceptance.att["merged"] - att["merged"][1] * d, [0, 0, 0, 1])
    assert np.allclose(c2.acceptance.acc["merged"] - att["merged"][0] * d, [0, 0, 0, 1])


def test_merged_proposal_is_valued_by_the_lookup_rates_in_its_lookup_slots():
    """A request whose lookups keep being accepted and whose block tails keep being rejected: the merged candidate
    is worth its lookup part (never less than the bare lookup) and the planner stops paying for the tail."""
    c = AdaptiveController(4, mode="both", clock=StepClock())
    for _ in range(200):
        c.acceptance.observe("r", "ngram", 2, 2)
        c.acceptance.observe("r", "merged", 4, 2, start=2)  # every tail slot rejected
    p_merged = c._gain_table(["r"], np.array([2]))["merged"][0]
    p_ngram = np.cumprod(c.acceptance.rates("r", "ngram"))[:2]
    assert np.allclose(p_merged[:2], p_ngram) and p_merged[2] < 0.05


def test_merged_mode_always_merges():
    c = AdaptiveController(4, mode="merged", clock=StepClock())
    c.cost.alpha, c.cost.beta = 0.03, 0.0
    block = np.array([[40, 41, 42, 43], [50, 51, 52, 53]])
    plan = c.plan(["f", "n"], [np.array([5, 6, 7, 8, 9, 10, 5, 6]), np.array([11, 12, 13])], query_tokens=2,
                  decode_only=True)
    assert plan.sources == ["merged", "merged"] and plan.needs_block  # "n" has no match: the block fills all 4
    assert c.propose(plan, block) == [[7, 8, 9, 10], [50, 51, 52, 53]]
    plan = c.plan(["f"], [np.array([5, 6, 7, 8, 9, 10, 5, 6, 7])], query_tokens=2, decode_only=True)
    assert not plan.needs_block  # a full lookup: the block would not be used, no draft forward


def test_draft_forward_follows_this_steps_lookup():
    """The draft forward runs exactly in the steps whose plan verifies a DFlash token, whatever the previous step
    chose (no probing schedule): a full lookup for everyone -> none; a request without a match -> one."""
    c = AdaptiveController(4, mode="both", clock=StepClock())
    c.cost.alpha, c.cost.beta = 0.03, 0.0
    full = np.array([5, 6, 7, 8, 9, 10, 5, 6])
    block = np.full((2, 4), 99)
    forwards = []
    for _ in range(5):
        _step(c, ["a", "b"], [full, full], block, forwards)
    assert forwards == []  # prompt lookup covered every slot of every request
    _step(c, ["a", "b"], [full, np.array([1, 2, 3])], block, forwards)
    assert forwards == [2]  # "b" lost its match: the block is drafted in this very step


def test_needs_block_counts_only_verified_block_tokens():
    look = np.array([1, 2])
    assert not StepPlan(["r"], [0], [look], ["merged"], [2]).needs_block  # verifies only the lookup part
    assert StepPlan(["r"], [0], [look], ["merged"], [3]).needs_block
    assert not StepPlan(["r"], [0], [look], ["dflash"], [0]).needs_block
    assert not StepPlan(["r"], [0], [look], ["ngram"], [2]).needs_block


def test_guard_measures_off_once_then_trusts_a_clear_forecast():
    """Re-measuring 'off' costs a window without speculation per batch-size bucket: with a forecast of 2x the guard
    measures 'off' once, and after the plan won it keeps the plan; a forecast never replaces that first measurement
    (a plan forecast at 2x that runs slower turns speculation off); a measured loss beats any later forecast."""
    sure = SpeculationGuard(window=4, explore_every=2)
    arms = []
    for _ in range(80):
        sure.predict(2.0)
        arms.append(sure.arm)
        sure.record(10.0 if sure.arm == "plan" else 8.0, 1.0)
    assert sure.rate["off"] is not None and sure.best == "plan"
    assert arms.count("off") == 4 and "off" not in arms[16:]  # one flanked comparison (4 steps), never again
    wrong = SpeculationGuard(window=4, explore_every=2)
    for _ in range(40):
        wrong.predict(2.0)  # the forecast says 2x, the plan runs at 10 tokens/s against 12 without speculation
        wrong.record(10.0 if wrong.arm == "plan" else 12.0, 1.0)
    assert wrong.best == "off" and wrong.arm == "off"
    unsure = SpeculationGuard(window=4, explore_every=2)
    arms = []
    for _ in range(40):
        unsure.predict(1.05)
        arms.append(unsure.arm)
        unsure.record(10.0 if unsure.arm == "plan" else 12.0, 1.0)
    assert "off" in arms and unsure.best == "off"
    unsure.predict(5.0)  # a rosy forecast after 'off' was measured faster does not bring the plan back
    assert not unsure.sure
    for _ in range(8):
        unsure.predict(5.0)
        unsure.record(12.0 if unsure.arm == "off" else 10.0, 1.0)
    assert unsure.best == "off"


def test_predicted_speedup_of_a_plan():
    from vllm_dflash.adaptive.policy import predicted_speedup

    cost = StepCostModel(alpha=0.03, beta=0.0)  # flat step cost (memory-bound): drafts are free to verify
    gains = [np.array([0.5, 0.25])]
    assert predicted_speedup(gains, [2], cost) == pytest.approx(1.75)
    assert predicted_speedup(gains, [0], cost) == pytest.approx(1.0)
    steep = StepCostModel(alpha=0.0, beta=0.01)  # compute-bound: 3 query tokens cost 3x one
    assert predicted_speedup(gains, [2], steep) == pytest.approx(1.75 / 3)


def test_the_draft_forward_is_weighed_as_a_cost_of_the_whole_step():
    """One request has a prompt-lookup match, one has none. With a cheap draft forward the second drafts from the
    DFlash block; when the forward costs more than it brings, the plan takes prompt lookup alone and the forward
    does not run."""
    match, nomatch = np.array([3, 4, 5, 6, 3, 4, 5]), np.array([1, 2, 3])
    cheap = AdaptiveController(4, mode="both", clock=StepClock())
    cheap.block_cost = StepCostModel(alpha=0.0, beta=0.0)
    plan = cheap.plan(["a", "b"], [match, nomatch], query_tokens=2, decode_only=True)
    assert plan.needs_block and plan.ks[1] > 0 and plan.sources[1] in ("dflash", "merged")
    dear = AdaptiveController(4, mode="both", clock=StepClock())
    dear.block_cost = StepCostModel(alpha=1.0, beta=0.0)  # a 1 s draft forward next to a 30 ms step
    plan = dear.plan(["a", "b"], [match, nomatch], query_tokens=2, decode_only=True)
    assert not plan.needs_block and plan.sources[0] == "ngram" and plan.ks[0] > 0 and plan.ks[1] == 0


def test_draft_forward_time_is_fitted_apart_from_the_step_cost():
    """observe_block feeds the block's own cost model and is taken out of the next step-cost sample (the clock ticks
    40 ms per call; a 30 ms forward leaves 10 ms for the step)."""
    c = AdaptiveController(4, mode="dflash", clock=StepClock())
    c.plan(["r"], [np.array([1, 2, 3])], query_tokens=1, decode_only=True)
    c.observe_block(1, 0.03)
    seen = []
    c.cost.observe = lambda n, dt, reqs=0, out=0, solve=True: seen.append((n, round(dt, 6), reqs))
    c.plan(["r"], [np.array([1, 2, 3, 4])], query_tokens=8, decode_only=True)
    assert seen == [(8, 0.01, 1)] and c.block_cost.num_obs == 1


def test_injection_of_held_rows_stays_out_of_the_block_cost_fit():
    """The held context rows a draft forward injects first leave the step's cost sample with the forward, but the
    block's cost model sees the forward alone: its fit gets 30 - 25 = 5 ms, the step sample 40 - 30 = 10 ms."""
    c = AdaptiveController(4, mode="dflash", clock=StepClock())
    fitted = []
    c.block_cost.observe = lambda rows, dt: fitted.append((rows, round(dt, 6)))
    c.plan(["r"], [np.array([1, 2, 3])], query_tokens=1, decode_only=True)
    c.observe_block(1, 0.03, injection_s=0.025)
    seen = []
    c.cost.observe = lambda n, dt, reqs=0, out=0, solve=True: seen.append((n, round(dt, 6), reqs))
    c.plan(["r"], [np.array([1, 2, 3, 4])], query_tokens=8, decode_only=True)
    assert fitted == [(1, 0.005)] and seen == [(8, 0.01, 1)]


def test_a_measured_off_arm_plans_nothing():
    """Once 'off' was measured faster for this batch size, a step does no prompt lookup and no planning: the host
    work of a non-speculating step does not grow with the batch."""
    c = AdaptiveController(4, mode="both", clock=StepClock())
    calls = []
    orig = c._lookup
    c._lookup = lambda r, h: (calls.append(1), orig(r, h))[1]
    ids = [f"r{i}" for i in range(32)]
    hist = np.array([3, 4, 5, 6, 3, 4, 5])
    c.plan(ids, [hist] * 32, query_tokens=32, decode_only=True)
    assert len(calls) == 32  # planning as usual
    g = c.guards[c._bucket]
    g.arm, g.rate["off"], g.rate["plan"] = "off", 12.0, 10.0
    calls.clear()
    plan = c.plan(ids, [hist] * 32, query_tokens=32, decode_only=True)
    assert calls == [] and plan.sources == ["none"] * 32 and not plan.needs_block
    assert c.propose(plan, None) == [[]] * 32


def test_the_step_cost_fit_is_solved_only_when_a_plan_weighs_drafts():
    """Each step's cost sample enters the fit at once, but the fit is solved (a few small solves in Python) only when
    a plan weighs drafts while it is young (under 32 samples), and every 16th sample: a step under a measured 'off'
    arm solves nothing; the next step that plans solves it for every sample so far (the same fit as solving after
    each); past 32 samples a plan solves nothing."""
    c = AdaptiveController(4, mode="both", clock=StepClock())
    solves = []
    solve = StepCostModel._solve
    StepCostModel._solve = lambda self: (solves.append(1), solve(self))[1]
    try:
        ids, hist = [f"r{i}" for i in range(8)], np.array([3, 4, 5, 6, 3, 4, 5])
        for _ in range(3):
            c.plan(ids, [hist] * 8, query_tokens=8, decode_only=True)
        assert solves and c.cost.num_obs == 2
        g = c.guards[c._bucket]
        g.arm, g.rate["off"], g.rate["plan"] = "off", 12.0, 10.0
        solves.clear()
        for _ in range(4):
            c.plan(ids, [hist] * 8, query_tokens=8, decode_only=True)
        assert solves == [] and c.cost.num_obs == 6  # observed, not solved
        g.arm = "plan"
        c.plan(ids, [hist] * 8, query_tokens=8, decode_only=True)
        assert len(solves) >= 1 and not c.cost._unsolved  # a young fit: solved when a plan weighs drafts
        for _ in range(41):  # past YOUNG_FIT (32) samples: solved every 16th sample (48 here), not at each plan
            c.plan(ids, [hist] * 8, query_tokens=8, decode_only=True)
        solves.clear()
        c.plan(ids, [hist] * 8, query_tokens=8, decode_only=True)
        assert c.cost.num_obs > 32 and solves == [] and c.cost._unsolved
    finally:
        StepCostModel._solve = solve
    eager = StepCostModel(per_output=True)
    lazy = StepCostModel(per_output=True)
    for n, s in [(8, 0.05), (40, 0.08), (16, 0.06), (64, 0.11)]:
        eager.observe(n, s, 8, 9)
        lazy.observe(n, s, 8, 9, solve=False)
    assert lazy.beta == StepCostModel(per_output=True).beta  # the prior until solved
    lazy.refresh()
    assert (lazy.alpha, lazy.beta, lazy.delta, lazy.gamma) == (eager.alpha, eager.beta, eager.delta, eager.gamma)


def _plan_lengths_loop(gains, cost, extra_tokens=0):
    """The planner as one loop over the sorted (request, position) gains: the reference for the array version."""
    B = len(gains)
    items = sorted(((float(g), r) for r, gr in enumerate(gains) for g in gr), key=lambda x: -x[0])
    n0 = float(B + extra_tokens)
    best_val, best_m, total = B / cost(n0), 0, float(B)
    for m, (g, _) in enumerate(items, start=1):
        total += g
        if total / cost(n0 + m) > best_val:
            best_val, best_m = total / cost(n0 + m), m
    k = [0] * B
    for _, r in items[:best_m]:
        k[r] += 1
    return k


@pytest.mark.parametrize("seed", range(40))
def test_array_planner_equals_the_loop(seed):
    """Same lengths as the loop on ragged gains, ties between requests included (every third run draws gains from a
    few values, so equal gains of different requests are common) and flat cost (beta 0: equal values never extend
    the plan)."""
    rng = np.random.default_rng(seed)
    B = int(rng.integers(1, 40))
    values = rng.choice([0.9, 0.5, 0.25, 0.0], size=(B, 7)) if seed % 3 == 0 else rng.uniform(0, 1, (B, 7))
    gains = [cumulative_acceptance(v, int(rng.integers(0, 8))) for v in values]
    cost = StepCostModel(alpha=float(rng.uniform(0.01, 0.09)), beta=0.0 if seed % 4 == 0 else float(rng.uniform(0, 0.003)))
    extra = int(rng.integers(0, 20))
    assert plan_lengths(gains, cost, extra) == _plan_lengths_loop(gains, cost, extra)


def _rates_one(c: AdaptiveController, rid: str, src: str, m: int) -> np.ndarray:
    """One request's conditional acceptance by slot for a proposal of `src` with m lookup tokens: a merged one is
    prompt lookup's in its first m slots and the block-after-lookup rates after (the rule `_gain_table` batches)."""
    rates = c.acceptance.rates(rid, src)
    if src == "merged" and m > 0:
        rates = rates.copy()
        rates[:m] = c.acceptance.rates(rid, "ngram")[:m]
    return rates


def _choose_loop(c: AdaptiveController, rid: str, m: int, block: bool):
    """One request's source choice as the controller made it one request at a time (the reference for the batch)."""
    K = c.k_max
    if not block:
        cands = [] if c.mode == "dflash" else ([("ngram" if c.mode in ("both", "ngram") else "merged", m)] if m else [])
    else:
        cands = {"dflash": [("dflash", K)], "ngram": [("ngram", m)] if m else [], "merged": [("merged", K)]}.get(
            c.mode, [("dflash", K)] + ([("ngram", m)] if m else []) + ([("merged", K)] if 0 < m < K else []))
    best, best_p, best_sum = "none", np.zeros(0), 0.0
    for src, n in cands:
        p = cumulative_acceptance(_rates_one(c, rid, src, m), n)
        if p.sum() > best_sum:
            best, best_p, best_sum = src, p, float(p.sum())
    return best, best_p


@pytest.mark.parametrize("mode", ["both", "dflash", "ngram", "merged"])
def test_batched_source_choice_equals_one_request_at_a_time(mode):
    """The batched chooser (`_gain_table` + `_choose`) picks the same source and the same P(i) per request as the
    per-request rule, with per-request acceptance histories, new requests (global rates only) and every lookup
    length, with and without the draft forward."""
    rng = np.random.default_rng(1)
    K = 5
    c = AdaptiveController(K, mode=mode, clock=StepClock())
    ids = [f"r{i}" for i in range(24)]
    for _ in range(300):
        rid = ids[int(rng.integers(0, 20))]  # r20..r23 never observed: global rates only
        src = ["dflash", "ngram", "merged"][int(rng.integers(0, 3))]
        n = int(rng.integers(1, K + 1))
        c.acceptance.observe(rid, src, n, int(rng.integers(0, n + 1)), start=int(rng.integers(0, 2)))
    m = rng.integers(0, K + 1, size=len(ids))
    m[:6] = [0, 1, K - 1, K, 0, K]
    table = c._gain_table(ids, m)
    for block in (True, False):
        sources, gains = c._choose(table, m, block)
        for i, rid in enumerate(ids):
            src, p = _choose_loop(c, rid, int(m[i]), block)
            assert sources[i] == src, (rid, int(m[i]), block)
            assert np.allclose(gains[i, : len(p)], p, rtol=1e-12, atol=0) and not gains[i, len(p):].any()


def test_a_request_whose_context_was_dropped_drafts_without_dflash():
    """Where 'off' won, the plan says to drop the step's context rows (drop_context; not while 'off' is only being
    re-measured). A request marked by `context_dropped` is then planned from prompt lookup alone: DFlash and
    full-length merged proposals need its whole draft context. Another request keeps every source, and a finished
    request's mark goes with it."""
    c = AdaptiveController(4, mode="both", clock=StepClock())
    match, nomatch = np.array([3, 4, 5, 6, 3, 4, 5]), np.array([1, 2, 3])
    c.plan(["a", "b"], [match, nomatch], query_tokens=2, decode_only=True)
    g = c.guards[c._bucket]
    g.arm, g.rate["off"], g.rate["plan"] = "off", 12.0, 10.0  # 'off' won
    assert c.plan(["a", "b"], [match, nomatch], query_tokens=2, decode_only=True).drop_context
    g.rate["off"], g.rate["plan"] = 10.0, 12.0  # the plan wins; 'off' is being re-measured: keep the rows
    assert not c.plan(["a", "b"], [match, nomatch], query_tokens=2, decode_only=True).drop_context
    g.arm = "plan"
    fresh = c.plan(["a", "b"], [match, nomatch], query_tokens=2, decode_only=True)
    assert fresh.sources[1] in ("dflash", "merged")  # no lookup match: the block is its only source
    c.context_dropped(["b"])
    stale = c.plan(["a", "b"], [match, nomatch], query_tokens=2, decode_only=True)
    assert stale.sources[1] == "none" and stale.ks[1] == 0
    assert stale.sources[0] in ("ngram", "merged", "dflash")  # "a" is not affected
    c.finished(["b"])
    assert c.plan(["a", "b"], [match, nomatch], query_tokens=2, decode_only=True).sources[1] in ("dflash", "merged")


def test_a_stale_request_in_merged_mode_keeps_its_lookup_tokens():
    """adaptive "merged": a request whose context was dropped still verifies its prompt-lookup tokens (the merged
    proposal cut to the lookup's length), and the step needs no draft forward for it."""
    c = AdaptiveController(4, mode="merged", clock=StepClock())
    match = np.array([3, 4, 5, 6, 3, 4, 5])
    c.context_dropped(["a"])
    plan = c.plan(["a"], [match], query_tokens=1, decode_only=True)
    assert plan.sources == ["merged"] and 0 < plan.ks[0] <= len(plan.lookups[0]) and not plan.needs_block


def test_a_dropped_request_that_left_is_forgotten():
    """A request marked by `context_dropped` that never proposed (speculation was off all its life) holds no
    acceptance or pending state; its mark still goes when it leaves the batch (the 64-step prune), so the marks of a
    long-running server whose 'off' keeps winning do not grow without bound."""
    c = AdaptiveController(4, mode="both", clock=StepClock())
    c.context_dropped(["gone"])
    hist = np.array([1, 2, 3])
    for _ in range(64):
        c.plan(["live"], [hist], query_tokens=1, decode_only=True)
    assert "gone" not in c._stale


def test_a_stale_request_in_dflash_mode_drafts_nothing():
    """adaptive "dflash" has no block-free candidate: a request whose context was dropped gets no proposal at all,
    while a fresh one beside it still drafts the block."""
    c = AdaptiveController(4, mode="dflash", clock=StepClock())
    c.context_dropped(["a"])
    plan = c.plan(["a", "b"], [np.array([1, 2, 3])] * 2, query_tokens=2, decode_only=True)
    assert plan.sources[0] == "none" and plan.ks[0] == 0 and plan.sources[1] == "dflash"


def test_planner_charges_a_sampled_requests_verification():
    """issue 54.1: a sampled request's draft costs a rejection-sampler row on top of the step-cost fit. With that
    cost charged (token_cost) the planner drafts less for the sampled request than for the greedy one (alike
    otherwise) and stays optimal by brute force; the forecast includes it."""
    gains = [cumulative_acceptance(np.full(4, 0.5), 4)] * 2
    cost = StepCostModel(alpha=0.03, beta=0.0005)
    free = plan_lengths(gains, cost)
    charged = plan_lengths(gains, cost, token_cost=[0.0, 0.004])
    assert free[0] == free[1] > 0 and charged[1] < charged[0] and charged[1] < free[1]
    # optimal: no other lengths give more expected tokens per second under the charged cost
    def rate(ks):
        tok = 2 + sum(float(np.sum(g[:k])) for g, k in zip(gains, ks))
        return tok / (cost(2 + sum(ks)) + 0.004 * ks[1])
    assert rate(charged) == pytest.approx(max(rate(ks) for ks in itertools.product(range(5), repeat=2)), rel=1e-9)
    assert predicted_speedup(gains, charged, cost, token_cost=[0.0, 0.004]) < predicted_speedup(gains, charged, cost)


def test_controller_charges_only_sampled_requests():
    """The controller hands `sampled_row_s` to the planner for requests marked sampled, never for greedy ones."""
    c = AdaptiveController(4, mode="ngram", clock=StepClock())
    hist = np.array([3, 4, 5, 6, 7, 8, 9, 3, 4, 5, 6, 7, 8, 9, 3, 4, 5])
    c.acceptance.mark_sampled(["s", "g"], [True, False])
    seen = {}
    import vllm_dflash.adaptive.controller as C

    orig = C.plan_lengths

    def spy(gains, cost, extra_tokens=0, token_cost=None):
        seen["token_cost"] = token_cost
        return orig(gains, cost, extra_tokens, token_cost)

    C.plan_lengths = spy
    try:
        c.sampled_row_s = 0.002
        c._best_plan(["s", "g"], [prompt_lookup(hist, 4, 2, 4)] * 2, 0)
        assert list(seen["token_cost"]) == [0.002, 0.0]
        c.sampled_row_s = 0.0
        c._best_plan(["s", "g"], [prompt_lookup(hist, 4, 2, 4)] * 2, 0)
        assert seen["token_cost"] is None
    finally:
        C.plan_lengths = orig


@pytest.mark.parametrize("seed", range(40))
def test_planner_with_token_costs_is_optimal(seed):
    """Per-request draft prices (sampled requests' verification), flat and sloped step costs, ragged proposals:
    the plan is the brute-force optimum, and nothing past a request's proposal is ever planned."""
    rng = np.random.default_rng(100 + seed)
    B = int(rng.integers(1, 4))
    gains = [cumulative_acceptance(rng.uniform(0, 1, 4), int(rng.integers(0, 5))) for _ in range(B)]
    cost = StepCostModel(alpha=float(rng.uniform(0.01, 0.05)), beta=float(rng.choice([0.0, rng.uniform(0, 0.01)])))
    tc = [float(rng.choice([0.0, rng.uniform(0, 0.01)])) for _ in range(B)]
    ks = plan_lengths(gains, cost, token_cost=tc)
    assert all(k <= len(g) for k, g in zip(ks, gains))

    def rate(k):
        tok = B + sum(float(np.sum(g[:n])) for g, n in zip(gains, k))
        return tok / (cost(B + sum(k)) + sum(t * n for t, n in zip(tc, k)))
    best = max(rate(k) for k in itertools.product(*[range(len(g) + 1) for g in gains]))
    assert rate(ks) == pytest.approx(best, rel=1e-9)


class _ManualClock:
    """A clock the test moves: each simulated step advances it by that step's time."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _plan_after_measured_steps(row_s: float, split_cost: bool, K: int = 7) -> tuple[AdaptiveController, list[int]]:
    """issue 62.3: an `AdaptiveController` fed the steps of a machine whose target forward costs F(n) = 20 ms +
    row_s * n for n query rows and the rest of the step 2 ms + 0.4 ms a request, then planning a batch of 8.

    The measured steps run at batch 1-32 with 0-7 drafts a request, but not at 8: that bucket's guard stays unmeasured
    (arm 'plan'), so the plan at batch 8 is the planner's. Acceptance: every request r0..r7 observed at ~0.3 a slot
    (each draft accepted with probability 0.3 after an accepted one). -> (controller, draft lengths at batch 8)."""
    clock = _ManualClock()
    c = AdaptiveController(K, mode="dflash", clock=clock, split_cost=split_cost)
    rng = np.random.default_rng(0)
    ids8 = [f"r{i}" for i in range(8)]
    for _ in range(200):
        for rid in ids8:
            acc = 0
            while acc < K and rng.random() < 0.3:
                acc += 1
            c.acceptance.observe(rid, "dflash", K, acc)
    hists = [np.arange(100 * i, 100 * i + 20) for i in range(32)]  # no repeats: no prompt lookup

    def step(B, n):  # one verified step of B requests and n query rows, then the plan that follows it
        fwd = 0.020 + row_s * n
        clock.t += fwd + 0.002 + 0.0004 * B
        return c.plan([f"w{i}" for i in range(B)] if B != 8 else ids8, hists[:B], query_tokens=n,
                      decode_only=True, forward_s=fwd)

    step(1, 1)  # starts the clock
    for s in range(64):
        B = (1, 2, 3, 4, 6, 16, 24, 32)[s % 8]
        step(B, B * (1 + (s // 8) % (K + 1)))
    plan = step(8, 8)
    assert c.guard.arm == "plan" and c.guard.rate["off"] is None  # the guard decided nothing at batch 8
    return c, plan.ks


@pytest.mark.parametrize("split_cost", [True, False])
def test_planner_declines_drafts_when_measured_verify_rows_are_dear(split_cost):
    """issue 62.3: the decision follows the step costs measured through the controller, not constants. Same
    acceptance (~0.3 a slot), two machines: where every verified row costs 3 ms (a draft adds 0.3 expected tokens
    for 3 ms, against 8 tokens in ~49 ms without drafts) the batch of 8 drafts nothing; where a row costs 0.1 ms it
    drafts. Both fits (the split one the CPU drafter runs, and the whole-step one) read the row cost from the
    measurements. The two controllers differ only in the step times they were fed, so a planner that ignored them
    would plan both batches alike and fail one half (with the steps not fed as cost samples, both fits stay at their
    priors and the cheap machine's batch drafts nothing)."""
    dear, ks = _plan_after_measured_steps(0.003, split_cost)
    assert dear.cost.beta == pytest.approx(0.003, abs=2e-5)
    assert ks == [0] * 8
    cheap, ks = _plan_after_measured_steps(0.0001, split_cost)
    assert cheap.cost.beta == pytest.approx(0.0001, abs=2e-5)
    assert all(k >= 1 for k in ks)
