# SPDX-License-Identifier: Apache-2.0
"""Adaptive drafting policy without vLLM: prompt lookup, acceptance model, online cost model, planner, controller."""
import itertools

import numpy as np
import pytest

from vllm_dflash.adaptive.controller import AdaptiveController
from vllm_dflash.adaptive.ngram import prompt_lookup
from vllm_dflash.adaptive.policy import (AcceptanceModel, SpeculationGuard, StepCostModel, cumulative_acceptance,
                                         plan_lengths)


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


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 0.04
        return self.t


def test_controller_prefers_the_source_that_gets_accepted():
    """A request whose text repeats: prompt lookup is right, the DFlash block is wrong -> n-gram wins, and the
    acceptance counters say so."""
    counts = {}

    class M:
        def inc(self, k, n=1.0):
            counts[k] = counts.get(k, 0) + n

        def observe(self, *a):
            pass

        def set(self, *a):
            pass

    c = AdaptiveController(4, metrics=M(), clock=_Clock())
    text = [3, 4, 5, 6, 7, 8, 9, 10] * 60
    hist = np.array(text[:17])
    for _ in range(60):
        out = c.step(["r"], [hist], np.full((1, 4), 99), query_tokens=5, decode_only=True)
        k = len(out[0])
        assert out[0] == text[len(hist): len(hist) + k] or counts.get("proposals_dflash", 0) > 0
        # the target accepts what matches `text`, then emits its own bonus token
        acc = 0
        while acc < k and out[0][acc] == text[len(hist) + acc]:
            acc += 1
        hist = np.array(text[: len(hist) + acc + 1])
    assert counts["accepted_tokens_ngram"] > 40 and counts.get("accepted_tokens_dflash", 0) == 0
    assert counts["proposals_ngram"] > 30 and c.guard.best == "plan"  # speculating pays: the guard keeps the plan


def test_controller_modes_and_errors():
    with pytest.raises(ValueError, match="adaptive mode"):
        AdaptiveController(4, mode="medusa")
    c = AdaptiveController(4, mode="ngram")
    assert not c.want_dflash()
    assert AdaptiveController(4, mode="dflash").want_dflash()


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
    c = AdaptiveController(4, mode="ngram", clock=_Clock())
    c.guard.arm = "off"
    hist = np.array([3, 4, 5, 6, 3, 4, 5])
    assert c.step(["r"], [hist], None, query_tokens=1, decode_only=True) == [[]]
    assert not c.want_dflash()


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
    c = AdaptiveController(4, mode="ngram", clock=_Clock())
    c.want_dflash(num_reqs=32)
    c.guard.arm = "off"  # at batch 32 speculation was measured slower
    hist = np.array([3, 4, 5, 6, 3, 4, 5])
    assert c.step(["r"], [hist], None, query_tokens=1, decode_only=True) == [[6, 3, 4, 5]]  # batch 1: plan
    ids = [f"r{i}" for i in range(32)]
    assert c.step(ids, [hist] * 32, None, query_tokens=32, decode_only=True) == [[]] * 32  # batch 32: off
    assert c.guards[5].arm == "off" and c.guards[0].arm == "plan"
