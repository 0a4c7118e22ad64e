# SPDX-License-Identifier: Apache-2.0
"""Tensor parallelism without vLLM: rank-consistent adaptive plans (StepPlan.encode / adopt, what the drafter
broadcasts from TP rank 0), rank-0-only metrics (MetricsSink.disabled) and the start-up check of the draft's head
counts (validation.check_tensor_parallel). The TP=2 engines are in tests/vllm/test_tp.py."""
import numpy as np
import pytest

from support.clock import StepClock
from vllm_dflash.adaptive.controller import PLAN_SOURCES, AdaptiveController, StepPlan
from vllm_dflash.config import DFlashConfigError
from vllm_dflash.integration.validation import check_tensor_parallel, valid_tp_sizes
from vllm_dflash.serve import metrics as dm


def _plan(sources, ks, lookups=None):
    lookups = lookups or [np.zeros(0, dtype=np.int64)] * len(sources)
    return StepPlan([f"r{i}" for i in range(len(sources))], [5] * len(sources), lookups, list(sources), list(ks))


def test_encode_adopt_roundtrip():
    a = _plan(["dflash", "none", "ngram", "merged"], [7, 0, 2, 7],
              [np.zeros(0, np.int64), np.zeros(0, np.int64), np.array([3, 4]), np.array([5])])
    code = a.encode()
    assert code.dtype == np.int64 and code.shape == (9,)
    b = _plan(["none"] * 4, [0] * 4, a.lookups)
    assert not b.needs_block
    b.adopt(code)
    assert (b.sources, b.ks, b.needs_block) == (a.sources, a.ks, True)
    assert set(PLAN_SOURCES) >= set(a.sources)
    a.drop_context = True  # travels with the block decision: every rank drops its rows, or none does
    b.adopt(a.encode())
    assert b.drop_context and b.needs_block
    with pytest.raises(ValueError, match="disagree on the batch"):
        _plan(["none"], [0]).adopt(code)


def test_adopted_block_decision_wins():
    """needs_block after adopt is the deciding rank's answer (the forward and its collectives run on all or none)."""
    p = _plan(["dflash"], [7])
    p.adopt(np.array([PLAN_SOURCES.index("dflash"), 7, 0]))
    assert not p.needs_block
    c = AdaptiveController(7, mode="dflash")
    assert c.propose(p, None) == [[]]  # no block on this rank: an empty proposal, not a crash (drafts dropped)
    out = c.propose_overlap(p, None, np.array([9]))
    assert out.tolist() == [[9] * 7]


def test_two_ranks_with_different_clocks_agree_after_adopt():
    """Two controllers on the same tokens, timed by different clocks (each TP rank's own): after every step rank 1
    adopts rank 0's plan, so both run the draft forward at the same steps and propose the same tokens."""
    rng = np.random.default_rng(0)
    k = 4
    r0 = AdaptiveController(k, mode="both", clock=StepClock(0.01))
    r1 = AdaptiveController(k, mode="both", clock=StepClock(0.5))  # a much slower rank: its guard/cost differ
    hists = {f"q{i}": list(rng.integers(0, 6, size=12)) for i in range(3)}
    for step in range(40):
        ids = list(hists)
        hs = [np.array(hists[r], dtype=np.int64) for r in ids]
        p0 = r0.plan(ids, hs, query_tokens=len(ids), decode_only=True)
        p1 = r1.plan(ids, hs, query_tokens=len(ids), decode_only=True)
        p1.adopt(p0.encode())
        assert p1.needs_block == p0.needs_block
        block = rng.integers(0, 6, size=(len(ids), k)) if p0.needs_block else None
        out0, out1 = r0.propose(p0, block), r1.propose(p1, block)
        assert out0 == out1, step
        for r, toks in zip(ids, out0):  # the "target" accepts a random prefix, then its own token
            a = int(rng.integers(0, len(toks) + 1))
            hists[r] += [int(t) for t in toks[:a]] + [int(rng.integers(0, 6))]


def test_disabled_sink_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(dm.ENV_DIR, str(tmp_path))
    on, off = dm.MetricsSink(), dm.MetricsSink.disabled()
    for s in (on, off):
        s.inc("draft_steps", 3)
        s.flush(force=True)
    snaps = dm.read_snapshots(tmp_path)
    assert len(snaps) == 1 and dm.merged(snaps)["counters"]["draft_steps"] == 3


class _Cfg:
    def __init__(self, heads, kv):
        self.num_attention_heads, self.num_key_value_heads = heads, kv


def test_tensor_parallel_check_names_the_field_and_the_fix():
    check_tensor_parallel(_Cfg(4, 2), 2)
    check_tensor_parallel(_Cfg(4, 1), 2)  # one KV head: replicated on both ranks (vLLM's rule)
    check_tensor_parallel(_Cfg(9, 3), 1)
    with pytest.raises(DFlashConfigError, match=r"num_attention_heads.*9 attention heads.*tensor_parallel_size=2.*"
                                                r"Fix: serve with a tensor_parallel_size in \[1, 3, 9\]"):
        check_tensor_parallel(_Cfg(9, 3), 2)
    with pytest.raises(DFlashConfigError, match=r"num_key_value_heads.*3 KV heads"):
        check_tensor_parallel(_Cfg(6, 3), 2)
    with pytest.raises(DFlashConfigError, match=r"draft_tensor_parallel_size.*Fix: omit"):
        check_tensor_parallel(_Cfg(4, 2), 2, draft_tp_size=1)
    assert valid_tp_sizes(8, 2) == [1, 2, 4, 8] and valid_tp_sizes(6, 3) == [1, 3, 6]
