# SPDX-License-Identifier: Apache-2.0
"""The fp32 AVX2 GEMM (csrc/gemm_f32_cpu.cpp) against its PyTorch reference (vllm_dflash/ops/gemm_f32.py).

Three standards:
* exact: inputs whose products and partial sums are all exactly representable in fp32 (small integers times powers
  of two), so every summation order gives the same value: the kernel must equal `gemm_f32_reference` bit for bit.
* general (random normal inputs): the kernel rounds after every FMA (K roundings), the reference once, so
  |y - ref| <= 2 * K * 2^-24 * (|x| @ |W|^T) + 2^-24 * |ref|.
* batch invariance: row m of a call with M rows is bitwise the row of a 1-row call on x[m] (every output is one
  FMA chain over k in order, whatever the tile, chunk or thread): what makes a verify step of 1 + k rows give the
  decode step's bits.
"""
from __future__ import annotations

import pytest
import torch

from vllm_dflash.ops.gemm_f32 import BLOCK_N, gemm_f32, gemm_f32_reference, gemm_f32_supported, pack_f32_weight

needs_kernel = pytest.mark.skipif(not gemm_f32_supported(),
                                  reason="torch.ops.vllm_dflash.gemm_f32 unavailable: vllm_dflash._C not built or "
                                         "the CPU lacks avx2/fma (vLLM's own CPU GEMM is used there)")

SMOLLM2 = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate_up, down
ODD = [(50, 37), (33, 64), (17, 1), (100, 131), (5, 2)]  # N not a multiple of 16, odd K, K = 1
ROWS = [1, 2, 5, 6, 7, 8, 13, 16, 33, 64, 65, 130]  # one tile, split tiles, k-chunked (<= 64), unchunked (> 64)


def exact_operands(M: int, N: int, K: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K], w [N, K], bias [N] fp32 with every partial sum exact (|sum| < 2^24 units of 2^-7)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-8, 9, (M, K), generator=g).float() / 8  # multiples of 2^-3
    w = torch.randint(-8, 9, (N, K), generator=g).float() / 16  # multiples of 2^-4
    b = torch.randint(-64, 65, (N,), generator=g).float() / 128  # multiples of 2^-7
    return x, w, b


def test_pack_layout():
    N, K = 37, 5
    w = torch.arange(N * K, dtype=torch.float32).view(N, K)
    pw = pack_f32_weight(w)
    nb = -(-N // BLOCK_N)
    p = pw.packed.view(nb, K, BLOCK_N)
    assert (pw.n, pw.k) == (N, K) and pw.packed.is_contiguous()
    for blk, k, j in [(0, 0, 0), (0, 4, 15), (1, 2, 3), (2, 1, 4)]:
        assert p[blk, k, j] == w[blk * BLOCK_N + j, k]
    assert torch.all(p[2, :, N - 2 * BLOCK_N:] == 0), "rows past N must be zero"


@needs_kernel
@pytest.mark.parametrize("N,K", SMOLLM2 + ODD)
@pytest.mark.parametrize("bias", [False, True])
def test_exact_operands_bitwise(N, K, bias):
    for M in (1, 7, 13, 70):
        x, w, b = exact_operands(M, N, K, seed=N * 31 + K + M)
        b = b if bias else None
        y = gemm_f32(x, pack_f32_weight(w), b)
        assert torch.equal(y, gemm_f32_reference(x, w, b)), (M, N, K)


@needs_kernel
@pytest.mark.parametrize("N,K", SMOLLM2[:2] + ODD[:2])
def test_general_inputs_within_rounding_bound(N, K):
    g = torch.Generator().manual_seed(N + K)
    w = torch.randn(N, K, generator=g)
    b = torch.randn(N, generator=g)
    pw = pack_f32_weight(w)
    for M in (1, 8, 65):
        x = torch.randn(M, K, generator=g)
        y, ref = gemm_f32(x, pw, b), gemm_f32_reference(x, w, b)
        bound = 2 * K * 2.0 ** -24 * (x.abs().double() @ w.abs().double().t()).float() + 2.0 ** -24 * ref.abs()
        err = (y - ref).abs()
        assert torch.all(err <= bound + 1e-30), float((err - bound).max())


@needs_kernel
@pytest.mark.parametrize("N,K", [(960, 576), (100, 131), (17, 1)])
def test_batch_invariant_bitwise(N, K):
    """Row m of any call is bitwise a 1-row call on x[m] (and a call on any slice containing it)."""
    g = torch.Generator().manual_seed(7)
    w, b = torch.randn(N, K, generator=g), torch.randn(N, generator=g)
    pw = pack_f32_weight(w)
    x = torch.randn(max(ROWS), K, generator=g)
    singles = torch.cat([gemm_f32(x[m:m + 1], pw, b) for m in range(x.shape[0])])  # [M, N]
    for M in ROWS:
        assert torch.equal(gemm_f32(x[:M], pw, b), singles[:M]), M
    assert torch.equal(gemm_f32(x[3:40], pw, b), singles[3:40])


@needs_kernel
def test_threads_do_not_change_bits():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(3072, 576, generator=g)
    x = torch.randn(9, 576, generator=g)
    pw = pack_f32_weight(w)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = gemm_f32(x, pw)
        torch.set_num_threads(2)
        two = gemm_f32(x, pw)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(one, two)


@needs_kernel
def test_leading_dims_and_zero_rows():
    w = torch.randn(40, 24)
    pw = pack_f32_weight(w)
    x = torch.randn(2, 3, 24)
    assert torch.equal(gemm_f32(x, pw), gemm_f32(x.reshape(6, 24), pw).view(2, 3, 40))
    assert gemm_f32(torch.empty(0, 24), pw).shape == (0, 40)


@needs_kernel
def test_bad_inputs_name_the_field():
    pw = pack_f32_weight(torch.randn(8, 4))
    with pytest.raises(ValueError, match="x: expected an fp32"):
        gemm_f32(torch.randn(2, 4).bfloat16(), pw)
    with pytest.raises(ValueError, match=r"x: expected \[\.\.\., 4\]"):
        gemm_f32(torch.randn(2, 5), pw)
    with pytest.raises(ValueError, match="contiguous"):
        gemm_f32(torch.randn(4, 2).t(), pw)
    with pytest.raises(ValueError, match="bias"):
        gemm_f32(torch.randn(2, 4), pw, torch.randn(7))
    with pytest.raises(ValueError, match="w: expected an fp32"):
        pack_f32_weight(torch.randn(8, 4).bfloat16())
