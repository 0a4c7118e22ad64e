# SPDX-License-Identifier: Apache-2.0
"""One step's decoding rows and plan, as the adaptive strategies hand them around (frozen: built once per step).

`DecodeRows`: the requests of the batch that decode this step, with their committed histories (synchronous
scheduling, `decode_rows`). `DraftPlan`: the controller's plan (adaptive/controller.py `StepPlan`) in batch terms:
what rows draft how many tokens from which source, and which block slots of the DFlash block each row verifies."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


class Histories(Sequence):
    """The committed histories of a step's decoding requests, each copied out of the input batch on first access
    (cached): a step whose plan reads none of them (the guard's measured 'off', nothing pending) copies none.
    `lengths[j]`: len(self[j]) without building it. bonus: each batch row's token just sampled, or a zero-argument
    callable returning them (read with the first history built: vLLM's padded-batch preparation, deferred until
    then, integration/padded_inputs.py). Read inside the drafter's call only: the input batch's token buffer
    changes after it."""

    __slots__ = ("_tokens", "_rows", "_ends", "_bonus", "_built", "lengths")

    def __init__(self, tokens: np.ndarray, rows: list[int], ends: list[int], bonus):
        self._tokens, self._rows, self._ends, self._bonus = tokens, rows, ends, bonus  # ends[j]: p + 1
        self._built: list[np.ndarray | None] = [None] * len(rows)
        self.lengths = [e + 1 for e in ends]

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, j):
        if isinstance(j, slice):
            return [self[i] for i in range(len(self))[j]]
        h = self._built[j]
        if h is None:  # [p + 2]: token_ids_cpu[i, :p + 1] + [bonus]
            e = self._ends[j]
            h = np.empty(e + 1, dtype=np.int64)
            h[:e] = self._tokens[self._rows[j], :e]
            if callable(self._bonus):
                self._bonus = list(self._bonus())
            h[e] = self._bonus[self._rows[j]]
            self._built[j] = h
        return h


@dataclass(frozen=True)
class DecodeRows:
    """req_ids, histories and rows (batch rows) per decoding request, in batch order; decode_only: no prefill chunk
    in the step; prefill_tokens: the query tokens of the prefill chunks in it."""

    req_ids: tuple[str, ...]
    histories: Sequence[np.ndarray]  # `Histories` (built on access)
    rows: tuple[int, ...]
    decode_only: bool
    prefill_tokens: int


def decode_rows(batch, K: int, target_positions, next_token_ids, cad, num_rejected) -> DecodeRows:
    """The committed history of every decoding request (synchronous scheduling; batch: the runner's input batch).

    History of request i = token_ids_cpu[i, :p + 1] + [bonus], p the position of its last accepted query token:
    token_ids_cpu holds the prompt, the committed output and this step's scheduled drafts (the accepted ones are
    exactly those up to p); the bonus is the token the target just sampled. next_token_ids: [B], or a zero-argument
    callable returning it (read only when a history is built); num_rejected None: no row rejected."""
    B = cad.num_reqs
    qsl = cad.query_start_loc_cpu[: B + 1].tolist()
    rej = num_rejected.tolist() if num_rejected is not None else [0] * B
    pos = target_positions.tolist() if target_positions.dim() == 1 else target_positions[0].tolist()
    bonus = (lambda: next_token_ids().tolist()) if callable(next_token_ids) else next_token_ids.tolist()
    req_ids, ends, rows, decode_only, prefill_tokens = [], [], [], True, 0
    ids, prompt_lens = batch.req_ids, batch.num_prompt_tokens[:B].tolist()
    for i in range(B):
        qlen = qsl[i + 1] - qsl[i]
        end = qsl[i + 1] - int(rej[i])
        if qlen <= 0 or end <= qsl[i]:
            continue
        p = int(pos[end - 1])
        if p + 1 < prompt_lens[i]:
            decode_only = False  # partial prefill: no draft (the scheduler ignores it anyway)
            prefill_tokens += qlen  # its next chunk will likely share the next step: a cost the plan sees
            continue
        decode_only &= qlen <= K + 1
        req_ids.append(ids[i])
        ends.append(p + 1)
        rows.append(i)
    return DecodeRows(tuple(req_ids), Histories(batch.token_ids_cpu, rows, ends, bonus), tuple(rows), decode_only,
                      prefill_tokens)


@dataclass(frozen=True)
class DraftPlan:
    """One step's plan in batch terms. Per planned request: its batch row, the source of its proposal ('dflash',
    'ngram', 'merged' or 'none'), how many tokens of it the target verifies (overlap: the proposal's length), and the
    block slots (lo, hi) of the DFlash block it verifies (None: no DFlash token). needs_block: the draft forward runs
    (after a TP broadcast: rank 0's answer)."""

    rows: tuple[int, ...]
    sources: tuple[str, ...]
    ks: tuple[int, ...]
    spans: tuple[tuple[int, int] | None, ...]
    needs_block: bool

    @classmethod
    def of(cls, plan, rows=(), k_max: int | None = None) -> DraftPlan:
        """From a `StepPlan` whose requests sit at batch rows `rows`; k_max given: overlap scheduling, the spans of
        full-length proposals (`StepPlan.overlap_spans`), else the spans the plan verifies (`block_spans`)."""
        if k_max is not None:
            spans = list(plan.overlap_spans(k_max))
        else:
            spans = [None] * len(plan.sources)
            for j, span in zip(plan.block_requests(), plan.block_spans()):
                spans[j] = span
        return cls(tuple(rows), tuple(plan.sources), tuple(int(k) for k in plan.ks), tuple(spans),
                   bool(plan.needs_block))

    @property
    def block_spans(self) -> dict[int, tuple[int, int]]:
        """Batch row -> the block slots it verifies, for the rows that verify DFlash tokens."""
        return {r: s for r, s in zip(self.rows, self.spans) if s is not None}

    @property
    def block_rows(self) -> list[int]:
        """The batch rows the draft forward must run over (those that verify DFlash tokens), ascending."""
        return sorted(self.block_spans)

    def decisions(self) -> tuple[tuple[str, ...], tuple[int, ...], bool]:
        """What a TP broadcast carries (`StepPlan.encode`): sources, lengths, needs_block."""
        return self.sources, self.ks, self.needs_block
