# SPDX-License-Identifier: Apache-2.0
"""The reference DFlash decoding loop: pure PyTorch + a transformers target. The oracle for everything else.

One request at a time:
  1. prefill the prompt through the target, capturing the features of `target_layer_ids` for every
     prompt position; the first token comes from the last logits (the first "bonus");
  2. draft: block [anchor, MASK x (B-1)] at positions n-1 .. n+B-2, one (or `diffusion_steps`)
     draft forward(s) over the cached context K/V -> B-1 proposals;
  3. verify the whole block in one target pass; greedy = longest matching prefix + the target's
     token at the first mismatch (bonus); sampling = lossless rejection (vllm_dflash.sampling);
  4. commit anchor + accepted drafts to both caches (target KV cropped, draft context K/V appended
     from the verify pass's features); the bonus is the next anchor;
  5. stop tokens and max_new_tokens are honoured inside an accepted block (nothing past them).

Invariant between steps: target KV length == draft context length == len(committed) - 1 (the anchor
is committed but not yet processed). block_size == 1 is plain autoregressive decoding (no draft),
the baseline for speedups.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import nn

from vllm_dflash.model import KV, DFlashDraftModel
from vllm_dflash.sampling import SamplingParams, greedy_verify, sample_token, sample_verify


@dataclass
class DecodeStats:
    """Acceptance statistics over verify steps. τ counts the bonus token (vLLM's 1 + accepted/drafts)."""

    block_size: int
    num_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)  # [B-1] drafts accepted at position k
    histogram: list[int] = field(default_factory=list)  # [B] steps that committed 1..B tokens
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.accepted_per_pos:
            self.accepted_per_pos = [0] * max(self.block_size - 1, 0)
        if not self.histogram:
            self.histogram = [0] * self.block_size

    def record(self, num_drafts: int, accepted: int) -> None:
        self.num_steps += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted += accepted
        for k in range(accepted):
            self.accepted_per_pos[k] += 1
        self.histogram[accepted] += 1

    def merge(self, other: "DecodeStats") -> "DecodeStats":
        assert other.block_size == self.block_size
        self.num_steps += other.num_steps
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted += other.num_accepted
        self.accepted_per_pos = [a + b for a, b in zip(self.accepted_per_pos, other.accepted_per_pos)]
        self.histogram = [a + b for a, b in zip(self.histogram, other.histogram)]
        self.draft_time_s += other.draft_time_s
        self.verify_time_s += other.verify_time_s
        return self

    @property
    def acceptance_length(self) -> float:
        """τ: mean tokens committed per verify step, bonus included."""
        return 1.0 + self.num_accepted / self.num_steps if self.num_steps else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """P(draft k accepted) per verify step (vLLM's accepted_per_pos / num_drafts)."""
        return [a / self.num_steps if self.num_steps else 0.0 for a in self.accepted_per_pos]

    def to_dict(self) -> dict:
        return {"block_size": self.block_size, "num_steps": self.num_steps, "num_draft_tokens": self.num_draft_tokens,
                "num_accepted": self.num_accepted, "acceptance_length": self.acceptance_length,
                "per_position_acceptance": self.per_position_acceptance, "histogram": self.histogram,
                "draft_time_s": self.draft_time_s, "verify_time_s": self.verify_time_s}


@dataclass
class GenerationResult:
    token_ids: list[int]  # generated tokens (prompt excluded), truncated at stop / max_new_tokens
    stats: DecodeStats
    finish_reason: str  # "stop" | "length"
    wall_time_s: float


