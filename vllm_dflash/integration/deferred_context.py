# SPDX-License-Identifier: Apache-2.0
"""Deferred KV injection for adaptive drafting: the context rows of steps that run no draft forward, kept until the
next one.

Every target step hands the drafter the hidden states of the tokens it just verified. The draft's KV cache needs
them (fused by `fc`, then K/V written into every draft layer at the tokens' slots) before the next draft forward
reads those positions, and not earlier: only a draft forward reads the draft's cache. When adaptive drafting plans no
DFlash tokens for a step (prompt lookup only, or speculation off), the drafter therefore keeps the step's raw rows
here, and the next draft forward (or `max_rows`) injects all of them in one call: one `fc` GEMM and one kernel
launch instead of one per step (about 2 ms per step on a 2-core CPU at batch 32, where most steps draft nothing).

Why deferring changes nothing the draft sees: between two draft forwards the draft cache is written only by these
injections, so writing their rows later, in the same order, with the newest row winning where a slot repeats (a
rejected draft token's position is written again once the accepted token is known; a freed block reused by another
request), leaves the cache as eager injection would at the moment the next forward reads it: equal up to the
rounding of `fc` and the K/V GEMM at another row count (about one float32 ulp; tests/unit/test_deferred_context.py).
Greedy output is unaffected either way (the target verifies every draft).
"""
from __future__ import annotations

import torch


def last_per_slot(slots: torch.Tensor) -> torch.Tensor:
    """slots [N] int64 (-1 = padding) -> [N] bool: the row is the last of its slot (the newest write wins, as with one
    call per step in order); False for padding. The kernel writes rows in parallel, so a repeated slot inside one call
    must not be left to a race."""
    n = slots.numel()
    if n == 0:
        return torch.zeros(0, dtype=torch.bool, device=slots.device)
    s_sorted, perm = torch.sort(slots, stable=True)  # [N]: equal slots keep their row order
    last = torch.ones(n, dtype=torch.bool, device=slots.device)
    last[:-1] = s_sorted[1:] != s_sorted[:-1]  # the last row of each run of equal slots
    mask = torch.empty(n, dtype=torch.bool, device=slots.device)
    mask[perm] = last & (s_sorted >= 0)
    return mask


class DeferredContext:
    """A FIFO of context rows (raw target hidden states, positions, slots) not yet injected into the draft cache.

    The rows are copied into buffers allocated once (grown if a step ever needs more), so a take hands out views of
    them instead of concatenating the held steps into a fresh tensor: at concurrency 32 on a 2-core CPU, the fresh
    tensors of a 4096-row take (24 MB each, first touched) cost 40-130 ms inside the engine on top of the injection."""

    def __init__(self, max_rows: int = 4096):
        if max_rows < 1:
            raise ValueError(f"max_rows: expected >= 1, got {max_rows}")
        self.max_rows = max_rows
        self._hidden: torch.Tensor | None = None  # [capacity, F]: the target's aux hidden states, before fc
        self._positions: torch.Tensor | None = None  # [capacity] int64
        self._slots: torch.Tensor | None = None  # [capacity] int64, -1 = padding
        self.rows = 0  # rows held: the first `rows` of the buffers, oldest first
        self.steps = 0  # steps whose rows are held
        self.deferred_total = 0  # steps ever deferred (observability, tests)

    def __bool__(self) -> bool:
        return self.rows > 0

    @property
    def capacity(self) -> int:
        return 0 if self._hidden is None else self._hidden.shape[0]

    def _append(self, hidden: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> None:
        """Copy rows after the held ones, allocating (first use, another feature shape) or growing the buffers."""
        n = hidden.shape[0]
        if positions.shape != (n,) or slots.shape != (n,):
            raise ValueError(f"positions / slots: expected [{n}], got {tuple(positions.shape)} / {tuple(slots.shape)}")
        if n == 0:
            return
        buf, need = self._hidden, self.rows + n
        if buf is not None and (buf.shape[1:] != hidden.shape[1:] or buf.dtype != hidden.dtype
                                or buf.device != hidden.device):
            if self.rows:
                raise ValueError(f"hidden: rows of shape {tuple(hidden.shape[1:])} {hidden.dtype} on {hidden.device} "
                                 f"after held rows of {tuple(buf.shape[1:])} {buf.dtype} on {buf.device}")
            buf = None
        if buf is None or need > buf.shape[0]:
            cap = max(need, self.max_rows + n) if buf is None else max(need, buf.shape[0] * 3 // 2)
            old = (self._hidden, self._positions, self._slots) if buf is not None else None
            self._hidden = hidden.new_empty((cap,) + tuple(hidden.shape[1:]))
            self._positions = torch.empty(cap, dtype=torch.long, device=hidden.device)
            self._slots = torch.empty(cap, dtype=torch.long, device=hidden.device)
            if old is not None and self.rows:
                self._hidden[: self.rows].copy_(old[0][: self.rows])
                self._positions[: self.rows].copy_(old[1][: self.rows])
                self._slots[: self.rows].copy_(old[2][: self.rows])
        r = self.rows
        self._hidden[r: r + n].copy_(hidden)
        self._positions[r: r + n].copy_(positions)
        self._slots[r: r + n].copy_(slots)
        self.rows = need

    def push(self, hidden: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> bool:
        """Keep one step's rows (copied: the runner reuses these buffers). -> True when `max_rows` is reached (the
        caller injects now)."""
        self._append(hidden, positions, slots)
        self.steps += 1
        self.deferred_total += 1
        return self.rows >= self.max_rows

    def take(self, hidden: torch.Tensor | None = None, positions: torch.Tensor | None = None,
             slots: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """Everything held, then (optionally) this step's rows, as one batch for a single injection, oldest first and
        one row per slot (the newest); the FIFO is empty afterwards. -> (hidden [M, F], positions [M], slots [M]),
        or None when there is nothing (and no current step); a row a newer one overwrites (the same slot) comes with
        slot -1 (padding, skipped by the injection). The result may be views of the FIFO's buffers: use it before the
        next push."""
        held_steps = self.steps + (hidden is not None)
        if hidden is not None and not self.rows:  # nothing was deferred: this step's rows as they are
            self.steps = 0
            return hidden, positions.to(torch.long), slots.to(torch.long)
        if hidden is not None:
            self._append(hidden, positions, slots)
        rows, self.rows, self.steps = self.rows, 0, 0
        if not rows:
            return None
        h, p, s = self._hidden[:rows], self._positions[:rows], self._slots[:rows]
        if held_steps == 1:  # one step never repeats a slot
            return h, p, s
        # superseded rows become padding (slot -1, which the injection skips) rather than being cut out: indexing the
        # hidden rows would copy up to max_rows x F into a fresh tensor (at 4096 x 2880 bf16, 24 MB whose first
        # touch cost tens of ms inside the engine), where their fc and K/V cost a little wasted compute
        return h, p, torch.where(last_per_slot(s), s, torch.full_like(s, -1))


def kept_rows(query_start_loc: list[int], keep: list[bool]) -> list[int] | None:
    """Indices of a step's context rows whose request keeps its draft context. query_start_loc: [B + 1] row offsets of
    the step's requests (batch order); keep[i]: request i keeps it. -> None when every request does (take all rows
    as they are), else the rows of the kept requests in order (possibly empty)."""
    if all(keep):
        return None
    return [j for i, k in enumerate(keep) if k for j in range(query_start_loc[i], query_start_loc[i + 1])]
