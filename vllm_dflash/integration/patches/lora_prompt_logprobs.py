# SPDX-License-Identifier: Apache-2.0
"""Patch: prompt logprobs with --enable-lora on CPU end the engine once the batch holds more than one sampled row.

vLLM's LoRA logits wrapper (`LogitsProcessorWithLoRA`) maps logits rows to adapters through the punica wrapper's
`sampler_indices`: one entry per sampled row of the step (one per request, 1 + drafts per request with
speculation). `GPUModelRunner._get_prompt_logprobs_dict` calls the same `compute_logits` on one request's prompt rows,
so the CPU kernel (`bgmv_shrink`, an einsum) sees n prompt rows against m sampled rows and raises
(`einsum(): subscript b has size m ... n`) unless m is 1. Stock vLLM 0.32 does this without speculation too (upstream
vllm-project/vllm#16668); with speculation every step has several sampled rows, so any prompt_logprobs request does.

The fix: while the runner computes prompt logprobs, each call of `compute_logits` on a slice of the step's hidden
states gets `sampler_indices` for exactly those rows, copied from the step's per-token adapter map
(`token_lora_indices`, the same encoding), and the wrapper's own indices are put back afterwards. The slice's
position is read from the view itself (its storage offset), so the runner's loop is not repeated here.
"""
from __future__ import annotations

from contextlib import contextmanager

from vllm_dflash.integration.patches.base import Patch, acts_for


def _logits_wrappers(runner) -> tuple:
    """The CPU punica wrappers of the runner's LoRA logits processors (none without LoRA); found once per runner."""
    got = runner.__dict__.get("_vllm_dflash_lora_logits")
    if got is None:
        got = ()
        if getattr(runner, "lora_config", None) is not None:
            from vllm.lora.layers import LogitsProcessorWithLoRA
            from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

            found = {id(m.punica_wrapper): m.punica_wrapper for m in runner.model.modules()
                     if isinstance(m, LogitsProcessorWithLoRA)}
            got = tuple(w for w in found.values() if isinstance(w, PunicaWrapperCPU))
        runner.__dict__["_vllm_dflash_lora_logits"] = got
    return got


def row_offset(rows, hidden_states) -> int | None:
    """Where `rows` (n, H), a slice of `hidden_states` (T, H), starts in it; None when it is not such a slice."""
    if rows.dim() != 2 or hidden_states.dim() != 2 or rows.shape[1] != hidden_states.shape[1] or \
            rows.stride() != hidden_states.stride() or \
            rows.untyped_storage().data_ptr() != hidden_states.untyped_storage().data_ptr():
        return None
    delta = rows.storage_offset() - hidden_states.storage_offset()
    row = hidden_states.stride(0)
    if row <= 0 or delta % row:
        return None
    start = delta // row
    return start if 0 <= start and start + rows.shape[0] <= hidden_states.shape[0] else None


@contextmanager
def rows_mapped(wrappers, start: int, n: int):
    """Inside: each wrapper's `sampler_indices` are its `token_lora_indices[start:start + n]` (rows (n,))."""
    saved = []
    try:
        for w in wrappers:
            tokens = w.token_lora_indices[start:start + n]  # (n,) adapter slot per row, -1: none
            if tokens.shape[0] != n:
                continue
            saved.append((w, w.indices_len[1], w._sampler_indices[:n].clone()))
            w._sampler_indices[:n].copy_(tokens)
            w.indices_len[1] = n
        yield
    finally:
        for w, length, old in saved:
            w._sampler_indices[:n].copy_(old)
            w.indices_len[1] = length


def apply() -> None:
    from vllm.v1.worker import gpu_model_runner as gmr

    runner_cls = gmr.GPUModelRunner
    # its existence and the attributes read here: checked by the seam (integration/seam.py) before any patch
    orig = runner_cls._get_prompt_logprobs_dict
    if getattr(orig, "_vllm_dflash_patched", False):
        return

    def _get_prompt_logprobs_dict(self, hidden_states, num_scheduled_tokens):
        if not self.num_prompt_logprobs or not acts_for(self, "fix"):
            return orig(self, hidden_states, num_scheduled_tokens)
        wrappers = _logits_wrappers(self)
        if not wrappers:
            return orig(self, hidden_states, num_scheduled_tokens)
        model = self.model
        compute = model.compute_logits
        had_own = "compute_logits" in model.__dict__

        def compute_logits(rows, *args, **kwargs):
            start = row_offset(rows, hidden_states)
            if start is None:
                return compute(rows, *args, **kwargs)
            with rows_mapped(wrappers, start, rows.shape[0]):
                return compute(rows, *args, **kwargs)

        model.compute_logits = compute_logits
        try:
            return orig(self, hidden_states, num_scheduled_tokens)
        finally:
            if had_own:
                model.compute_logits = compute
            else:
                del model.compute_logits

    _get_prompt_logprobs_dict._vllm_dflash_patched = True
    runner_cls._get_prompt_logprobs_dict = _get_prompt_logprobs_dict


PATCH = Patch(
    symbol="vllm.v1.worker.gpu_model_runner.GPUModelRunner._get_prompt_logprobs_dict",
    why="On CPU with --enable-lora, a prompt_logprobs request ends the engine whenever the step samples more than "
        "one row (another request in the batch, or any speculation): the LoRA logits kernel maps rows to adapters "
        "per sampled row, not per prompt row (einsum size mismatch; upstream vllm-project/vllm#16668). We give "
        "each prompt-logprobs call the adapter map of its own rows.",
    removal="when vLLM maps prompt-logprobs rows to adapters itself; check with "
            "tests/vllm/test_vllm_lora.py::test_stock_vllm_dies_on_prompt_logprobs_with_lora",
    apply=apply,
    kind="fix",
)
