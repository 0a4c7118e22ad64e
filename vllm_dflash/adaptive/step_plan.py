# SPDX-License-Identifier: Apache-2.0
"""`StepPlan`: one step's adaptive-drafting decisions per request (source and length), made before the draft forward,
and what they imply (whether the draft forward runs, which block slots each request verifies); encoded as integers so
TP rank 0's plan can be sent to every rank (integration/tp_plan.py)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PLAN_SOURCES = ("none", "dflash", "ngram", "merged")  # StepPlan.encode: a source's code is its index here


def history_lengths(histories) -> list[int]:
    """len() of every history, without building a lazy one (`Histories.lengths`, integration/drafting/plan.py)."""
    lengths = getattr(histories, "lengths", None)
    return list(lengths) if lengths is not None else [len(h) for h in histories]


@dataclass
class StepPlan:
    """One step's decisions, made before the draft forward. Per request: its prompt-lookup continuation, the chosen
    source ('none': no proposal) and how many tokens of it the target verifies (overlap: the proposal's length; the
    scheduler decides how many are verified)."""

    req_ids: list[str]
    starts: list[int]  # len(history): the drafts predict history[start:]
    lookups: list[np.ndarray]  # [<= k_max] each
    sources: list[str]
    ks: list[int]
    run_block: bool | None = None  # adopted from another rank (`adopt`): whether the draft forward runs
    # speculation is off here because no speculation was measured faster (not while 'off' is only being re-measured):
    # the drafter drops this step's context rows instead of holding them (`AdaptiveController.context_dropped`)
    drop_context: bool = False

    def block_requests(self) -> list[int]:
        """Positions (in this plan) of the requests that verify DFlash tokens: the draft forward's rows."""
        return [j for j, (s, k, t) in enumerate(zip(self.sources, self.ks, self.lookups)) if uses_block(s, k, t)]

    def block_spans(self) -> list[tuple[int, int]]:
        """Per request of `block_requests`, the block slots (lo, hi) it verifies: 0..k-1 for a DFlash proposal, the
        slots after the lookup's tokens (m..k-1) for a merged one. The draft's argmax runs there alone."""
        return [(lookup_slots(s, t, k), k) for s, k, t in zip(self.sources, self.ks, self.lookups)
                if uses_block(s, k, t)]

    def overlap_spans(self, k_max: int) -> list[tuple[int, int] | None]:
        """Per request, the block slots (lo, hi) of its full-length proposal under overlap scheduling
        (`propose_overlap`): 0..k_max-1 for a DFlash proposal, those after the lookup's tokens for a merged one, None
        for the others (no DFlash token)."""
        return [(lookup_slots(s, t, k_max), k_max) if uses_block(s, k_max, t) else None
                for s, t in zip(self.sources, self.lookups)]

    @property
    def needs_block(self) -> bool:
        """Does any request verify a DFlash token, i.e. must the draft forward run? (After `adopt`: the deciding
        rank's answer, so every rank runs the forward, with its collectives, or none does.)"""
        if self.run_block is not None:
            return self.run_block
        return any(uses_block(s, k, t) for s, k, t in zip(self.sources, self.ks, self.lookups))

    def encode(self) -> np.ndarray:
        """The decisions as [2 * B + 1] int64: source codes (PLAN_SOURCES), lengths, then needs_block | 2 *
        drop_context. B is the same on every TP rank (the batch is), so the size is known before the broadcast."""
        out = np.empty(2 * len(self.sources) + 1, dtype=np.int64)
        n = len(self.sources)
        out[:n] = [PLAN_SOURCES.index(s) for s in self.sources]
        out[n: 2 * n] = self.ks
        out[2 * n] = int(self.needs_block) | (int(self.drop_context) << 1)
        return out

    def adopt(self, code: np.ndarray) -> "StepPlan":
        """Take another rank's decisions (`encode` of its plan for the same requests) in place; the lookups stay this
        rank's (pure functions of the same tokens). -> self."""
        n = len(self.sources)
        if len(code) != 2 * n + 1:
            raise ValueError(f"plan code of length {len(code)} for {n} requests: the TP ranks disagree on the batch")
        self.sources = [PLAN_SOURCES[int(c)] for c in code[:n]]
        self.ks = [int(k) for k in code[n: 2 * n]]
        self.run_block = bool(int(code[2 * n]) & 1)
        self.drop_context = bool(int(code[2 * n]) & 2)
        return self


def uses_block(source: str, k: int, lookup: np.ndarray) -> bool:
    """Does verifying k tokens of this source use a DFlash token (so the draft forward must run)?"""
    return (source == "dflash" and k > 0) or (source == "merged" and k > len(lookup))


def lookup_slots(source: str, lookup: np.ndarray, k: int) -> int:
    """How many of a proposal's first k slots hold prompt-lookup tokens inside a merged proposal (0 otherwise)."""
    return min(len(lookup), k) if source == "merged" else 0
