# SPDX-License-Identifier: Apache-2.0
"""The draft distribution q the verifier reads (vLLM's `take_last_draft_probs`: [B, K, V] over the TARGET vocabulary,
the runner slices each request's first num_draft rows into its RejectionSampler).

A sampled request's DFlash tokens are drawn from the draft's marginals over its reduced vocabulary, so their q rows
are those marginals spread over the target ids of the draft vocabulary (zero elsewhere); a token that did not come
from the draft (prompt lookup, a merged proposal's lookup slots, overlap padding) has a one-hot q. Greedy requests
ignore q (the rejection sampler's greedy rule); a one-hot q is still written for them where they share a build.

One persistent buffer, rewritten in place. Its contract (`build`): after a build, every cell of the buffer holds
either this build's q, this build's one-hot, or zeros; nothing is left from an earlier step. The cells that held q
at the last build have their draft-vocabulary columns zeroed and the last one-hot columns are cleared, so each build
writes about (cells now + cells before) x V_draft floats instead of clearing rows x K x V. A cell left out of a build
is zero: vLLM's rule then rejects its draft (q = 0) and recovers from the target's p, lossless where nothing better
is known. The runner copies its rows (torch.cat) in the next step's sampling, before the next `propose` writes the
buffer again (sampling precedes drafting in every runner step)."""
from __future__ import annotations

import torch


class DraftProbs:
    def __init__(self, num_slots: int, vocab_size: int, draft_ids: torch.Tensor):
        """num_slots: K; vocab_size: the target's V (the rejection sampler's logits width); draft_ids: [V_draft] the
        target id of each draft-vocabulary id (the draft's d2t map: distinct, in [0, V))."""
        ids = draft_ids.to(torch.long)
        if ids.numel() and int(ids.min()) < 0:
            raise ValueError(f"draft vocabulary maps to target id {int(ids.min())} < 0: the draft's d2t map is "
                             "malformed (re-export the draft)")
        if ids.numel() and int(ids.max()) >= vocab_size:
            raise ValueError(f"draft vocabulary maps to target id {int(ids.max())} >= the target's vocab_size "
                             f"{vocab_size}: the draft was built for another target")
        if int(torch.unique(ids).numel()) != int(ids.numel()):
            raise ValueError(f"draft vocabulary maps {int(ids.numel()) - int(torch.unique(ids).numel())} draft ids "
                             "onto target ids another draft id already has: the d2t map must be one-to-one (q over "
                             "target ids would not be the distribution drafts are drawn from); re-export the draft")
        self.K, self.V = num_slots, vocab_size
        self.draft_ids = ids  # [V_draft]
        self.buf: torch.Tensor | None = None  # [rows, K, V] float32
        self._q_cells: torch.Tensor | None = None  # [n] flat cells that hold q since the last build
        self._onehot: tuple[torch.Tensor, torch.Tensor] | None = None  # (flat cells [m], columns [m]) of the last build

    def build(self, batch_size: int, q_cells: torch.Tensor | None, q: torch.Tensor | None,
              onehot_cells: torch.Tensor | None = None, onehot_tokens: torch.Tensor | None = None) -> torch.Tensor:
        """-> [batch_size, K, V] (a view of the buffer). q_cells: [n] flat cells (row * K + slot) whose q is q [n,
        V_draft]; onehot_cells: [m] flat cells whose q is one-hot at onehot_tokens [m] (target ids); the two sets
        are disjoint. Every other cell is zero afterwards (a draft there is rejected: lossless), never a value of an
        earlier build."""
        dev = (q if q is not None else onehot_tokens).device
        if self.buf is None or self.buf.shape[0] < batch_size or self.buf.device != dev:
            self.buf = torch.zeros((batch_size, self.K, self.V), dtype=torch.float32, device=dev)
            self.draft_ids = self.draft_ids.to(dev)
            self._q_cells = self._onehot = None
        flat = self.buf.view(-1, self.V)  # [rows * K, V]
        if self._q_cells is not None:  # q lives in the draft-vocabulary columns only
            flat[self._q_cells[:, None], self.draft_ids[None, :]] = 0.0
            self._q_cells = None
        if self._onehot is not None:
            flat[self._onehot] = 0.0
            self._onehot = None
        if q_cells is not None and q_cells.numel():
            flat[q_cells[:, None], self.draft_ids[None, :]] = q.to(torch.float32)
            self._q_cells = q_cells
        if onehot_cells is not None and onehot_cells.numel():
            flat[onehot_cells, onehot_tokens] = 1.0  # zero before: the contract above
            self._onehot = (onehot_cells, onehot_tokens)
        return self.buf[:batch_size]
