# SPDX-License-Identifier: Apache-2.0
"""Speculative sampling for an all-sampled batch on CPU, drawing the recovered token only where it is used.

vLLM's `rejection_sample` on a batch of sampled requests draws [B, V] exponentials (one exponential race per
request), then computes a recovered token at EVERY draft position ([T, V] work), and only then walks the drafts; at
most one recovered token per request is used, the one at its first rejected position. On CPU that made rejection
sampling 33 ms against the plain sampler's 3 ms at batch 8, K = 7, a 49k vocabulary (dev/studies/rejection_cost.py;
12.8 ms of it `exponential_`, 3 ms the recovered-token kernel), which is why sampled requests lost speed with
speculation.

Here, with the same rule and the same distribution:
1. p = softmax of the target rows (as vLLM), p(x) at each draft token;
2. accept draft j while u_j <= p(x_j) / q(x_j) (vLLM's kernel: a draft with q(x) == 0 is rejected; q = 1 for drafts
   without probabilities, i.e. one-hot proposals), u_j uniform from vLLM's own `generate_uniform_probs` (seeded
   requests keep their generators);
3. at each request's first rejected position only: the recovered token from max(p - q, 0) (without draft
   probabilities: p with the draft token removed), by the inverse CDF (vLLM: an exponential race over [B, V]
   exponentials, the largest single cost), on that request's generator if it has one;
4. all drafts accepted: the bonus token vLLM already sampled.
Greedy and mixed batches, synthetic acceptance and non-CPU tensors take vLLM's path (the patch decides). The
distribution is that of speculative sampling (Leviathan et al.; vLLM's kernels): the first token of every request
follows p exactly, whatever q is (tests/unit/test_sampled_verify.py, chi-square, with a mismatched-q control).
Seeded requests are reproducible run to run but do not replay vLLM's random stream (other draws)."""
from __future__ import annotations

from typing import Callable

import torch

PLACEHOLDER_TOKEN_ID = -1  # vLLM's rejection_sampler.PLACEHOLDER_TOKEN_ID (checked by the seam table)


def accept_lengths(draft_ids: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor | None,
                   uniform: torch.Tensor, num_draft: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """draft_ids: [T] int; target_probs: [T, V] float32; draft_probs: [T, V] or None (q = 1 at the draft token);
    uniform: [T] float64; num_draft: [B] drafts per request (sum T).
    -> (accepted drafts per request [B] int64, whether the request rejected one [B] bool)."""
    T = draft_ids.shape[0]
    B = len(num_draft)
    if T == 0:
        return torch.zeros(B, dtype=torch.long), torch.zeros(B, dtype=torch.bool)
    ids = draft_ids.long().view(T, 1)
    p_x = target_probs.gather(1, ids).view(T).double()  # [T]
    q_x = draft_probs.gather(1, ids).view(T).double() if draft_probs is not None else torch.ones(T, dtype=torch.float64)
    ok = (q_x > 0) & (p_x >= uniform * q_x)  # [T]  vLLM: draft_prob > 0 and target / draft >= uniform
    counts = torch.tensor(num_draft, dtype=torch.long)
    K = max(num_draft)
    starts = torch.cumsum(counts, 0) - counts  # [B]
    j = torch.arange(K)  # [K]
    valid = j[None, :] < counts[:, None]  # [B, K]
    idx = (starts[:, None] + j[None, :]).clamp(max=T - 1)  # [B, K]
    rejected_at = valid & ~ok[idx]  # [B, K]
    rejected = rejected_at.any(dim=1)  # [B]
    accepted = torch.where(rejected, rejected_at.to(torch.int8).argmax(dim=1).long(), counts)  # [B]
    return accepted, rejected


def recovered_token(target_row: torch.Tensor, draft_id: int, q_row: torch.Tensor | None,
                    generator: torch.Generator | None) -> int:
    """One recovered token: a draw from max(p - q, 0) (q_row None: p without the draft token), p the [V] float32
    target probabilities, by the inverse CDF (a float64 running sum and one uniform: O(V) additions, where vLLM's
    exponential race costs V exponentials). A token of probability 0 is never drawn: the first index whose running
    sum exceeds u has a positive probability."""
    if q_row is None:
        prob = target_row.double()
        prob[draft_id] = 0.0
    else:
        prob = (target_row.double() - q_row.double()).clamp_(min=0.0)  # [V]
    cdf = torch.cumsum(prob, 0)  # [V]
    u = torch.rand((), dtype=torch.float64, generator=generator) * cdf[-1]
    return min(int(torch.searchsorted(cdf, u.view(1), right=True)), prob.shape[0] - 1)


def rejection_sample_sampled(draft_ids: torch.Tensor, num_draft: list[int], max_spec_len: int,
                             draft_probs: torch.Tensor | None, target_logits: torch.Tensor,
                             bonus_ids: torch.Tensor, generators: dict[int, torch.Generator],
                             uniform_fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    """vLLM's `rejection_sample` for an all-sampled batch (same arguments, by meaning): draft_ids [T], num_draft [B],
    draft_probs [T, V] or None, target_logits [T, V] float32 after the sampling constraints, bonus_ids [B, 1],
    generators {request index: torch.Generator}, uniform_fn -> [T] float64 (vLLM's generate_uniform_probs).
    -> [B, max_spec_len + 1] int32: accepted drafts, then the recovered or bonus token, PLACEHOLDER_TOKEN_ID after."""
    B = len(num_draft)
    out = torch.full((B, max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32)
    uniform = uniform_fn()  # [T]
    target_probs = target_logits.softmax(dim=-1, dtype=torch.float32)  # [T, V] (vLLM takes the same softmax)
    accepted, rejected = accept_lengths(draft_ids, target_probs, draft_probs, uniform, num_draft)
    counts = torch.tensor(num_draft, dtype=torch.long)
    starts = torch.cumsum(counts, 0) - counts
    draft_host = draft_ids.to(torch.int32)
    for b in range(B):
        n, s = int(accepted[b]), int(starts[b])
        out[b, :n] = draft_host[s:s + n]
        if bool(rejected[b]):
            row = s + n
            q_row = draft_probs[row] if draft_probs is not None else None
            out[b, n] = recovered_token(target_probs[row], int(draft_ids[row]), q_row, generators.get(b))
        else:
            out[b, n] = int(bonus_ids.view(-1)[b])
    return out