class TargetRunner:
    """A transformers causal LM with a KV cache and feature capture (hidden states of given layers)."""

    def __init__(self, model: nn.Module, layer_ids: Sequence[int] = ()):
        self.model = model.eval()
        self.layer_ids = tuple(layer_ids)
        self.cache = None

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids [T] at positions start..start+T-1 (appended to the cache) -> logits [T, V], features [T, F]."""
        pos = torch.arange(start, start + ids.shape[0], device=ids.device)[None]
        out = self.model(input_ids=ids[None], position_ids=pos, past_key_values=self.cache, use_cache=True,
                         output_hidden_states=bool(self.layer_ids))
        feats = None
        if self.layer_ids:
            # hidden_states[0] is the embedding output; layer l's output is hidden_states[l + 1]
            feats = torch.cat([out.hidden_states[l + 1][0] for l in self.layer_ids], dim=-1)
        return out.logits[0], feats

    def crop(self, length: int) -> None:
        """Keep the first `length` cached positions."""
        extra = self.cache.get_seq_length() - length
        if extra > 0:
            self.cache.crop(-extra)


class ReferenceDecoder:
    """Reference DFlash loop for one request at a time (`generate`)."""

    def __init__(self, target: nn.Module, draft: DFlashDraftModel | None, *, block_size: int | None = None,
                 diffusion_steps: int | None = None, confidence_threshold: float = 0.9):
        self.draft = draft
        self.block_size = block_size if block_size is not None else (draft.config.block_size if draft else 1)
        if self.block_size < 1:
            raise ValueError(f"block_size: {self.block_size} < 1. Fix: use 1 (no drafting) or >= 2")
        if self.block_size > 1 and draft is None:
            raise ValueError("draft: a block size > 1 needs a draft model. Fix: pass draft= or block_size=1")
        if draft is not None:
            draft.config.check_target(target.config)
            if not draft.is_bound:
                draft.bind_target(target.get_input_embeddings().weight.to(draft.fc.weight.dtype),
                                  target.get_output_embeddings().weight.to(draft.fc.weight.dtype))
        self.diffusion_steps = diffusion_steps or (draft.config.diffusion_steps if draft else 1)
        self.confidence_threshold = confidence_threshold
        layer_ids = draft.config.target_layer_ids if (draft is not None and self.block_size > 1) else ()
        self.target = TargetRunner(target, layer_ids)

    @torch.no_grad()
    def generate(self, prompt_ids: Sequence[int], *, max_new_tokens: int = 128, stop_token_ids: Sequence[int] = (),
                 sampling: SamplingParams = SamplingParams()) -> GenerationResult:
        t0 = time.perf_counter()
        device = next(self.target.model.parameters()).device
        B = self.block_size
        stats = DecodeStats(block_size=B)
        gen = torch.Generator(device=device)
        gen.manual_seed(sampling.seed if sampling.seed is not None else 0)
        stop = set(int(t) for t in stop_token_ids)
        self.target.reset()
        prompt = torch.tensor(list(prompt_ids), dtype=torch.long, device=device)
        if prompt.numel() == 0:
            raise ValueError("prompt_ids: empty prompt. Fix: pass at least one token")

        logits, feats = self.target.forward(prompt, 0)
        ctx_kv = self._extend_ctx(None, feats, 0)
        out: list[int] = [sample_token(logits[-1], sampling, gen)]
        finish = self._finished(out, stop, max_new_tokens)
        while finish is None:
            n = prompt.numel() + len(out)  # committed length; the anchor out[-1] sits at position n-1
            anchor = out[-1]
            if B > 1:
                td = time.perf_counter()
                drafts = self.draft.draft_block(
                    torch.tensor([anchor], device=device), torch.tensor([n - 1], device=device), ctx_kv,
                    block_size=B, diffusion_steps=self.diffusion_steps,
                    confidence_threshold=self.confidence_threshold)[0]
                stats.draft_time_s += time.perf_counter() - td
            else:
                drafts = torch.empty(0, dtype=torch.long, device=device)
            tv = time.perf_counter()
            block = torch.cat([torch.tensor([anchor], device=device), drafts])
            logits, feats = self.target.forward(block, n - 1)  # [B, V]
            if sampling.greedy:
                a, bonus = greedy_verify(drafts, logits)
            else:
                a, bonus = sample_verify(drafts, logits, sampling, gen)
            stats.verify_time_s += time.perf_counter() - tv
            stats.record(drafts.numel(), a)
            # commit anchor + a drafts into the caches; bonus becomes the next anchor
            self.target.crop(n + a)
            if B > 1:
                ctx_kv = self._extend_ctx(ctx_kv, feats[: a + 1], n - 1)
            out.extend(int(t) for t in drafts[:a].tolist())
            out.append(bonus)
            finish = self._finished(out, stop, max_new_tokens)
        out = self._truncate(out, stop, max_new_tokens)
        return GenerationResult(out, stats, finish, time.perf_counter() - t0)

    def _extend_ctx(self, ctx_kv: list[KV] | None, feats: torch.Tensor | None, start: int) -> list[KV] | None:
        if self.block_size == 1 or feats is None:
            return None
        d = self.draft
        ctx = d.fuse(feats.to(d.fc.weight.dtype))[None]  # [1, T, H]
        pos = torch.arange(start, start + ctx.shape[1], device=ctx.device)[None]
        new = d.context_kv(ctx, pos)
        if ctx_kv is None:
            return new
        return [(torch.cat([k0, k1], 1), torch.cat([v0, v1], 1)) for (k0, v0), (k1, v1) in zip(ctx_kv, new)]

    @staticmethod
    def _finished(out: list[int], stop: set[int], max_new: int) -> str | None:
        if any(t in stop for t in out):
            return "stop"
        if len(out) >= max_new:
            return "length"
        return None

    @staticmethod
    def _truncate(out: list[int], stop: set[int], max_new: int) -> list[int]:
        for i, t in enumerate(out[:max_new]):
            if t in stop:
                return out[: i + 1]
        return out[:max_new]


@torch.no_grad()
def greedy_generate(target: nn.Module, prompt_ids: Sequence[int], max_new_tokens: int,
                    stop_token_ids: Sequence[int] = ()) -> list[int]:
    """Plain greedy decoding with transformers' generate(): the ground truth for lossless tests."""
    device = next(target.parameters()).device
    ids = torch.tensor([list(prompt_ids)], device=device)
    out = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=list(stop_token_ids) or None,
                          pad_token_id=0, attention_mask=torch.ones_like(ids))
    toks = out[0, ids.shape[1]:].tolist()
    return ReferenceDecoder._truncate(toks, set(stop_token_ids), max_new_tokens)
