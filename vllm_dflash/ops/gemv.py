# SPDX-License-Identifier: Apache-2.0
"""bf16 GEMV / skinny GEMM for CPU decode (M = 1..16 rows), csrc/gemv_cpu.cpp.

    y = x @ W.T (+ bias)        x [M, K] bf16, W [N, K] bf16, bias [N] bf16/fp32 -> y [M, N] bf16 (fp32 accumulate)

The kernel (AVX512-BF16 vdpbf16ps, OpenMP over output blocks) reads a weight packed once by `pack_gemv_weight`:
    packed[nb, kp, j, t] = W[nb * 32 + j, 2 * kp + t]     [ceil(N/32), ceil(K/2), 32, 2], zero-padded
`gemv_reference` is the PyTorch definition the kernel is tested against. The kernel needs avx512_bf16; where
`gemv_supported()` is False the caller keeps vLLM's own CPU GEMM (`layer.cpu_linear`), the op is not called.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_dflash.ops._ext import _load

BLOCK_N = 32  # output rows per packed block (csrc/gemv_cpu.cpp: BN)

_SUPPORTED: bool | None = None


def gemv_supported() -> bool:
    """Whether torch.ops.vllm_dflash.gemv_bf16 can run here: extension built and the CPU has avx512_bf16."""
    global _SUPPORTED
    if _SUPPORTED is None:
        _SUPPORTED = (_load("vllm_dflash._C") is None and hasattr(torch.ops.vllm_dflash, "gemv_bf16")
                      and bool(torch.ops.vllm_dflash.gemv_bf16_supported()))
    return _SUPPORTED


def _register_fake() -> None:
    if _load("vllm_dflash._C") is not None or not hasattr(torch.ops.vllm_dflash, "gemv_bf16"):
        return

    @torch.library.register_fake("vllm_dflash::gemv_bf16")
    def _gemv_fake(x: torch.Tensor, w_packed: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
        return x.new_empty((x.shape[0], n))  # [M, N]

    if hasattr(torch.ops.vllm_dflash, "linear_bf16"):
        @torch.library.register_fake("vllm_dflash::linear_bf16")
        def _linear_fake(x: torch.Tensor, w_packed: torch.Tensor, n: int, bias: torch.Tensor | None, max_rows: int,
                         onednn_handler: torch.Tensor) -> torch.Tensor:
            return x.new_empty((*x.shape[:-1], n))  # [..., N]


_register_fake()
_OP = getattr(torch.ops.vllm_dflash, "gemv_bf16", None)  # None where the extension is not built


@dataclass(frozen=True)
class GemvWeight:
    """A [N, K] bf16 weight in the kernel's layout (made once, at load)."""
    packed: torch.Tensor  # [ceil(N/32), ceil(K/2) * 64] bf16, contiguous
    n: int
    k: int


def pack_gemv_weight(w: torch.Tensor) -> GemvWeight:
    """w [N, K] bf16 -> GemvWeight (a copy in the kernel's layout; the original can be freed)."""
    if w.dim() != 2 or w.dtype != torch.bfloat16 or w.device.type != "cpu":
        raise ValueError(f"w: expected a bf16 CPU [N, K] tensor, got {w.dtype} {tuple(w.shape)} on {w.device}")
    N, K = w.shape
    if N == 0 or K == 0:
        raise ValueError(f"w: empty weight {tuple(w.shape)}")
    Np, Kp = -(-N // BLOCK_N) * BLOCK_N, -(-K // 2) * 2
    wp = torch.zeros(Np, Kp, dtype=w.dtype)  # [Np, Kp], zero padding rows / last column
    wp[:N, :K] = w
    packed = wp.view(Np // BLOCK_N, BLOCK_N, Kp // 2, 2).permute(0, 2, 1, 3)  # [nb, kp, 32, 2]
    return GemvWeight(packed=packed.reshape(Np // BLOCK_N, Kp * BLOCK_N).contiguous(), n=N, k=K)


def gemv_reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K], w [N, K], bias [N] | None -> [..., N] in x.dtype: fp32 products and sums, one rounding at the end."""
    y = x.float() @ w.float().t()  # [..., N] fp32
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def _check(x: torch.Tensor, w: GemvWeight, bias: torch.Tensor | None) -> None:
    # One cheap combined test per call (this runs in every decode step); the detailed messages only on failure.
    if x.dtype != torch.bfloat16 or x.dim() < 1 or x.shape[-1] != w.k or not x.is_contiguous() \
            or not x.is_cpu:
        if x.dtype != torch.bfloat16 or x.device.type != "cpu":
            raise ValueError(f"x: expected a bf16 CPU tensor, got {x.dtype} on {x.device}")
        if x.dim() < 1 or x.shape[-1] != w.k:
            raise ValueError(f"x: expected [..., {w.k}] (the weight's K), got {tuple(x.shape)}")
        raise ValueError("x: must be contiguous (call .contiguous() first)")
    if bias is not None:
        if bias.dtype not in (torch.bfloat16, torch.float32) or bias.device.type != "cpu":
            raise ValueError(f"bias: expected a bf16 or fp32 CPU tensor, got {bias.dtype} on {bias.device}")
        if bias.shape != (w.n,) or not bias.is_contiguous():
            raise ValueError(f"bias: expected a contiguous [{w.n}] tensor, got {tuple(bias.shape)}")


def gemv(x: torch.Tensor, w: GemvWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] bf16 contiguous, bias [N] | None -> [..., N] bf16 = x @ W.T (+ bias) (fast for few rows).

    Raises ValueError for bad inputs; the caller checks `gemv_supported()` once (at load) and keeps its own GEMM
    where it is False."""
    _check(x, w, bias)
    if x.dim() == 2:  # [M, K], the decode case: no reshapes (each costs ~1 µs)
        return _OP(x, w.packed, w.n, bias)  # [M, N]
    y = _OP(x.reshape(-1, w.k), w.packed, w.n, bias)  # [M, N]
    return y.view(x.shape[:-1] + (w.n,))
