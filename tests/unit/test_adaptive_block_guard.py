# SPDX-License-Identifier: Apache-2.0
"""The block guard (`AdaptiveController.block_guards`): per batch-size bucket, the measured step rate of plans that may
use the DFlash block against plans from prompt lookup alone. Simulated batches of 8 requests, half of them copying
(prompt lookup always right), half fresh text only the block can draft, on a fake clock: where the block costs more
than the forecast sees and is rarely accepted it ends up off on most steps; where it pays it keeps running."""
from __future__ import annotations

import numpy as np

from vllm_dflash.adaptive.controller import AdaptiveController
from vllm_dflash.adaptive.policy import StepCostModel
from vllm_dflash.serve.metrics import MetricsSink


def _simulate(accept: float, hidden_s: float, steps: int = 400, seed: int = 0,
              metrics=None) -> tuple[AdaptiveController, list]:
    """Steps of 4 copying and 4 fresh requests. A fresh request's block is right on each draft with probability
    `accept` (given the ones before it); a step costs 30 ms + 0.3 ms a query token, plus `hidden_s` when the draft
    forward runs (its injection: the step's time, not the forward's 2 ms the controller is told of).
    -> (controller, whether the draft forward ran, per step)."""
    rng = np.random.default_rng(seed)
    t = [0.0]
    c = AdaptiveController(4, mode="both", clock=lambda: t[0], metrics=metrics)
    c.cost = StepCostModel(alpha=0.03, beta=0.0003, per_output=True)  # the visible cost, known from the start
    cycle = np.arange(10)
    hists = {f"copy{i}": np.tile(cycle, 4) for i in range(4)}
    futures = {f"free{i}": rng.integers(1000, 100000, size=8 * steps) for i in range(4)}
    hists.update({r: f[:40] for r, f in futures.items()})
    ran, query = [], 0
    for _ in range(steps):
        ids = list(hists)
        plan = c.plan(ids, [hists[r] for r in ids], query_tokens=query, decode_only=True)
        block = None
        if plan.needs_block:
            block = np.zeros((len(ids), c.k_max), dtype=np.int64)
            for i, r in enumerate(ids):
                if r in futures:
                    n = len(hists[r])
                    right = 0
                    while right < c.k_max and rng.random() < accept:
                        right += 1
                    block[i] = futures[r][n: n + c.k_max]
                    block[i, right:] = -1  # wrong from the first rejected draft on
            c.observe_block(len(ids), 0.002)
        drafts = c.propose(plan, block)
        ran.append(plan.needs_block)
        query = 0
        for r, toks in zip(ids, drafts):
            query += 1 + len(toks)
            h = hists[r]
            if r in futures:
                truth = futures[r][len(h): len(h) + len(toks) + 1]
            else:
                truth = (h[-1] + 1 + np.arange(len(toks) + 1)) % 10
            a = 0
            while a < len(toks) and toks[a] == truth[a]:
                a += 1
            hists[r] = np.concatenate([h, truth[: a + 1]])  # the accepted drafts, then the target's own token
        t[0] += 0.03 + 0.0003 * query + (0.002 + hidden_s if plan.needs_block else 0.0)
    return c, ran


def test_a_block_that_costs_more_than_it_yields_ends_up_off():
    """Accepted at 0.7 (the forecast plans the block) with 30 ms a step it does not see: the block guard measures
    the lookup plan faster, and the second half of the run drafts the block on few steps."""
    sink = MetricsSink()  # the real registry: an unregistered name fails here
    c, ran = _simulate(accept=0.7, hidden_s=0.03, metrics=sink)
    assert np.mean(ran[:50]) > 0.15, np.mean(ran[:50])  # the forecast alone would run it
    g = c.block_guards[3]  # batch 8
    assert g.rate["off"] is not None and g.rate["off"] > g.rate["plan"]
    assert np.mean(ran[200:]) < 0.1, np.mean(ran[200:])
    assert sink.counters["block_guard_off_steps"] >= 150
    assert sink.gauges["block_guard_off_tokens_per_s"] > sink.gauges["block_guard_plan_tokens_per_s"] > 0


def test_a_block_that_pays_keeps_running():
    """Accepted at 0.9 and cheap: the block runs on most steps throughout."""
    c, ran = _simulate(accept=0.9, hidden_s=0.0)
    assert np.mean(ran[200:]) > 0.8, np.mean(ran[200:])
    g = c.block_guards[3]
    assert g.best == "plan"


def test_modes_without_a_choice_have_no_block_guard():
    """'dflash' has no lookup plan and 'ngram' no block: nothing for a block guard to weigh."""
    for mode in ("dflash", "ngram"):
        c = AdaptiveController(4, mode=mode)
        hist = np.tile(np.arange(10), 4)
        c.plan(["a"], [hist], query_tokens=1, decode_only=True)
        assert c.block_guards == {}
