# SPDX-License-Identifier: Apache-2.0
"""KV injection: fused target features -> every draft layer's context K/V (and paged cache).

For context rows ctx [T, H] (already `fc`-projected), positions [T]:
    x      = hidden_norm(ctx)                               # [T, H]
    kv_l   = x @ W_kv[l].T                                  # one GEMM for all layers: [T, L * 2 * kv]
    K_l    = RoPE(k_norm_l(kv_l[:kv]), positions)           # [T, nkv, hd]
    V_l    = kv_l[kv:]                                      # [T, nkv, hd]
`inject_context_kv_reference` is the readable PyTorch definition every faster path is tested against.
`inject_context_kv` returns K, V [L, T, nkv, hd]; `inject_context_kv_to_cache` also writes them into the
draft layers' paged caches (fused: straight from the kernel epilogue, no K/V intermediates).
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from vllm_dflash.model import apply_rope, rms_norm
from vllm_dflash.ops._ext import fused_available, mode
from vllm_dflash.utils import get_logger

logger = get_logger(__name__)

# Paged-cache layouts the fused CPU kernel writes (vLLM 0.32 CPU attention, ISA "vec" / "vec16"):
# cache [num_blocks, nkv, block_size, 2*hd]; per (block, head) K as [hd, block_size], then V as [block_size, hd].
CPU_VEC_LAYOUT = "cpu-vec"
# vLLM 0.32 CUDA backends: logical [num_blocks, nkv, block_size, 2*hd], K in [..., :hd], V in [..., hd:], any strides.
CUDA_LAYOUT = "cuda-bhnc"
# draft layers one CUDA launch writes (CacheView in csrc/kv_injection_cuda_kernels.cuh); more: the reference path
CUDA_MAX_LAYERS = 8
_INDEX_DTYPES = (torch.int32, torch.int64)


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
        if min(L, nkv, hd) <= 0:
            raise ValueError(f"num_layers / num_kv_heads / head_dim: must be > 0, got {L} / {nkv} / {hd}")
        if self.hidden_norm_weight.dim() != 1 or self.kv_weight.dim() != 2 or \
                self.kv_weight.shape[1] != self.hidden_norm_weight.shape[0]:
            raise ValueError(f"kv_weight: {tuple(self.kv_weight.shape)} must be [L*2*nkv*hd, H] with H = "
                             f"hidden_norm_weight's {tuple(self.hidden_norm_weight.shape)}")
        dev = self.kv_weight.device
        for name in ("hidden_norm_weight", "k_norm_weight", "cos_sin_cache"):
            if getattr(self, name).device != dev:
                raise ValueError(f"{name}: on {getattr(self, name).device}, kv_weight on {dev}: the weights must share "
                                 "one device")
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


def write_cache_reference(k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor, cache: torch.Tensor,
                          layout: str) -> None:
    """k, v [T, nkv, hd] -> cache at slot_mapping [<= T] (-1 skipped), in `layout` (pure PyTorch)."""
    nb, nkv, bs, two_hd = cache.shape
    hd = two_hd // 2
    n = slot_mapping.shape[0]
    ok = slot_mapping >= 0
    s = slot_mapping[ok]
    k, v = k[:n][ok], v[:n][ok]  # [n_ok, nkv, hd]
    blk, off = s // bs, s % bs
    if layout == CPU_VEC_LAYOUT:
        kc = cache.view(nb, nkv, 2, bs * hd)[:, :, 0].view(nb, nkv, hd, bs)
        vc = cache.view(nb, nkv, 2, bs * hd)[:, :, 1].view(nb, nkv, bs, hd)
        kc[blk, :, :, off] = k.to(cache.dtype)  # advanced indices first: [n_ok, nkv, hd]
        vc[blk, :, off] = v.to(cache.dtype)
    elif layout == CUDA_LAYOUT:
        cache[blk, :, off, :hd] = k.to(cache.dtype)
        cache[blk, :, off, hd:] = v.to(cache.dtype)
    else:
        raise ValueError(f"layout: unknown {layout!r}; expected {CPU_VEC_LAYOUT!r} or {CUDA_LAYOUT!r}")


def _check(ctx: torch.Tensor, positions: torch.Tensor, w: KVInjectionWeights) -> None:
    if ctx.dim() != 2 or ctx.shape[1] != w.hidden_norm_weight.shape[0]:
        raise ValueError(f"ctx: expected [T, {w.hidden_norm_weight.shape[0]}], got {tuple(ctx.shape)}")
    if positions.shape != (ctx.shape[0],):
        raise ValueError(f"positions: expected [{ctx.shape[0]}], got {tuple(positions.shape)}")
    if positions.dtype not in _INDEX_DTYPES:
        raise ValueError(f"positions: expected int64 (or int32), got {positions.dtype}")
    if ctx.device != w.kv_weight.device:
        raise ValueError(f"ctx on {ctx.device} but weights on {w.kv_weight.device}")
    if positions.device != ctx.device:
        raise ValueError(f"positions: on {positions.device}, ctx on {ctx.device}. Fix: pass them on ctx's device")
    # CPU only: there it costs no sync (the kernels range-check too); on GPU it would be a host sync
    if ctx.device.type == "cpu" and positions.numel() and int(positions.max()) >= w.cos_sin_cache.shape[0]:
        raise ValueError(f"positions: max {int(positions.max())} is beyond the RoPE cache ({w.cos_sin_cache.shape[0]} "
                         "rows). Fix: raise the draft's max_position_embeddings")


def _check_slots(ctx: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] > ctx.shape[0]:
        raise ValueError(f"slot_mapping: expected [<= {ctx.shape[0]}], got {tuple(slot_mapping.shape)}")
    if slot_mapping.dtype not in _INDEX_DTYPES:
        raise ValueError(f"slot_mapping: expected int64 (or int32), got {slot_mapping.dtype}")
    if slot_mapping.device != ctx.device:
        raise ValueError(f"slot_mapping: on {slot_mapping.device}, ctx on {ctx.device}. Fix: pass it on ctx's device")


@functools.lru_cache(maxsize=16)
def _prepared(w: KVInjectionWeights, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...] | None:
    """The kernel's weight arguments (contiguous), or None when the fused kernel cannot serve (checked once per
    weights / dtype / device, not per step)."""
    if device.type == "cuda" and w.num_layers > CUDA_MAX_LAYERS and fused_available(device):
        logger.info("vllm_dflash KV injection: the draft has %d layers, the CUDA kernel writes at most %d per launch "
                    "-> PyTorch reference path", w.num_layers, CUDA_MAX_LAYERS)
        return None
    ok = (dtype in (torch.float32, torch.bfloat16) and fused_available(device) and w.head_dim % 2 == 0
          and w.head_dim <= 512
          and all(t.dtype == dtype for t in (w.hidden_norm_weight, w.kv_weight, w.k_norm_weight, w.cos_sin_cache)))
    if not ok:
        return None
    return (w.hidden_norm_weight.contiguous(), w.kv_weight.contiguous(), w.k_norm_weight.contiguous(),
            w.cos_sin_cache.contiguous())


def _fused_weights(ctx: torch.Tensor, w: KVInjectionWeights) -> tuple[torch.Tensor, ...] | None:
    return None if mode() == "reference" else _prepared(w, ctx.dtype, ctx.device)


@contextlib.contextmanager
def _kernel_errors():
    """The kernel's input errors as the ValueErrors the Python checks raise (field + fix)."""
    try:
        yield
    except RuntimeError as e:
        msg = str(e).splitlines()[0]
        if "RoPE cache" in msg:
            raise ValueError(f"{msg}. Fix: raise the draft's max_position_embeddings") from e
        if "slot_mapping" in msg:
            raise ValueError(f"{msg}. Fix: pass slots inside the draft layers' KV caches") from e
        raise


