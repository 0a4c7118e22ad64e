# SPDX-License-Identifier: Apache-2.0
"""One step's decoding rows and plan, as the adaptive strategies hand them around (frozen: built once per step).

`DecodeRows`: the requests of the batch that decode this step, with their committed histories (synchronous
scheduling, `decode_rows`). `DraftPlan`: the controller's plan (adaptive/controller.py `StepPlan`) in batch terms:
what rows draft how many tokens from which source, and which block slots of the DFlash block each row verifies."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DecodeRows:
    """req_ids, histories and rows (batch rows) per decoding request, in batch order; decode_only: no prefill chunk
    in the step; prefill_tokens: the query tokens of the prefill chunks in it."""

    req_ids: tuple[str, ...]
    histories: tuple[np.ndarray, ...]
    rows: tuple[int, ...]
    decode_only: bool
    prefill_tokens: int


def decode_rows(batch, K: int, target_positions, next_token_ids, cad, num_rejected) -> DecodeRows:
    """The committed history of every decoding request (synchronous scheduling; batch: the runner's input batch).

    History of request i = token_ids_cpu[i, :p + 1] + [bonus], p the position of its last accepted query token:
    token_ids_cpu holds the prompt, the committed output and this step's scheduled drafts (the accepted ones are
    exactly those up to p); the bonus is the token the target just sampled."""
    B = cad.num_reqs
    qsl = cad.query_start_loc_cpu[: B + 1].tolist()
    rej = num_rejected.tolist() if num_rejected is not None else [0] * B
    pos = target_positions.tolist() if target_positions.dim() == 1 else target_positions[0].tolist()
    bonus = next_token_ids.tolist()
    req_ids, hists, rows, decode_only, prefill_tokens = [], [], [], True, 0
    for i in range(B):
        qlen = qsl[i + 1] - qsl[i]
        end = qsl[i + 1] - int(rej[i])
        if qlen <= 0 or end <= qsl[i]:
            continue
        p = int(pos[end - 1])
        if p + 1 < int(batch.num_prompt_tokens[i]):
            decode_only = False  # partial prefill: no draft (the scheduler ignores it anyway)
            prefill_tokens += qlen  # its next chunk will likely share the next step: a cost the plan sees
            continue
        decode_only &= qlen <= K + 1
        hist = np.empty(p + 2, dtype=np.int64)
        hist[: p + 1] = batch.token_ids_cpu[i, : p + 1]
        hist[p + 1] = bonus[i]
        req_ids.append(batch.req_ids[i])
        hists.append(hist)
        rows.append(i)
    return DecodeRows(tuple(req_ids), tuple(hists), tuple(rows), decode_only, prefill_tokens)


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
