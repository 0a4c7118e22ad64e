# SPDX-License-Identifier: Apache-2.0
"""`FixedBlock`: the drafting strategy of `adaptive: false`. Every request drafts the whole block every step (K
tokens from the draft forward, verified in full); a hinted draft's block is fed its prompt lookup first (synchronous
scheduling only: under overlap there is no host history to look up)."""
from __future__ import annotations

import torch

from vllm_dflash.integration.drafting.hints import hint_tokens, write_hints
from vllm_dflash.integration.drafting.plan import decode_rows


class FixedBlock:
    controller = None  # no adaptive controller

    def __init__(self, drafter, mode, device=None):
        self.drafter = drafter
        self.hinted = drafter.hint_ngram is not None and not mode.async_scheduling

    def load_model(self, target_model) -> None:
        pass

    def propose(self, step) -> torch.Tensor:
        """-> [B, K] the block's drafts of every request (the draft's q for the verifier where it sampled)."""
        d, K = self.drafter, step.K
        if K == 0:
            return step.empty()
        d.metrics.inc("draft_steps")
        if self.hinted:
            rows = decode_rows(d._runner.input_batch, K, step.target_positions, step.next_token_ids, step.target_cad,
                               step.num_rejected)
            write_hints(step.query_ids(), K, rows.rows, hint_tokens(d.hint_ngram, None, K, None, rows.histories))
        drafts = step.draft()
        if step.block_q is not None:  # every slot of every request is a DFlash token
            cells, q, _ = step.block_q
            d._last_draft_probs = d._q_buffer.build(step.batch_size, cells, q)
        d.metrics.flush()
        return drafts