def inject_context_kv(ctx: torch.Tensor, positions: torch.Tensor, w: KVInjectionWeights
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Checked entry point -> K, V [L, T, nkv, hd]: the fused kernel when available, else the reference."""
    fw = _fused_weights(ctx, w)
    # Positions are checked here on CPU (no sync there), so a bad position never depends on a C++ exception crossing
    # the op boundary (a CPU build whose libstdc++ differs from torch's crashed on that); on GPU the kernel checks.
    _check(ctx, positions, w)
    return _context_kv(ctx, positions, w, fw)


def _context_kv(ctx: torch.Tensor, positions: torch.Tensor, w: KVInjectionWeights, fw: tuple[torch.Tensor, ...] | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V [L, T, nkv, hd] of already checked inputs: the fused kernel when `fw` (its prepared weights), else the
    reference."""
    if fw is not None:
        with _kernel_errors():
            return torch.ops.vllm_dflash.fused_context_kv(ctx.contiguous(), positions.to(torch.long).contiguous(), *fw,
                                                          w.num_kv_heads, w.head_dim, float(w.eps), bool(w.is_neox))
    return inject_context_kv_reference(ctx, positions, w)


def inject_context_kv_to_cache(ctx: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                               w: KVInjectionWeights, caches: Sequence[torch.Tensor], layout: str | None,
                               write_fallback: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None) -> str:
    """K/V of the context rows written into every layer's paged cache at slot_mapping (-1 = padding).

    layout: CPU_VEC_LAYOUT / CUDA_LAYOUT for the fused kernel, None for a cache the kernel does not know;
    then K/V are computed (fused when possible) and `write_fallback(layer, k, v)` stores them (e.g. vLLM's
    own do_kv_cache_update). Returns the path taken ("fused", "fused-compute", "reference")."""
    fw = _fused_weights(ctx, w)
    _check(ctx, positions, w)  # positions on CPU, as in inject_context_kv
    _check_slots(ctx, slot_mapping)
    if len(caches) != w.num_layers:
        raise ValueError(f"caches: {len(caches)} given, the draft has {w.num_layers} layers")
    fused = fw is not None
    cache_ok = (layout == CPU_VEC_LAYOUT and ctx.device.type == "cpu") or (layout == CUDA_LAYOUT and ctx.device.type == "cuda")
    cache_ok = cache_ok and all(c.dtype == ctx.dtype and c.dim() == 4 and c.stride(-1) == 1 for c in caches)
    if layout == CPU_VEC_LAYOUT:
        cache_ok = cache_ok and all(c.stride(2) == c.shape[3] for c in caches)
    if fused and cache_ok and ctx.device.type == "cpu" and slot_mapping.numel():
        top = int(slot_mapping.max())  # CPU: no sync; the slot check must not rest on a C++ exception either
        for i, c in enumerate(caches):
            if top >= c.shape[0] * c.shape[2]:
                raise ValueError(f"slot_mapping: slot {top} beyond the cache of layer {i} ({c.shape[0]} blocks of "
                                 f"{c.shape[2]}). Fix: pass slots inside the draft layers' KV caches")
    if fused and cache_ok:
        with _kernel_errors():
            torch.ops.vllm_dflash.fused_context_kv_to_cache(
                ctx.contiguous(), positions.to(torch.long).contiguous(), slot_mapping.to(torch.long).contiguous(), *fw,
                list(caches), w.num_kv_heads, w.head_dim, float(w.eps), bool(w.is_neox))
        return "fused"
    k, v = _context_kv(ctx, positions, w, fw)  # checked above
    for i in range(w.num_layers):
        if write_fallback is not None:
            write_fallback(i, k[i], v[i])
        else:
            write_cache_reference(k[i], v[i], slot_mapping, caches[i], layout or CPU_VEC_LAYOUT)
    return "fused-compute" if fused else "reference"
