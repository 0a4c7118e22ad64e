# SPDX-License-Identifier: Apache-2.0
"""Greedy verification of a speculative step in one argmax pass: what vLLM's rejection sampler returns for an
all-greedy batch with nothing that changes the logits, without its copies.

vLLM's `RejectionSampler.forward` on an all-greedy batch gathers the bonus rows and runs the full `Sampler` over them,
gathers the target rows, converts them to float32, clones them, takes their argmax and runs the greedy kernel: on CPU
that is 3-4 copies of [num_draft_tokens, vocab] logits per step (8 ms of a 125 ms step at batch 32 on the 2-core
Xeon, dev/step_profile.py). The result depends only on the argmax of every logits row, so here: one float32 view of
the logits, one argmax over all rows (vLLM's CPU `greedy_argmax`, the op its own greedy sampler uses; torch's argmax
elsewhere; both take the first index of a tie), then the greedy kernel's rule on the host.

`eligible` lists the conditions under which the two agree token for token; anything else (sampling, logprobs,
penalties, bad words, allowed-token masks, an active logits processor that can change the argmax, a thinking budget,
synthetic acceptance) takes vLLM's path. The reference is vLLM's own `RejectionSampler.forward`, which
tests/vllm/test_greedy_verify.py compares this against on random and tied logits."""
from __future__ import annotations

import numpy as np
import torch

PLACEHOLDER_TOKEN_ID = -1  # vLLM's rejection_sampler.PLACEHOLDER_TOKEN_ID (checked by the seam table)


def _inactive(processor) -> bool:
    """Is this argmax-changing logits processor a vLLM builtin with no request using it? (Unknown ones count as
    active: we cannot tell.)"""
    name = type(processor).__name__
    if name == "MinTokensLogitsProcessor":
        return not processor.min_toks
    if name == "LogitBiasLogitsProcessor":
        return not processor.biases
    return False


def eligible(sampling_metadata, synthetic_mode: bool = False) -> bool:
    """Does vLLM's rejection sampler reduce to argmax + the greedy rule for this batch?"""
    sm = sampling_metadata
    if synthetic_mode or not sm.all_greedy or sm.max_num_logprobs is not None or sm.logprob_token_ids:
        return False
    if not sm.no_penalties or sm.allowed_token_ids_mask is not None or sm.bad_words_token_ids:
        return False
    holder = getattr(sm, "thinking_budget_state_holder", None)
    if holder is not None and holder.has_tracked_requests():
        return False
    return all(_inactive(p) for p in sm.logitsprocs.non_argmax_invariant)


def row_argmax(logits: torch.Tensor) -> torch.Tensor:
    """[R, V] logits (any float dtype) -> [R] int64 argmax of their float32 values, first index on ties."""
    x = logits if logits.dtype == torch.float32 else logits.to(torch.float32)
    if x.device.type == "cpu" and hasattr(torch.ops, "_C") and hasattr(torch.ops._C, "greedy_argmax"):
        return torch.ops._C.greedy_argmax(x.contiguous()).view(-1).long()
    return x.argmax(dim=-1).view(-1)


def greedy_accept(draft: np.ndarray, target: np.ndarray, bonus: np.ndarray, num_draft: np.ndarray,
                  max_spec_len: int) -> np.ndarray:
    """vLLM's greedy rejection rule, vectorised.

    draft, target: [N] draft token ids and the target's argmax at those positions, request-major; bonus: [B] the
    target's argmax after each request's last draft; num_draft: [B] drafts per request (sum N).
    -> [B, max_spec_len + 1] int32: per request the target tokens up to and including the first rejected position
    (the correction), or all its drafts then the bonus when none is rejected; PLACEHOLDER_TOKEN_ID after."""
    B, K = len(num_draft), max_spec_len
    out = np.full((B, K + 1), PLACEHOLDER_TOKEN_ID, dtype=np.int32)
    starts = np.cumsum(num_draft) - num_draft  # [B]
    j = np.arange(K)[None, :]  # [1, K]
    valid = j < num_draft[:, None]  # [B, K]
    if len(draft):
        idx = np.minimum(starts[:, None] + j, len(draft) - 1)  # [B, K]
        tgt = target[idx]
        mism = valid & (draft[idx] != tgt)
    else:
        tgt = np.zeros((B, K), dtype=np.int64)
        mism = np.zeros((B, K), dtype=bool)
    rejected = mism.any(axis=1)  # [B]
    first = np.where(rejected, mism.argmax(axis=1), num_draft)  # [B] position of the correction, or num_draft
    keep = valid & (j <= first[:, None])
    out[:, :K][keep] = tgt[keep]
    rows = np.nonzero(~rejected)[0]
    out[rows, num_draft[rows]] = bonus[rows]
    return out


def greedy_verify(metadata, logits: torch.Tensor) -> torch.Tensor:
    """The rejection sampler's output for an `eligible` batch. metadata: vLLM's SpecDecodeMetadata; logits:
    [N + B, V], the rows `metadata.target_logits_indices` and `bonus_logits_indices` index.
    -> [B, max_spec_len + 1] int32 on the logits' device."""
    am = row_argmax(logits).cpu()  # [N + B]
    target = am[metadata.target_logits_indices.cpu()].numpy()
    bonus = am[metadata.bonus_logits_indices.cpu()].numpy()
    draft = metadata.draft_token_ids.cpu().numpy().astype(np.int64, copy=False)
    num_draft = np.asarray(metadata.num_draft_tokens, dtype=np.int64)
    out = greedy_accept(draft, target, bonus, num_draft, int(metadata.max_spec_len))
    return torch.from_numpy(out).to(logits.device)
