# SPDX-License-Identifier: Apache-2.0
"""`DraftStep`: one call of `DFlashDrafter.propose` (the inputs vLLM laid out for it) and the draft forward over it:
prepared on first use (attention metadata and the KV injection, `DFlashDrafter.forward_inputs`), then
`diffusion_steps` passes of the draft model (denoise.py). The strategies (fixed.py, adaptive.py, overlap.py) decide
whether and over which requests `draft` runs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from vllm.forward_context import set_forward_context

from vllm_dflash.integration.block_rows import subset_sample_idx, verified_positions
from vllm_dflash.integration.drafting.denoise import denoise
from vllm_dflash.integration.padded_inputs import PaddedInputs


@dataclass(frozen=True)
class ForwardInputs:
    """What the draft forward of a step runs with (built once, before its first pass)."""

    per_layer_md: Any  # per-layer attention metadata
    mode: Any  # cudagraph runtime mode
    num_input_tokens: int  # padded
    across_dp: Any  # tokens across DP ranks
    model_kwargs: dict
    slot_mapping_size: int
    cad: Any  # the metadata of the rows the forward runs over
    select: list[int] | None  # the batch rows it runs over (block_rows.py), None: every request


class DraftStep:
    """target_cad: the `common_attn_metadata` vLLM passed (the target's query rows); hidden: the target features of
    this step's context rows ([num_context, H] combined by fc, or raw [num_context, n_feat * H] when deferred);
    defer: the context rows are injected with the next draft forward (deferred_context.py).

    vLLM's padded-batch inputs are read on first use (integration/padded_inputs.py): `next_token_ids`, and
    `cad`, `num_tokens`, `sample_idx`, what `set_inputs_first_pass` returns for the draft's query [anchor, MASK x K]
    per request (`first_pass`). padded: the call's deferred preparation (None: vLLM prepared everything);
    num_rejected None: no row of the step was rejected (it verified no draft)."""

    def __init__(self, drafter, K: int, batch_size: int, target_cad, hidden: torch.Tensor, sampling_metadata,
                 mm_embed_inputs, target_token_ids: torch.Tensor, target_positions: torch.Tensor,
                 next_token_ids: torch.Tensor, token_indices_to_sample, num_rejected: torch.Tensor | None,
                 defer: bool, padded: PaddedInputs | None = None):
        self.drafter, self.K = drafter, K
        self.target_cad, self.batch_size = target_cad, batch_size
        self.hidden, self.num_context = hidden, int(target_token_ids.shape[0])
        self.sampling_metadata, self.mm_embed_inputs = sampling_metadata, mm_embed_inputs
        self.target_token_ids, self.target_positions = target_token_ids, target_positions
        self._padded = padded
        lazy_next = padded is not None and next_token_ids is padded.next_marker
        self._next = None if lazy_next else next_token_ids
        if padded is not None and token_indices_to_sample is padded.index_marker:  # padding deferred: nothing rejected
            token_indices_to_sample, num_rejected = None, None
        self._token_indices, self.num_rejected = token_indices_to_sample, num_rejected
        self._first: tuple[int, torch.Tensor, object] | None = None  # set_inputs_first_pass's (num_tokens, idx, cad)
        self.defer = defer
        self.inputs: ForwardInputs | None = None
        self.block_rows = 0  # requests the draft forward ran over (block_rows.py: those that use its tokens)
        self.block_q = None  # the draft forward's q: (flat cells [m] over [B, K], q [m, V_draft], sampled [m])
        self.drop_context = False  # the plan says 'off' won here: this step's context rows are dropped, not held

    @property
    def next_token_ids(self) -> torch.Tensor:
        """[B] each request's next token (the one just sampled, or its backup)."""
        if self._next is None:
            self._next = self._padded.next_and_count()[0]
        return self._next

    def first_pass(self) -> tuple[int, torch.Tensor, object]:
        """`set_inputs_first_pass` of this step, once (vLLM's deferred padding first, where it was deferred).
        -> (num_tokens, sample_idx, cad) of the draft's query rows."""
        if self._first is None:
            cad, idx, rejected = self.target_cad, self._token_indices, self.num_rejected
            if self._padded is not None and self._padded.padding_deferred:
                cad, idx, rejected = self._padded.padded()
            self._first = self.drafter.first_pass(self, cad, idx, rejected)
        return self._first

    @property
    def num_tokens(self) -> int:
        return self.first_pass()[0]

    @property
    def sample_idx(self) -> torch.Tensor:
        return self.first_pass()[1]

    @property
    def cad(self):
        return self.first_pass()[2]

    def query_ids(self) -> torch.Tensor:
        """The draft's input ids buffer, once `set_inputs_first_pass` laid out [anchor, MASK x K] per request in it
        (hints overwrite MASK slots after that)."""
        self.first_pass()
        return self.drafter.input_ids

    def context_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(positions [num_context], slots [num_context]) of this step's context rows in the draft's KV cache. Where
        no row was rejected, the target's own: the draft's cache shares the block table vLLM computed the target's
        slots from (`common_attn_metadata` of the draft's KV-cache group), so no first pass is needed."""
        m = self.num_context
        if self._first is None and self.num_rejected is None and self.target_positions.dim() == 1:
            return self.target_positions[:m], self.target_cad.slot_mapping[:m]
        self.first_pass()
        d = self.drafter
        return d._context_positions_buffer[:m], d._context_slot_mapping_buffer[:m]

    def empty(self) -> torch.Tensor:
        """No drafts: [B, 0]."""
        return torch.empty(self.batch_size, 0, device=self.target_positions.device, dtype=torch.int64)

    def prepare(self, select: list[int] | None = None) -> None:
        """Metadata + KV injection, once, before the first pass (select: the batch rows the forward runs over,
        deferred injection only; None: every request)."""
        self.inputs = self.drafter.forward_inputs(self, select)

    def run_model(self) -> torch.Tensor:
        """One pass of the draft model over this step's query slots. -> hidden states [padded tokens, H]."""
        if self.inputs is None:
            self.prepare()
        d, f = self.drafter, self.inputs
        with set_forward_context(f.per_layer_md, d.vllm_config, num_tokens=f.num_input_tokens,
                                 num_tokens_across_dp=f.across_dp, cudagraph_runtime_mode=f.mode,
                                 slot_mapping=d._get_slot_mapping(f.slot_mapping_size, f.cad.slot_mapping)):
            return d.model(**f.model_kwargs)

    def draft(self, select: list[int] | None = None, spans: dict[int, tuple[int, int]] | None = None) -> torch.Tensor:
        """The draft forward. select: the batch rows whose drafts are used; with one greedy pass the forward runs
        over those alone (the other rows hold the mask id, never read). spans: batch row -> (lo, hi), the block slots
        it verifies; with one greedy pass the draft-vocabulary argmax runs at those alone (the other slots hold the
        mask id). -> [B, K] draft token ids."""
        K, B = self.K, self.batch_size
        one_pass = self.drafter.diffusion_steps == 1
        if self.inputs is None and select is not None and one_pass:
            self.prepare(select)
        sel = self.inputs.select if self.inputs is not None else None
        self.block_rows = B if sel is None else len(sel)
        layout = list(range(B)) if sel is None else sel
        keep = verified_positions(layout, spans, K, self.sample_idx.device) if spans is not None and one_pass else None
        if sel is None:
            return denoise(self, self.sample_idx, keep, layout)
        mine = denoise(self, subset_sample_idx(self.sample_idx, sel, K + 1, K), keep, layout)
        out = mine.new_full((B, K), self.drafter.parallel_drafting_token_id)  # [B, K]
        out[torch.tensor(sel, dtype=torch.long, device=mine.device)] = mine
        return out
