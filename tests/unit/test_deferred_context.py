# SPDX-License-Identifier: Apache-2.0
"""Deferred KV injection (integration/deferred_context.py): holding the context rows of steps without a draft forward
and injecting them in one call leaves the draft cache as one injection per step would (up to the GEMM's rounding at
another row count), with the real fused CPU kernel, when slots repeat across steps (a rejected token's position written again, a freed block reused)."""
from __future__ import annotations

import pytest
import torch

from test_kv_injection import needs_ext, tol, weights
from vllm_dflash.integration.deferred_context import DeferredContext, last_per_slot
from vllm_dflash.ops import CPU_VEC_LAYOUT, inject_context_kv_to_cache

H, L, NKV, HD, BS, NB = 64, 2, 2, 16, 8, 6


def _caches() -> list[torch.Tensor]:
    return [torch.full((NB, NKV, BS, 2 * HD), 7.0) for _ in range(L)]  # CPU "vec" layout [blocks, kv heads, bs, 2hd]


def _steps(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Five steps of context rows (hidden [n, H], positions [n], slots [n]) whose slots repeat across steps, with a
    padding row (-1) and an empty step."""
    g = torch.Generator().manual_seed(seed)
    slot_sets = [[0, 1, 2, 3, 4], [5, 6, 7], [5, 6, -1, 8], [], [8, 9, 3, 40, 41]]  # 5, 6, 8, 3 repeat
    out = []
    for slots in slot_sets:
        s = torch.tensor(slots, dtype=torch.long)
        out.append((torch.randn(len(slots), H, generator=g), torch.randint(0, 60, (len(slots),), generator=g), s))
    return out


def test_last_per_slot():
    s = torch.tensor([3, 5, 3, -1, 7, 5, -1, 9])
    kept = last_per_slot(s)
    assert torch.nonzero(kept).flatten().tolist() == [2, 4, 5, 7]  # the newest row of 3, 7, 5, 9; padding dropped
    assert kept.tolist() == [False, False, True, False, True, True, False, True]
    assert last_per_slot(torch.empty(0, dtype=torch.long)).tolist() == []


@needs_ext
def test_one_deferred_injection_equals_one_per_step():
    w = weights(H, L, NKV, HD, torch.float32, max_pos=64)
    eager, deferred = _caches(), _caches()
    steps = _steps()
    for h, p, s in steps:  # today's order: every step injects its own rows
        inject_context_kv_to_cache(h, p, s, w, eager, CPU_VEC_LAYOUT)
    fifo = DeferredContext()
    for h, p, s in steps[:-1]:
        assert not fifo.push(h, p, s)
    assert fifo.steps == 4 and fifo.rows == 12 and fifo.deferred_total == 4
    h, p, s = fifo.take(*steps[-1])  # the step that drafts: held rows first, then its own
    assert not fifo and fifo.steps == 0
    # one row per slot: a superseded row (and padding) comes as slot -1, which the injection skips
    assert sorted(x for x in s.tolist() if x >= 0) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 40, 41]
    assert len(s) == 17 and s.tolist().count(-1) == 5  # 4 superseded rows (slots 5, 6, 8, 3) and 1 padding row
    inject_context_kv_to_cache(h, p, s, w, deferred, CPU_VEC_LAYOUT)
    for a, b in zip(eager, deferred):  # equal up to the GEMM's rounding at another row count (~1 fp32 ulp)
        torch.testing.assert_close(a, b, **tol(torch.float32))


@needs_ext
def test_oldest_row_winning_would_be_caught():
    """Negative control: keeping the first row of a repeated slot (a wrong order) changes the cache."""
    w = weights(H, L, NKV, HD, torch.float32, max_pos=64)
    eager, wrong = _caches(), _caches()
    steps = _steps()
    for h, p, s in steps:
        inject_context_kv_to_cache(h, p, s, w, eager, CPU_VEC_LAYOUT)
    for h, p, s in reversed(steps):  # the oldest write last
        inject_context_kv_to_cache(h, p, s, w, wrong, CPU_VEC_LAYOUT)
    assert max(float((a - b).abs().max()) for a, b in zip(eager, wrong)) > 0.1  # far beyond the rounding above


def test_push_reports_full_and_copies():
    fifo = DeferredContext(max_rows=5)
    h = torch.zeros(3, 4)
    p, s = torch.arange(3), torch.arange(3)
    assert not fifo.push(h, p, s)
    h.fill_(1.0)  # the runner reuses its buffers: what is held must not change
    assert fifo.push(torch.zeros(2, 4), torch.arange(3, 5), torch.arange(3, 5))
    held, _, slots = fifo.take()
    assert held.abs().sum() == 0 and slots.tolist() == [0, 1, 2, 3, 4]
    assert fifo.take() is None
    with pytest.raises(ValueError, match="positions / slots"):
        fifo.push(torch.zeros(2, 4), torch.arange(3), torch.arange(2))
    with pytest.raises(ValueError, match="max_rows"):
        DeferredContext(max_rows=0)


def test_buffers_are_reused_and_grow_when_a_step_needs_it():
    """Rows go into buffers allocated once (their storage stays put across pushes and takes); a step larger than the
    free room grows them with the held rows kept; take returns what concatenating every step's rows would (one row
    per slot, the newest, in order)."""
    fifo = DeferredContext(max_rows=8)
    g = torch.Generator().manual_seed(0)
    first = torch.randn(3, 4, generator=g)
    fifo.push(first, torch.arange(3), torch.arange(3))
    ptr, cap = fifo._hidden.data_ptr(), fifo.capacity
    assert cap == 8 + 3
    fifo.push(torch.randn(4, 4, generator=g), torch.arange(4), torch.arange(10, 14))
    assert fifo._hidden.data_ptr() == ptr  # no new allocation for a step that fits
    big = torch.randn(20, 4, generator=g)  # a prefill chunk beyond the room left: the buffers grow
    assert fifo.push(big, torch.arange(20), torch.arange(100, 120))
    assert fifo.capacity >= 27 and fifo.rows == 27
    h, p, s = fifo.take()
    ref_h = torch.cat([first, h[3:7], big])  # the middle step's rows as held
    assert torch.equal(h[:3], first) and torch.equal(h[7:], big) and torch.equal(h, ref_h)
    assert s.tolist() == [0, 1, 2, 10, 11, 12, 13] + list(range(100, 120)) and p.dtype == torch.long
    ptr = fifo._hidden.data_ptr()
    fifo.push(torch.ones(2, 4), torch.arange(2), torch.tensor([1, 1]) * 5)
    h, _, s = fifo.take(torch.zeros(1, 4), torch.arange(1), torch.tensor([5]))  # the current step's row wins slot 5
    assert fifo._hidden.data_ptr() == ptr and s.tolist() == [-1, -1, 5] and h[2].abs().sum() == 0
    with pytest.raises(ValueError, match="after held rows"):
        fifo.push(torch.zeros(1, 4), torch.arange(1), torch.arange(1))
        fifo.push(torch.zeros(1, 6), torch.arange(1), torch.arange(1))
