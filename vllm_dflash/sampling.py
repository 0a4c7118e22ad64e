# SPDX-License-Identifier: Apache-2.0
"""Verification maths for one block: greedy prefix matching and lossless (target-only) rejection sampling.

The draft proposes tokens d_1..d_k deterministically (argmax), i.e. a one-hot draft distribution.
Lossless sampling then accepts d_j with probability p_j(d_j), where p_j is the target's processed
distribution at that position; on the first rejection it samples the bonus from p_j with d_j removed
(renormalised); if all k are accepted the bonus is sampled from p_{k+1}. Every committed token is
therefore distributed exactly as the target alone would sample it:
  P(x) = p(d)·[x = d] + (1 - p(d))·p(x)·[x != d] / (1 - p(d)) = p(x).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature: {self.temperature} < 0. Fix: use 0 (greedy) or a positive value")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: {self.top_p} not in (0, 1]. Fix: use a value in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"top_k: {self.top_k} < 0. Fix: use 0 (off) or a positive value")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [..., V] -> probabilities after temperature, top-k and top-p (fp32)."""
    logits = logits.float() / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        cum = sorted_p.cumsum(-1)
        drop = cum - sorted_p > params.top_p  # keep the smallest prefix whose mass reaches top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def greedy_verify(drafts: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """drafts [k], target_logits [k+1, V] (row j predicts the token after block position j).

    Returns (accepted a, bonus token): a = length of the prefix with d_j == argmax row j-1."""
    pred = target_logits.argmax(-1)  # [k+1]
    match = (drafts == pred[: drafts.shape[0]]).long()
    a = int(torch.cumprod(match, 0).sum()) if drafts.numel() else 0
    return a, int(pred[a])


def sample_verify(drafts: torch.Tensor, target_logits: torch.Tensor, params: SamplingParams,
                  generator: torch.Generator | None) -> tuple[int, int]:
    """Lossless rejection sampling with a one-hot draft. Same contract as greedy_verify."""
    probs = target_probs(target_logits, params)  # [k+1, V]
    k = drafts.shape[0]
    for j in range(k):
        d = int(drafts[j])
        u = torch.rand((), generator=generator, device=probs.device)
        if u < probs[j, d]:
            continue
        residual = probs[j].clone()
        residual[d] = 0.0
        total = residual.sum()
        if total <= 0:  # all mass on d (fp round-off made u >= p(d)): that is an acceptance
            continue
        return j, int(torch.multinomial(residual / total, 1, generator=generator))
    return k, int(torch.multinomial(probs[k], 1, generator=generator))


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Plain sampling (or argmax) of one token from logits [V]."""
    if params.greedy:
        return int(logits.argmax(-1))
    return int(torch.multinomial(target_probs(logits, params), 1, generator=generator))


def draft_distribution(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None = None,
                       top_p: torch.Tensor | None = None) -> torch.Tensor:
    """The draft's sampling distribution q per row, processed like a request's target distribution (temperature,
    then top-k, then top-p; `target_probs` per row). logits [N, V] (the draft vocabulary), temperature [N] (> 0),
    top_k [N] (>= V: off) and top_p [N] (1: off), None where no row uses them. -> q [N, V] float32, rows sum to 1.

    Any q is lossless under rejection sampling as long as the draft token was drawn from it and q is what the
    verifier reads; matching the request's processing makes q close to the target's p, which is what acceptance
    (sum_x min(p, q)) rewards."""
    logits = logits.float() / temperature.float()[:, None]
    if top_k is None and top_p is None:
        return torch.softmax(logits, dim=-1)
    V = logits.shape[-1]
    sorted_logits, idx = logits.sort(dim=-1, descending=True)  # [N, V]
    if top_k is not None:
        rank = torch.arange(V, device=logits.device)[None, :]
        sorted_logits = sorted_logits.masked_fill(rank >= top_k.to(torch.long)[:, None], float("-inf"))
    sorted_p = torch.softmax(sorted_logits, dim=-1)
    if top_p is not None:
        drop = sorted_p.cumsum(-1) - sorted_p > top_p.float()[:, None]  # keep the smallest prefix reaching top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        sorted_p = sorted_p / sorted_p.sum(-1, keepdim=True)
    return torch.zeros_like(sorted_p).scatter_(-1, idx, sorted_p)


def sample_rows(q: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One token per row of q [N, V] by inverse CDF: uniform [N] in [0, 1) -> ids [N] (int64), each drawn from its
    row (one uniform per row: cheaper on CPU than Gumbel noise over the vocabulary, and a request's own seeded
    generator can supply it). Never a zero-probability token."""
    cdf = q.double().cumsum(-1)  # [N, V]
    x = uniform.double()[:, None] * cdf[:, -1:]
    idx = torch.searchsorted(cdf, x, right=True).squeeze(-1).clamp_(max=q.shape[-1] - 1)  # first cdf > x
    bad = q.gather(-1, idx[:, None]).squeeze(-1) <= 0  # round-off at the top of the CDF only
    return torch.where(bad, q.argmax(-1), idx)
