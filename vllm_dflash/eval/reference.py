# SPDX-License-Identifier: Apache-2.0
"""Evaluate a draft with the reference loop: τ, per-position acceptance, histogram, speedup over block size 1."""
from __future__ import annotations

import time
from pathlib import Path

import torch

from vllm_dflash.eval.report import EvalReport, format_report  # noqa: F401 (format_report: re-export)
from vllm_dflash.reference import DecodeStats, ReferenceDecoder


def load_pair(target: str | Path | None, draft: str | Path, dtype: str = "float32"):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vllm_dflash.model import DFlashDraftModel
    from vllm_dflash.target import resolve_target

    tpath = resolve_target(target)
    tdtype = getattr(torch, dtype)
    tgt = AutoModelForCausalLM.from_pretrained(str(tpath), dtype=tdtype).eval()
    tok = AutoTokenizer.from_pretrained(str(tpath))
    d = DFlashDraftModel.from_pretrained(draft, target=tgt, dtype=tdtype)
    return tgt, tok, d


def evaluate_reference(*, target: str | None, draft: str | Path, prompts: str, limit: int | None = None,
                       max_new_tokens: int = 256, block_size: int | None = None, diffusion_steps: int | None = None,
                       baseline: bool = True, dtype: str = "float32", progress: bool = True) -> EvalReport:
    from tqdm import tqdm

    from vllm_dflash.data.prompts import get_prompts, render
    from vllm_dflash.target import DEFAULT_TARGET_NAME

    tgt, tok, d = load_pair(target, draft, dtype)
    items = get_prompts(prompts, limit)
    ids = [render(tok, it) for it in items]
    B = block_size or d.config.block_size
    stop = [tok.eos_token_id] if tok.eos_token_id is not None else []
    spec = ReferenceDecoder(tgt, d, block_size=B, diffusion_steps=diffusion_steps)
    stats, spec_tokens, spec_time = DecodeStats(block_size=B), 0, 0.0
    base_tokens, base_time = 0, 0.0
    plain = ReferenceDecoder(tgt, None, block_size=1) if baseline else None
    for p in tqdm(ids, desc="eval", unit="prompt", disable=not progress):
        r = spec.generate(p, max_new_tokens=max_new_tokens, stop_token_ids=stop)
        stats.merge(r.stats)
        spec_tokens += len(r.token_ids)
        spec_time += r.wall_time_s
        if plain is not None:
            t0 = time.perf_counter()
            rb = plain.generate(p, max_new_tokens=max_new_tokens, stop_token_ids=stop)
            base_time += time.perf_counter() - t0
            base_tokens += len(rb.token_ids)
    report = EvalReport(
        engine="reference", target=str(target or DEFAULT_TARGET_NAME), draft=str(draft), prompts=prompts,
        num_prompts=len(ids), block_size=B, diffusion_steps=spec.diffusion_steps, max_new_tokens=max_new_tokens,
        acceptance_length=stats.acceptance_length,
        # every reference step is one target forward that verifies a block (the prefill's first token aside)
        tokens_per_forward=spec_tokens / (stats.num_steps + len(ids)) if stats.num_steps else None,
        per_position_acceptance=stats.per_position_acceptance, histogram=stats.histogram, num_steps=stats.num_steps,
        output_tokens=spec_tokens, tokens_per_s=spec_tokens / spec_time if spec_time else 0.0,
        draft_time_share=stats.draft_time_s / spec_time if spec_time else 0.0)
    if plain is not None:
        report.baseline_tokens_per_s = base_tokens / base_time if base_time else 0.0
        report.speedup = report.tokens_per_s / report.baseline_tokens_per_s if base_time else 0.0
    return report
