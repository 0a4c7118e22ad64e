# SPDX-License-Identifier: Apache-2.0
"""The draft forward's passes: `diffusion_steps` passes of the draft model over [anchor, MASK x K] per request (keep
the confident prefix, re-mask the rest, run again over the same slots), then the block's tokens: the argmax over the
reduced draft vocabulary (one-hot drafts), or with one pass and sampled requests in the batch, draws from the
draft's marginals (block_sampling.py)."""
from __future__ import annotations

import math

import torch

from vllm_dflash.integration.drafting.block_sampling import sample_block


def denoise(step, sample_idx: torch.Tensor, keep: torch.Tensor | None = None,
            layout: list[int] | None = None) -> torch.Tensor:
    """The draft forward of `step` (a DraftStep). sample_idx: [n * K] the query slots of the n requests it drafts
    for, request-major; keep: [m] the positions of sample_idx whose drafts are verified (one pass only;
    `verified_positions`), None: all; layout: the batch row of each request of sample_idx (None: 0..).
    -> [n, K] draft token ids (the mask id at positions left out)."""
    d, K = step.drafter, step.K
    model = d._inner()
    t_fwd = d.timer.start()
    steps = d.diffusion_steps
    mask_id = d.parallel_drafting_token_id
    drafts = prev = fixed = None
    for s in range(steps):
        hidden = step.run_model()
        sample_hidden = hidden[sample_idx]  # [n * K, H], request-major
        if s == steps - 1:
            if steps == 1 and d.sample_drafts and not step.sampling_metadata.all_greedy:
                layout = layout if layout is not None else list(range(sample_hidden.shape[0] // K))
                drafts = sample_block(step, sample_hidden, keep, layout)
            elif steps == 1 and keep is not None:  # the verified positions alone (block_rows.py)
                drafts = torch.full((sample_hidden.shape[0],), mask_id, dtype=torch.int64,
                                    device=sample_hidden.device)  # [n * K]
                drafts[keep] = model.draft_argmax(sample_hidden[keep]).to(torch.int64)
                drafts = drafts.view(-1, K)
            elif steps == 1:  # one-hot drafts: the argmax over the draft vocabulary, mapped to target ids (vLLM's
                # greedy path first spreads the draft logits over the whole target vocabulary: 4x the time on CPU)
                drafts = model.draft_argmax(sample_hidden).view(-1, K)
            else:  # greedy completion of the still-masked positions (one-hot drafts stay lossless)
                tok = model.draft_argmax(sample_hidden).view(-1, K)
                drafts = torch.where(fixed, prev, tok)
            break
        conf, tok = model.draft_confidence(sample_hidden)
        conf, tok = conf.view(-1, K), tok.view(-1, K)
        if prev is not None:
            tok = torch.where(fixed, prev, tok)
            conf = torch.where(fixed, torch.ones_like(conf), conf)
        run = torch.cumprod((conf >= d.confidence_threshold).to(torch.int32), dim=1).sum(1)  # [n]
        quota = math.ceil(K * (s + 1) / steps)
        kept = torch.clamp(torch.clamp(run, min=quota), max=K)
        fixed = torch.arange(K, device=tok.device)[None, :] < kept[:, None]  # [n, K]
        prev = tok
        new_ids = torch.where(fixed, tok, torch.full_like(tok, mask_id))
        d.input_ids[sample_idx] = new_ids.reshape(-1).to(d.input_ids.dtype)  # re-mask the rest
    d.timer.stop("draft_forward_seconds", t_fwd, d.metrics)
    d.metrics.set("block_size", K + 1)
    return drafts
