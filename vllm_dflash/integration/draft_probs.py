# SPDX-License-Identifier: Apache-2.0
"""The draft distribution q the verifier reads (vLLM's `take_last_draft_probs`: [B, K, V] over the TARGET vocabulary,
the runner slices each request's first num_draft rows into its RejectionSampler).

A sampled request's DFlash tokens are drawn from the draft's marginals over its reduced vocabulary, so their q rows
are those marginals spread over the target ids of the draft vocabulary (zero elsewhere); a token that did not come
from the draft (prompt lookup, a merged proposal's lookup slots, overlap padding) has a one-hot q. Greedy requests
ignore q (the rejection sampler's greedy rule), so their cells are left as they are.

One persistent buffer, rewritten in place: the draft-vocabulary columns of a cell are always rewritten whole (q, or
zeros under a one-hot), and the one-hot columns of the last build are cleared at the next, so each build writes
cells x V_draft floats instead of clearing cells x V. The runner copies its rows (torch.cat) in the next step's
sampling, before the next `propose` writes the buffer again (sampling precedes drafting in every runner step)."""
from __future__ import annotations

import torch


class DraftProbs:
    def __init__(self, num_slots: int, vocab_size: int, draft_ids: torch.Tensor):
        """num_slots: K; vocab_size: the target's V (the rejection sampler's logits width); draft_ids: [V_draft] the
        target id of each draft-vocabulary id."""
        if int(draft_ids.max()) >= vocab_size:
            raise ValueError(f"draft vocabulary maps to target id {int(draft_ids.max())} >= the target's vocab_size "
                             f"{vocab_size}: the draft was built for another target")
        self.K, self.V = num_slots, vocab_size
        self.draft_ids = draft_ids.to(torch.long)  # [V_draft]
        self.buf: torch.Tensor | None = None  # [rows, K, V] float32
        self._onehot: tuple[torch.Tensor, torch.Tensor] | None = None  # (flat cells [m], columns [m]) of the last build

    def build(self, batch_size: int, q_cells: torch.Tensor | None, q: torch.Tensor | None,
              onehot_cells: torch.Tensor | None = None, onehot_tokens: torch.Tensor | None = None) -> torch.Tensor:
        """-> [batch_size, K, V] (a view of the buffer). q_cells: [n] flat cells (row * K + slot) whose q is q [n,
        V_draft]; onehot_cells: [m] flat cells whose q is one-hot at onehot_tokens [m] (target ids). Other cells hold
        stale values: only cells of greedy rows or past a proposal's length may be left out."""
        dev = (q if q is not None else onehot_tokens).device
        if self.buf is None or self.buf.shape[0] < batch_size or self.buf.device != dev:
            self.buf = torch.zeros((batch_size, self.K, self.V), dtype=torch.float32, device=dev)
            self.draft_ids = self.draft_ids.to(dev)
            self._onehot = None
        flat = self.buf.view(-1, self.V)  # [rows * K, V]
        if self._onehot is not None:
            flat[self._onehot] = 0.0
            self._onehot = None
        if q_cells is not None and q_cells.numel():
            flat[q_cells[:, None], self.draft_ids[None, :]] = q.to(torch.float32)
        if onehot_cells is not None and onehot_cells.numel():
            flat[onehot_cells[:, None], self.draft_ids[None, :]] = 0.0
            flat[onehot_cells, onehot_tokens] = 1.0
            self._onehot = (onehot_cells, onehot_tokens)
        return self.buf[:batch_size]
