# SPDX-License-Identifier: Apache-2.0
"""Our draft model class inside vLLM, registered for architecture "DFlashDraftModel".

It reuses vLLM's DFlash layers (paged-KV attention, weight loading, TP sharding) by subclassing
`DFlashQwen3ForCausalLM` -- the V1 proposer asserts that class -- and replaces what runs on our hot
path: KV injection through `vllm_dflash.ops.inject_context_kv_to_cache` (the csrc/ fused kernel: one GEMM
for all layers, then norm + RoPE + paged-cache write in one pass) and confidence-aware greedy drafting over a reduced
vocabulary (argmax over the draft vocabulary then the d2t map, instead of scattering into a full-vocab -inf
tensor). The setting kv_injection (auto | fused | reference) picks the injection path for this engine
(vllm_config.additional_config["dflash"]).

The registry entry is process-wide (once a DFlash engine applied the patches, every engine of the process resolves the
architecture to this class), so building the class is per engine: an engine without our drafter (vLLM's own DFlash
drafter, setting drafter=vllm) gets an instance of vLLM's `DFlashQwen3ForCausalLM` itself (`__new__`), as with the
plugin excluded.
"""
from __future__ import annotations

import torch
from vllm.logger import init_logger
from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM

from vllm_dflash.ops._ext import kv_injection_mode
from vllm_dflash.ops.kv_injection import (CPU_VEC_LAYOUT, CUDA_LAYOUT, KVInjectionWeights, inject_context_kv,
                                          inject_context_kv_to_cache)

logger = init_logger(__name__)


def _in_rope_range(positions: torch.Tensor, slots, rows: int):
    """Context rows past the RoPE cache (positions [T] >= rows) become padding: slot -1 (no cache write) and a position
    clamped inside the cache (no out-of-range read), on the device, no host sync. slots: [<= T] tensor, a per-layer list
    of them (None entries kept), or None (dummy run). -> (positions, slots)."""
    over = positions >= rows  # [T]

    def pad(s):
        return None if s is None else s.masked_fill(over[: s.shape[0]], -1)

    if isinstance(slots, (list, tuple)):
        first = slots[0]
        padded = pad(first)
        slots = [padded if s is first else pad(s) for s in slots]  # shared tensors stay shared (one fused write)
    else:
        slots = pad(slots)
    return positions.clamp(max=rows - 1), slots


