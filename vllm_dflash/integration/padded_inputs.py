# SPDX-License-Identifier: Apache-2.0
"""`PaddedInputs`: vLLM's padded-batch preparation of one drafter call, done only where something reads it.

With a DFlash drafter configured, vLLM's runner prepares the drafter's inputs on every step before it calls
`propose`: `prepare_next_token_ids_padded` (each request's next token: a host loop over the batch for the backup
tokens, then a kernel) and, after a step that verified drafts, `prepare_inputs_padded` (rejected-token counts and a
new attention metadata); `propose` then runs `set_inputs_first_pass` (the draft's query ids / positions / slots and
the context rows' slots). Under adaptive drafting most steps at concurrency run no draft forward (the guard measured
'off', idle plans), and such a step reads none of it. Measured in process (dev/step_profile.py, c8, bf16 EPYC, every
guard pinned 'off'): the three took 0.5 ms of a 30 ms step, a step that costs 1.6 ms more than the same engine
without speculation.

Under synchronous scheduling (no host copy of the counts: the runner's `valid_sampled_token_count_event` is None, so
`_copy_valid_sampled_token_count` returns at once), our drafter's overrides hand the runner markers, empty tensors
the runner only passes on to `prepare_inputs_padded` and `propose`, both ours, and keep the arguments here;
`propose` resolves them on first read. Where the step just verified no draft (no row rejected), the context rows'
positions and slots are the target's own (`context_rows`: a row at position p sits at the slot vLLM computed for the
target from the same block table), so holding or dropping them needs no first pass either. Nothing is resolved
after `propose` returns: the runner's bookkeeping changes the input batch next."""
from __future__ import annotations

import torch
from vllm.v1.spec_decode.dflash import DFlashProposer


class PaddedInputs:
    """One drafter call's deferred preparation: the arguments of `prepare_next_token_ids_padded` and, where it was
    deferred too, of `prepare_inputs_padded`."""

    def __init__(self, drafter, sampled_token_ids: torch.Tensor, requests, input_batch,
                 discard_request_mask: torch.Tensor):
        self._drafter = drafter
        self._args = (sampled_token_ids, requests, input_batch, discard_request_mask)
        empty = sampled_token_ids.new_empty(0, dtype=torch.int32)
        # what the runner passes on in place of (next_token_ids, valid_sampled_tokens_count) and of
        # (token_indices_to_sample, num_rejected_tokens_gpu); told apart by identity
        self.next_marker, self.count_marker, self.index_marker = empty, empty.clone(), empty.clone()
        self._next: tuple[torch.Tensor, torch.Tensor] | None = None  # (next_token_ids [B], valid counts [B])
        self._spec = None  # (cad, spec_decode_metadata) of a deferred `prepare_inputs_padded`
        self.open = True  # resolvable: inside the drafter call that made it

    def next_and_count(self) -> tuple[torch.Tensor, torch.Tensor]:
        """vLLM's `prepare_next_token_ids_padded`, once. -> (next_token_ids [B], valid_sampled_tokens_count [B])."""
        if self._next is None:
            if not self.open:
                raise RuntimeError("vllm_dflash: padded drafter inputs read after the drafter call that made them")
            self._next = DFlashProposer.prepare_next_token_ids_padded(self._drafter, *self._args)
        return self._next

    def defer_padding(self, cad, spec_decode_metadata) -> bool:
        """`prepare_inputs_padded(cad, spec_decode_metadata, <our count marker>)`: deferred (True) where no request
        verified a draft in the step (no row rejected, so the counts say nothing the target's metadata does not);
        False: it must run now (the runner reads its metadata)."""
        if sum(spec_decode_metadata.num_draft_tokens) > 0:
            return False
        self._spec = (cad, spec_decode_metadata)
        return True

    @property
    def padding_deferred(self) -> bool:
        return self._spec is not None

    def padded(self):
        """vLLM's `prepare_inputs_padded` of a deferred call. -> (cad, token_indices_to_sample, num_rejected)."""
        cad, sdm = self._spec
        return DFlashProposer.prepare_inputs_padded(self._drafter, cad, sdm, self.next_and_count()[1])
