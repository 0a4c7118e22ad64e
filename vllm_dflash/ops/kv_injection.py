# SPDX-License-Identifier: Apache-2.0
"""KV injection: fused target features -> every draft layer's context K/V.

For context rows ctx [T, H] (already `fc`-projected), positions [T]:
    x      = hidden_norm(ctx)                               # [T, H]
    kv_l   = x @ W_kv[l].T                                  # one GEMM for all layers: [T, L * 2 * kv]
    K_l    = RoPE(k_norm_l(kv_l[:kv]), positions)           # [T, nkv, hd]
    V_l    = kv_l[kv:]                                      # [T, nkv, hd]
`inject_context_kv` returns K, V [L, T, nkv, hd]; the caller writes them into the paged caches.
`inject_context_kv_reference` is the readable PyTorch definition every faster path is tested against.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_dflash.model import apply_rope, rms_norm


@dataclass(frozen=True)
class KVInjectionWeights:
    hidden_norm_weight: torch.Tensor  # [H]
    kv_weight: torch.Tensor  # [L * 2 * nkv * hd, H], per layer: K rows then V rows
    k_norm_weight: torch.Tensor  # [L, hd]
    cos_sin_cache: torch.Tensor  # [max_pos, hd]: cos in [:hd/2], sin in [hd/2:] (vLLM layout)
    num_layers: int
    num_kv_heads: int
    head_dim: int
    eps: float
    is_neox: bool = True

    def __post_init__(self) -> None:
        L, nkv, hd = self.num_layers, self.num_kv_heads, self.head_dim
        if self.kv_weight.shape[0] != L * 2 * nkv * hd:
            raise ValueError(f"kv_weight: {tuple(self.kv_weight.shape)} rows != L*2*nkv*hd = {L * 2 * nkv * hd}")
        if self.k_norm_weight.shape != (L, hd):
            raise ValueError(f"k_norm_weight: {tuple(self.k_norm_weight.shape)} != ({L}, {hd})")
        if self.cos_sin_cache.shape[-1] != hd:
            raise ValueError(f"cos_sin_cache: last dim {self.cos_sin_cache.shape[-1]} != head_dim {hd}")


def _rope_from_cache(k: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor, neox: bool) -> torch.Tensor:
    """k [..., T, nkv, hd], positions [T] -> rotated k, cos/sin looked up in vLLM's cache layout."""
    hd = k.shape[-1]
    cs = cache[positions].to(k.dtype)  # [T, hd]; callers check positions < cache rows (no host sync here)
    cos, sin = cs[..., : hd // 2], cs[..., hd // 2:]  # [T, hd/2]
    if neox:
        return apply_rope(k, cos, sin)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # interleaved (GPT-J) layout
    k1, k2 = k[..., 0::2], k[..., 1::2]
    return torch.stack((k1 * cos - k2 * sin, k2 * cos + k1 * sin), dim=-1).flatten(-2)


def inject_context_kv_reference(ctx: torch.Tensor, positions: torch.Tensor, w: KVInjectionWeights
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """ctx [T, H], positions [T] -> K, V [L, T, nkv, hd] (pure PyTorch, one GEMM for all layers)."""
    T = ctx.shape[0]
    L, nkv, hd = w.num_layers, w.num_kv_heads, w.head_dim
    x = rms_norm(ctx, w.hidden_norm_weight, w.eps)
    kv = (x @ w.kv_weight.to(x.dtype).t()).view(T, L, 2, nkv, hd).permute(2, 1, 0, 3, 4)  # [2, L, T, nkv, hd]
    k = rms_norm(kv[0], w.k_norm_weight[:, None, None, :], w.eps)
    k = _rope_from_cache(k, positions, w.cos_sin_cache, w.is_neox)
    return k.contiguous(), kv[1].contiguous()


def inject_context_kv(ctx: torch.Tensor, positions: torch.Tensor, w: KVInjectionWeights
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Checked entry point: validates shapes / dtypes / devices, then runs the fastest available path."""
    if ctx.dim() != 2 or ctx.shape[1] != w.hidden_norm_weight.shape[0]:
        raise ValueError(f"ctx: expected [T, {w.hidden_norm_weight.shape[0]}], got {tuple(ctx.shape)}")
    if positions.shape != (ctx.shape[0],):
        raise ValueError(f"positions: expected [{ctx.shape[0]}], got {tuple(positions.shape)}")
    if ctx.device != w.kv_weight.device:
        raise ValueError(f"ctx on {ctx.device} but weights on {w.kv_weight.device}")
    if ctx.device.type == "cpu" and positions.numel() and int(positions.max()) >= w.cos_sin_cache.shape[0]:
        raise ValueError(f"positions: max {int(positions.max())} is beyond the RoPE cache ({w.cos_sin_cache.shape[0]} "
                         "rows). Fix: raise the draft's max_position_embeddings")
    return inject_context_kv_reference(ctx, positions, w)