class DFlashDraftForVllm(DFlashQwen3ForCausalLM):
    def __new__(cls, *, vllm_config, prefix: str = ""):
        from vllm_dflash.integration.patches.base import dflash_engine

        if cls is DFlashDraftForVllm and not dflash_engine(vllm_config):
            # not an instance of cls: Python skips our __init__; vLLM's class builds itself
            return DFlashQwen3ForCausalLM(vllm_config=vllm_config, prefix=prefix)
        return super().__new__(cls)

    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        from vllm_dflash.settings import from_vllm_config

        s = from_vllm_config(vllm_config)
        self.use_ours = s.drafter == "ours"
        self.kv_injection = s.kv_injection
        self._injection: KVInjectionWeights | None = None
        self.last_injection_path = "none"  # "fused" | "fused-compute" | "reference" after a step
        # rows of the RoPE cache where max_model_len passes them (set by the drafter at load time), else None: context
        # rows at positions past them are not injected (their K/V cannot be rotated; the drafter drafts nothing there)
        self.position_limit: int | None = None

    def load_weights(self, weights):
        out = super().load_weights(weights)
        self._injection = None
        return out

    def injection_weights(self) -> KVInjectionWeights | None:
        """The stacked tensors of vLLM's fused buffers, viewed as our op's weights (None: unsupported)."""
        if self._injection is None:
            m = self.model
            if not hasattr(m, "_num_attn_layers"):
                m._build_fused_kv_buffers()
            if m._fused_kv_weight is None or m._fused_kv_bias is not None:
                return None  # quantized or biased K/V projections: vLLM's own path handles them
            if getattr(m.layers[0].self_attn, "v_scale", None) is not None:
                return None
            self._injection = KVInjectionWeights(
                hidden_norm_weight=m._hidden_norm_weight, kv_weight=m._fused_kv_weight,
                k_norm_weight=m._k_norm_weights, cos_sin_cache=m._rope_cos_sin_cache, num_layers=m._num_attn_layers,
                num_kv_heads=m._num_kv_heads, head_dim=m._head_dim, eps=m._rms_norm_eps, is_neox=m._rope_is_neox)
        return self._injection

    def cache_layout(self) -> str | None:
        """The paged-cache layout our fused kernel can write for this platform's attention backend, or None
        (then K/V are computed by our op and stored with the backend's own do_kv_cache_update)."""
        attn = self.model._attn_layers[0]
        impl = attn.impl
        if getattr(impl, "kv_cache_dtype", "auto") not in ("auto", None):
            return None
        name = type(impl).__name__
        if name == "CPUAttentionBackendImpl" and getattr(attn, "isa", None) in ("vec", "vec16"):
            return CPU_VEC_LAYOUT  # verified against cpu_attn_reshape_and_cache (tests/vllm/test_kv_injection_vllm.py)
        if name == "FlashAttentionImpl":
            return CUDA_LAYOUT
        return None

    def rope_rows(self) -> int:
        """Positions the draft's RoPE cache covers (its max_position_embeddings, times any scaling)."""
        m = self.model
        if not hasattr(m, "_num_attn_layers"):  # as in injection_weights: vLLM builds the buffers lazily
            m._build_fused_kv_buffers()
        return int(m._rope_cos_sin_cache.shape[0])

    def precompute_and_store_context_kv(self, context_states, context_positions, context_slot_mapping=None):
        if self.position_limit is not None:
            context_positions, context_slot_mapping = _in_rope_range(context_positions, context_slot_mapping,
                                                                     self.position_limit)
        w = self.injection_weights() if self.use_ours else None
        if w is None:
            return super().precompute_and_store_context_kv(context_states, context_positions, context_slot_mapping)
        if self.kv_injection == "auto":  # the process default (DFLASH_KV_INJECTION, else auto: fused when built)
            return self._inject(w, context_states, context_positions, context_slot_mapping)
        with kv_injection_mode(self.kv_injection):  # this engine's explicit fused / reference
            self._inject(w, context_states, context_positions, context_slot_mapping)

    def _inject(self, w: KVInjectionWeights, context_states, context_positions, context_slot_mapping) -> None:
        if context_slot_mapping is None:  # dummy / profiling run: compute only
            inject_context_kv(context_states, context_positions, w)
            return
        layers = self.model._attn_layers
        per_layer = isinstance(context_slot_mapping, (list, tuple))
        slots = context_slot_mapping
        if per_layer:
            first = context_slot_mapping[0]
            same = first is not None and all(s is first for s in context_slot_mapping)
            slots = first if same else None
        layout = self.cache_layout() if slots is not None else None

        def write(i: int, k: torch.Tensor, v: torch.Tensor) -> None:  # the backend's own cache write
            s = context_slot_mapping[i] if per_layer else context_slot_mapping
            if s is None:  # vLLM's convention: no cache write for this layer (dummy run)
                return
            layers[i].impl.do_kv_cache_update(layers[i], k, v, layers[i].kv_cache, s)

        path = inject_context_kv_to_cache(
            context_states, context_positions, slots if slots is not None else context_slot_mapping[0], w,
            [a.kv_cache for a in layers], layout, write_fallback=write)
        if path != self.last_injection_path:
            logger.info("vllm_dflash: KV injection path %r (cache layout %s)", path, layout)
            self.last_injection_path = path

    def _to_target_ids(self, idx: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids (vLLM's d2t offsets; identity for the full vocabulary)."""
        if self.draft_id_to_target_id is None:
            return idx
        return idx + self.draft_id_to_target_id[idx]

    def draft_confidence(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [N, H] -> (max probability [N], argmax as target ids [N])."""
        logits = self.logits_processor(self.lm_head, hidden_states)  # [N, V_draft]
        conf, idx = torch.softmax(logits.float(), dim=-1).max(dim=-1)
        return conf, self._to_target_ids(idx)

    def draft_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> logits over the draft vocabulary [N, V_draft] (draft ids: `draft_target_ids` maps them)."""
        return self.logits_processor(self.lm_head, hidden_states)[..., : self.config.draft_vocab_size]

    def draft_target_ids(self) -> torch.Tensor:
        """[V_draft] the target id of every draft-vocabulary id (arange for the full vocabulary)."""
        ids = torch.arange(self.config.draft_vocab_size, device=self.lm_head.weight.device)
        return self._to_target_ids(ids)

    def draft_argmax(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> argmax as target ids [N] (no softmax: the last denoising pass)."""
        # max().indices: the same index as argmax (first maximum), 3.5-4.5x faster on CPU (dev/PROFILE_18.md)
        return self._to_target_ids(self.logits_processor(self.lm_head, hidden_states).max(dim=-1).indices)
