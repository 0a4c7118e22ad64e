# SPDX-License-Identifier: Apache-2.0
"""The step-cost fit as served: outliers, the forward / host split, the forward timer and the step trace."""
import json

import numpy as np
import pytest
import torch

from vllm_dflash.adaptive.controller import AdaptiveController
from vllm_dflash.adaptive.policy import SplitStepCost, StepCostModel, cumulative_acceptance, plan_lengths
from vllm_dflash.adaptive.trace import read_trace
from vllm_dflash.integration.forward_timer import ForwardTimer


def _served_c32(rng, steps=200, stall_every=25):
    """Steps of a batch of 32 that drafts little (query tokens ~ requests): forward 10 ms + 0.4 ms a query token,
    host 5 ms + 0.3 ms a request + 0.05 ms a produced token, 4 ms of noise on the host, and a 250 ms host stall every
    `stall_every` steps. Yields (n, B, produced, forward_s, step_s)."""
    for step in range(steps):
        B = 32 - step // 20  # a batch draining slowly
        drafted = int(rng.integers(0, 4))  # almost nothing drafted: n moves with B
        n = B + drafted
        produced = B + int(rng.binomial(drafted, 0.6))
        fwd = 0.010 + 0.0004 * n + rng.normal(0, 0.0005)
        host = 0.005 + 0.0003 * B + 0.00005 * produced + abs(rng.normal(0, 0.004))
        if stall_every and step % stall_every == stall_every - 1:
            host += 0.25
        yield n, B, produced, fwd, fwd + host


def test_split_fit_reads_the_query_token_cost_from_the_forward():
    """Served at concurrency 32 the whole-step fit cannot tell a query token's cost from a request's (they move
    together when little is drafted) and host stalls land on it; the split fit reads the token's cost off the
    forward alone: the true 0.4 ms within 0.05, where the whole-step fit is off by 0.1 ms or more (and 3x as far)."""
    rng = np.random.default_rng(0)
    split, whole = SplitStepCost(), StepCostModel(per_output=True)
    for n, B, out, fwd, t in _served_c32(rng):
        split.observe(n, t, B, out, fwd)
        whole.observe(n, t, B, out)
    assert split.beta == pytest.approx(0.0004, abs=0.00005)
    assert abs(whole.beta - 0.0004) > max(0.0001, 3 * abs(split.beta - 0.0004))
    # the sum still predicts a step: 32 requests, 40 query tokens, 37 produced (without its stalls, which it clips)
    true = 0.010 + 0.0004 * 40 + 0.005 + 0.0003 * 32 + 0.00005 * 37
    assert split(40, 32, 37) == pytest.approx(true, rel=0.15)


def test_split_fit_lets_the_planner_draft_what_pays():
    """With the true costs (0.4 ms a query token, 44 ms a step of 32) lookups accepted at 0.7 pay at concurrency 32:
    the plan of the split fit drafts them."""
    rng = np.random.default_rng(1)
    split = SplitStepCost()
    for n, B, out, fwd, t in _served_c32(rng):
        split.observe(n, t, B, out, fwd)
    gains = [cumulative_acceptance(np.full(4, 0.7), 4)] * 8 + [np.zeros(4)] * 24  # 8 of 32 found a lookup
    assert sum(plan_lengths(gains, split)) >= 8


def test_cost_model_clips_a_host_stall():
    """One 300 ms stall among 50 ms steps moves the fit by at most its clipped share (3x the prediction)."""
    m = StepCostModel()
    rng = np.random.default_rng(2)
    for _ in range(100):
        B = int(rng.integers(24, 33))
        m.observe(B, 0.020 + 0.001 * B + rng.normal(0, 0.001), B)
    before = m(32, 32)
    m.observe(32, 0.3, 32)
    assert m(32, 32) < before * 1.2
    m.observe(32, 0.3, 32)  # a second one in a row: a real change of level still moves the fit
    assert m(32, 32) > before


def test_split_fit_ignores_steps_without_a_forward_time():
    s = SplitStepCost()
    s.observe(32, 0.05, 32, 32, None)
    s.observe(32, 0.05, 32, 32, 0.06)  # a forward longer than its step: a timing from another step
    assert s.num_obs == 0


def test_forward_timer_times_the_wrapped_forward():
    t = [0.0]

    class Model(torch.nn.Module):
        def forward(self, x):
            t[0] += 0.25  # the forward "takes" 0.25 s of the fake clock
            return x + 1

    m, timer = Model(), ForwardTimer(clock=lambda: t[0])
    timer.wrap(m)
    assert timer.take() is None  # no forward yet
    assert m(torch.zeros(1)).item() == 1.0 and m(torch.zeros(1)).item() == 1.0  # module call -> the wrapper
    assert timer.take() == pytest.approx(0.5)
    assert timer.take() is None


def test_forward_timer_adds_the_logits_time():
    """The runner's `compute_logits` on the same instance (a row per verified position) counts with the forward."""
    t = [0.0]

    class Model(torch.nn.Module):
        def forward(self, x):
            t[0] += 0.25
            return x

        def compute_logits(self, h):
            t[0] += 0.125
            return h * 2

    m, timer = Model(), ForwardTimer(clock=lambda: t[0])
    timer.wrap(m)
    assert m.compute_logits(m(torch.ones(1))).item() == 2.0
    assert timer.take() == pytest.approx(0.375)


def test_controller_fits_the_split_cost_from_forward_times():
    """`plan(forward_s=...)` feeds the split fit: steps of 30 ms with a 20 ms forward at n = 8, 16, 24 requests."""
    t = [0.0]
    c = AdaptiveController(4, split_cost=True, clock=lambda: t[0])
    rng = np.random.default_rng(3)
    for step in range(60):
        B = (8, 16, 24)[step % 3]
        fwd = 0.010 + 0.0005 * B
        t[0] += fwd + 0.004 + 0.0002 * B
        hists = [rng.integers(0, 50, size=40) for _ in range(B)]
        plan = c.plan([f"r{i}" for i in range(B)], hists, query_tokens=B, decode_only=True, forward_s=fwd)
        c.propose(plan, np.zeros((B, 4), dtype=np.int64) if plan.needs_block else None)
    assert c.cost.beta == pytest.approx(0.0005, rel=0.1)
    assert c.cost.num_obs > 50


def test_trace_writes_one_record_per_step(tmp_path, monkeypatch):
    """DFLASH_TRACE=<folder>: a JSON line per planned step with the step's inputs and the decision."""
    monkeypatch.setenv("DFLASH_TRACE", str(tmp_path))
    c = AdaptiveController(4)
    hists = [np.arange(30) % 5, np.arange(30)]
    for _ in range(3):
        plan = c.plan(["a", "b"], hists, query_tokens=2, decode_only=True)
        c.propose(plan, np.zeros((2, 4), dtype=np.int64) if plan.needs_block else None)
    c.trace.flush()
    (path,) = tmp_path.glob("trace-*.jsonl")
    recs = read_trace(path)
    assert len(recs) == 3
    assert {"B", "q", "out", "dt", "fwd", "arm", "forecast", "drafted", "sources", "cost", "t"} <= set(recs[0])
    assert recs[0]["B"] == 2 and recs[0]["dt"] is None and recs[1]["dt"] is not None
    json.dumps(recs)  # plain JSON values


def test_trace_is_off_by_default(monkeypatch):
    monkeypatch.delenv("DFLASH_TRACE", raising=False)
    monkeypatch.delenv("VLLM_DFLASH_TRACE", raising=False)
    assert AdaptiveController(4).trace is None
