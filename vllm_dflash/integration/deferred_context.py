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


def keep_last_per_slot(slots: torch.Tensor) -> torch.Tensor:
    """slots [N] int64 (-1 = padding) -> indices [M] into them, ascending: the last row of every slot >= 0 (the newest
    write wins, as with one call per step in order). The kernel writes rows in parallel, so a repeated slot inside
    one call must not be left to a race."""
    n = slots.numel()
    if n == 0:
        return torch.empty(0, dtype=torch.long, device=slots.device)
    s_sorted, perm = torch.sort(slots, stable=True)  # [N]: equal slots keep their row order
    last = torch.ones(n, dtype=torch.bool, device=slots.device)
    last[:-1] = s_sorted[1:] != s_sorted[:-1]  # the last row of each run of equal slots
    keep = perm[last & (s_sorted >= 0)]
    return torch.sort(keep).values


class DeferredContext:
    """A FIFO of context rows (raw target hidden states, positions, slots) not yet injected into the draft cache."""

    def __init__(self, max_rows: int = 4096):
        if max_rows < 1:
            raise ValueError(f"max_rows: expected >= 1, got {max_rows}")
        self.max_rows = max_rows
        self._hidden: list[torch.Tensor] = []  # each [n_i, F]: the target's aux hidden states, before fc
        self._positions: list[torch.Tensor] = []  # each [n_i] int64
        self._slots: list[torch.Tensor] = []  # each [n_i] int64, -1 = padding
        self.rows = 0
        self.steps = 0  # steps whose rows are held
        self.deferred_total = 0  # steps ever deferred (observability, tests)

    def __bool__(self) -> bool:
        return self.rows > 0

    def push(self, hidden: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> bool:
        """Keep one step's rows (copied: the runner reuses these buffers). -> True when `max_rows` is reached (the
        caller injects now)."""
        n = hidden.shape[0]
        if positions.shape != (n,) or slots.shape != (n,):
            raise ValueError(f"positions / slots: expected [{n}], got {tuple(positions.shape)} / {tuple(slots.shape)}")
        if n:
            self._hidden.append(hidden.clone())
            self._positions.append(positions.to(torch.long, copy=True))
            self._slots.append(slots.to(torch.long, copy=True))
            self.rows += n
        self.steps += 1
        self.deferred_total += 1
        return self.rows >= self.max_rows

    def take(self, hidden: torch.Tensor | None = None, positions: torch.Tensor | None = None,
             slots: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """Everything held, then (optionally) this step's rows, as one batch for a single injection, oldest first and
        one row per slot (the newest); the FIFO is empty afterwards. -> (hidden [M, F], positions [M], slots [M]),
        or None when there is nothing (and no current step)."""
        hs, ps, ss = self._hidden, self._positions, self._slots
        if hidden is not None:
            hs, ps, ss = hs + [hidden], ps + [positions.to(torch.long)], ss + [slots.to(torch.long)]
        self._hidden, self._positions, self._slots, self.rows, self.steps = [], [], [], 0, 0
        if not hs:
            return None
        if len(hs) == 1:  # nothing was deferred: this step's rows as they are (one step never repeats a slot)
            return hs[0], ps[0], ss[0]
        h, p, s = torch.cat(hs), torch.cat(ps), torch.cat(ss)
        keep = keep_last_per_slot(s)
        return h[keep], p[keep], s[keep]
