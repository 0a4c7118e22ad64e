# SPDX-License-Identifier: Apache-2.0
"""Sampled requests' drafts (setting draft_sampling): the last pass of one-pass drafting draws a sampled request's
first slots from the draft's marginals (`sample_block`), and the verifier gets that q (`hand_off_probs`, read by
vLLM through `take_last_draft_probs`; integration/draft_probs.py builds the [B, K, V] tensor). Greedy requests keep
one-hot drafts (the argmax): lossless."""
from __future__ import annotations

import torch
from vllm.logger import init_logger

from vllm_dflash.sampling import draft_distribution, sample_rows

logger = init_logger(__name__)


def resolve_draft_sampling(mode: str, diffusion_steps: int, spec) -> bool:
    """Setting draft_sampling (`mode`: greedy, auto or probabilistic): do sampled requests draft from the draft's
    marginals (q handed to the verifier)? auto falls back to the argmax (one-hot q, logged) where q cannot be used
    (several denoising passes, or a rejection sampler that does not read q: speculative_config `spec`);
    probabilistic raises there."""
    if mode == "greedy":
        return False
    why = None
    if diffusion_steps > 1:
        why = (f"diffusion_steps is {diffusion_steps} (denoising keeps argmax tokens)",
               "set speculative_config.diffusion_steps to 1")
    elif getattr(spec, "rejection_sample_method", "standard") != "standard":
        why = (f"rejection_sample_method is {spec.rejection_sample_method!r} (it does not read q)",
               "drop speculative_config.rejection_sample_method")
    if why is None:
        return True
    if mode == "probabilistic":
        raise ValueError("vllm_dflash: draft_sampling 'probabilistic' needs one denoising pass and vLLM's "
                         f"standard rejection sampler; {why[0]}. Fix: {why[1]}, or set "
                         "speculative_config.draft_sampling to 'auto' or 'greedy'")
    logger.info("vllm_dflash: sampled requests draft the argmax (one-hot q): %s", why[0])
    return False


def sample_block(step, hidden: torch.Tensor, keep: torch.Tensor | None, layout: list[int]) -> torch.Tensor:
    """The last pass of one-pass drafting when the batch has sampled requests. A greedy request's slots take the
    argmax (as without sampling: lossless one-hot drafts); a sampled request's first `sampled_slots` slots a draw
    from the draft's marginals at the request's temperature, top-k and top-p (`draft_distribution`), drawn with the
    request's own generator where it is seeded, its later slots the argmax (one-hot q). The q of every position is
    kept in `step.block_q` for the verifier (`hand_off_probs`).
    hidden: [len(layout) * K, H] request-major; keep: [m] the positions drafted (None: all).
    -> [len(layout), K] target ids (the mask id at positions left out)."""
    d, K = step.drafter, step.K
    model = d._inner()
    dev, n = hidden.device, hidden.shape[0]
    pos = keep if keep is not None else torch.arange(n, device=dev)  # [m]
    rows = torch.tensor(layout, dtype=torch.long, device=dev).repeat_interleave(K)[pos]  # [m] batch rows
    slots = pos % K  # [m]
    logits = model.draft_logits(hidden[pos])  # [m, V_draft]
    greedy_ids = model._to_target_ids(logits.max(dim=-1).indices)  # == draft_argmax
    sm = step.sampling_metadata
    temp = sm.temperature[rows]  # [m]; 0 for greedy requests
    sampled = temp != 0
    q = draft_distribution(logits, torch.where(sampled, temp, torch.ones_like(temp)),
                           None if sm.top_k is None else sm.top_k[rows],
                           None if sm.top_p is None else sm.top_p[rows])  # [m, V_draft]
    u = torch.rand(rows.shape[0], dtype=torch.float64, device=dev)  # [m]
    for r, gen in sm.generators.items():  # seeded requests: their own stream
        at = (rows == r).nonzero().squeeze(-1)
        if at.numel():
            u[at] = torch.empty(at.numel(), dtype=torch.float64, device=dev).uniform_(generator=gen)
    draw = sampled & (slots < d.sampled_slots)  # [m] slots drawn from q; the others take the argmax
    argmax = logits.max(dim=-1).indices  # [m] draft ids
    q = torch.where(draw[:, None], q, torch.zeros_like(q).scatter_(1, argmax[:, None], 1.0))  # one-hot there
    ids = torch.where(draw, model._to_target_ids(sample_rows(q, u)), greedy_ids)
    drafts = torch.full((n,), d.parallel_drafting_token_id, dtype=torch.int64, device=dev)  # [len * K]
    drafts[pos] = ids.to(torch.int64)
    step.block_q = (rows * K + slots, q, sampled)
    return drafts.view(-1, K)


def hand_off_probs(step, rows, tokens, spans) -> None:
    """q for the verifier after an adaptive plan (`take_last_draft_probs`). Per batch row rows[j] with proposal
    tokens[j] (its first min(len, K) slots are verified) and DFlash slots spans[j] = (lo, hi) (None: none): the
    draft's q at a sampled request's DFlash slots, one-hot q at every other slot of every row with a proposal
    (prompt lookup own or cross-request, a merged proposal's lookup slots, padding, greedy rows). vLLM's runner reads
    q for every request with drafts, so no such cell may keep an earlier step's value (`DraftProbs.build` zeroes
    whatever a build does not name). Leaves `_last_draft_probs` None (one-hot for all, vLLM's default) when no
    sampled request verifies a sampled DFlash token."""
    if step.block_q is None:
        return
    d = step.drafter
    cells_t, q, sampled_t = step.block_q
    K = d.num_speculative_tokens
    B = max(len(d._runner.input_batch.req_ids), max(rows, default=-1) + 1)
    cells, sampled = cells_t.tolist(), sampled_t.tolist()
    where = {c: i for i, (c, s) in enumerate(zip(cells, sampled)) if s}  # sampled cells -> q row
    if not where:
        return
    take, q_cells, hot_cells, hot_tokens = [], [], [], []
    for r, toks, span in zip(rows, tokens, spans):
        lo, hi = span if span is not None else (0, 0)
        for j in range(min(len(toks), K)):
            c = r * K + j
            if lo <= j < hi and c in where:
                take.append(where[c])
                q_cells.append(c)
            else:
                hot_cells.append(c)
                hot_tokens.append(int(toks[j]))
    if not take:
        return
    dev = q.device
    d._last_draft_probs = d._q_buffer.build(
        B, torch.tensor(q_cells, device=dev), q[torch.tensor(take, device=dev)],
        torch.tensor(hot_cells, dtype=torch.long, device=dev), torch.tensor(hot_tokens, device=dev))
