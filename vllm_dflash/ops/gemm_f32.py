# SPDX-License-Identifier: Apache-2.0
"""fp32 skinny GEMM for CPU decode and verification (AVX2 + FMA), csrc/gemm_f32_cpu.cpp.

    y = x @ W.T (+ bias)        x [M, K] fp32, W [N, K] fp32, bias [N] fp32 -> y [M, N] fp32

The kernel (6x16 register tiles, OpenMP over output blocks) reads a weight packed once by `pack_f32_weight`:
    packed[nb, k, j] = W[nb * 16 + j, k]     [ceil(N/16), K, 16], zero rows past N
Every output is one FMA chain over k = 0..K-1, so the result of a row never depends on how many rows the call has
(batch-invariant, bit for bit). `gemm_f32_reference` is the PyTorch definition the kernel is tested against. Where
`gemm_f32_supported()` is False the caller keeps vLLM's own CPU GEMM (`layer.cpu_linear`); the op is not called.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_dflash.ops._ext import _load

BLOCK_N = 16  # output rows per packed block (csrc/gemm_f32_cpu.cpp: BN)

_SUPPORTED: bool | None = None


def gemm_f32_supported() -> bool:
    """Whether torch.ops.vllm_dflash.gemm_f32 can run here: extension built and the CPU has avx2 and fma."""
    global _SUPPORTED
    if _SUPPORTED is None:
        _SUPPORTED = (_load("vllm_dflash._C") is None and hasattr(torch.ops.vllm_dflash, "gemm_f32")
                      and bool(torch.ops.vllm_dflash.gemm_f32_supported()))
    return _SUPPORTED


def _register_fake() -> None:
    if _load("vllm_dflash._C") is not None or not hasattr(torch.ops.vllm_dflash, "gemm_f32"):
        return

    @torch.library.register_fake("vllm_dflash::gemm_f32")
    def _gemm_fake(x: torch.Tensor, w_packed: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
        return x.new_empty((x.shape[0], n))  # [M, N]

    @torch.library.register_fake("vllm_dflash::linear_f32")
    def _linear_fake(x: torch.Tensor, w_packed: torch.Tensor, n: int, bias: torch.Tensor | None, max_rows: int,
                     onednn_handler: torch.Tensor) -> torch.Tensor:
        return x.new_empty((*x.shape[:-1], n))  # [..., N]


_register_fake()
_OP = getattr(torch.ops.vllm_dflash, "gemm_f32", None)  # None where the extension is not built


@dataclass(frozen=True)
class F32Weight:
    """A [N, K] fp32 weight in the kernel's layout (made once, at load)."""
    packed: torch.Tensor  # [ceil(N/16), K * 16] fp32, contiguous
    n: int
    k: int


def pack_f32_weight(w: torch.Tensor) -> F32Weight:
    """w [N, K] fp32 -> F32Weight (a copy in the kernel's layout; the original can be freed)."""
    if w.dim() != 2 or w.dtype != torch.float32 or w.device.type != "cpu":
        raise ValueError(f"w: expected an fp32 CPU [N, K] tensor, got {w.dtype} {tuple(w.shape)} on {w.device}")
    N, K = w.shape
    if N == 0 or K == 0:
        raise ValueError(f"w: empty weight {tuple(w.shape)}")
    Np = -(-N // BLOCK_N) * BLOCK_N
    wp = torch.zeros(Np, K, dtype=w.dtype)  # [Np, K], zero rows past N
    wp[:N] = w
    packed = wp.view(Np // BLOCK_N, BLOCK_N, K).permute(0, 2, 1)  # [nb, K, 16]
    return F32Weight(packed=packed.reshape(Np // BLOCK_N, K * BLOCK_N).contiguous(), n=N, k=K)


def gemm_f32_reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K], w [N, K], bias [N] | None -> [..., N] fp32: the float64 product, rounded once, plus the bias.

    The kernel rounds after every FMA, so it agrees with this to within K fp32 roundings (tests bound it), and bit for
    bit when every partial sum is exact in fp32 (small integers times powers of two)."""
    y = (x.double() @ w.double().t()).float()  # [..., N]
    return y + bias.float() if bias is not None else y


def _check(x: torch.Tensor, w: F32Weight, bias: torch.Tensor | None) -> None:
    # One cheap combined test per call; the detailed messages only on failure.
    if x.dtype != torch.float32 or x.dim() < 1 or x.shape[-1] != w.k or not x.is_contiguous() or not x.is_cpu:
        if x.dtype != torch.float32 or x.device.type != "cpu":
            raise ValueError(f"x: expected an fp32 CPU tensor, got {x.dtype} on {x.device}")
        if x.dim() < 1 or x.shape[-1] != w.k:
            raise ValueError(f"x: expected [..., {w.k}] (the weight's K), got {tuple(x.shape)}")
        raise ValueError("x: must be contiguous (call .contiguous() first)")
    if bias is not None:
        if bias.dtype != torch.float32 or bias.device.type != "cpu":
            raise ValueError(f"bias: expected an fp32 CPU tensor, got {bias.dtype} on {bias.device}")
        if bias.shape != (w.n,) or not bias.is_contiguous():
            raise ValueError(f"bias: expected a contiguous [{w.n}] tensor, got {tuple(bias.shape)}")


def gemm_f32(x: torch.Tensor, w: F32Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] fp32 contiguous, bias [N] | None -> [..., N] fp32 = x @ W.T (+ bias), batch-invariant.

    Raises ValueError for bad inputs; the caller checks `gemm_f32_supported()` once (at load) and keeps its own GEMM
    where it is False."""
    _check(x, w, bias)
    if x.dim() == 2:  # [M, K]: no reshapes
        return _OP(x, w.packed, w.n, bias)  # [M, N]
    y = _OP(x.reshape(-1, w.k), w.packed, w.n, bias)  # [M, N]
    return y.view(x.shape[:-1] + (w.n,))
