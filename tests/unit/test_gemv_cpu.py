# SPDX-License-Identifier: Apache-2.0
"""The bf16 GEMV kernel (csrc/gemv_cpu.cpp) against its PyTorch reference (vllm_dflash/ops/gemv.py).

Two equality standards:
* exact: inputs whose products and partial sums are all exactly representable in fp32 (small integers times powers
  of two), so every summation order gives the same fp32 value and both round it to bf16 the same way (RNE);
  the kernel must then equal `gemv_reference` bit for bit.
* general (random normal inputs): the kernel sums in another order than torch's matmul (vdpbf16ps pairs, per-block
  accumulators), so its fp32 sum differs by the usual order error before the one rounding to bf16. We require
  |y - ref_fp32| <= 1 bf16 ulp of ref_fp32 + 2 * K * 2^-24 * (|x| @ |W|^T)   (rounding + summation-order slack).
"""
from __future__ import annotations

import pytest
import torch

from vllm_dflash.ops.gemv import BLOCK_N, GemvWeight, gemv, gemv_reference, gemv_supported, pack_gemv_weight

needs_kernel = pytest.mark.skipif(not gemv_supported(),
                                  reason="torch.ops.vllm_dflash.gemv_bf16 unavailable: vllm_dflash._C not built "
                                         "or the CPU lacks avx512_bf16 (vLLM's own CPU GEMM is used there)")

SMOLLM2 = [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)]  # qkv, o, gate_up, down, lm_head
ODD = [(50, 37), (33, 64), (17, 1), (100, 131), (31, 2)]  # K odd / not a multiple of 32, N not a multiple of 32


def exact_operands(M: int, N: int, K: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K], w [N, K], bias [N] in bf16 with every fp32 partial sum exact (|sum| < 2^24 units of 2^-7)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-8, 9, (M, K), generator=g).float() / 8  # multiples of 2^-3
    w = torch.randint(-8, 9, (N, K), generator=g).float() / 16  # multiples of 2^-4
    b = torch.randint(-64, 65, (N,), generator=g).float() / 128  # multiples of 2^-7
    return x.bfloat16(), w.bfloat16(), b.bfloat16()


def ulp_bf16(v: torch.Tensor) -> torch.Tensor:
    """The bf16 spacing at |v| (fp32 in, fp32 out)."""
    e = torch.frexp(v.abs().clamp_min(2.0 ** -126))[1]  # v = m * 2^e, m in [0.5, 1)
    return torch.ldexp(torch.ones_like(v), e - 8)


@pytest.fixture(scope="module")
def packed_cache():
    cache: dict = {}

    def get(w: torch.Tensor) -> GemvWeight:
        key = (w.data_ptr(), tuple(w.shape))
        if key not in cache:
            cache[key] = pack_gemv_weight(w)
        return cache[key]
    return get


def test_pack_layout():
    N, K = 37, 5
    w = torch.arange(N * K, dtype=torch.float32).view(N, K).bfloat16()
    pw = pack_gemv_weight(w)
    nb, kp = -(-N // BLOCK_N), -(-K // 2)
    p = pw.packed.view(nb, kp, BLOCK_N, 2)
    assert (pw.n, pw.k) == (N, K) and pw.packed.is_contiguous()
    assert torch.equal(p[1, 2, 3, 0], w[BLOCK_N + 3, 4]) and p[1, 2, 3, 1] == 0  # K padding
    assert (p[1, :, N - BLOCK_N:] == 0).all()  # N padding


@needs_kernel
@pytest.mark.parametrize("N,K", SMOLLM2 + ODD)
@pytest.mark.parametrize("with_bias", [False, True])
def test_exact(N, K, with_bias, packed_cache):
    x16, w, b = exact_operands(16, N, K, seed=N * 7 + K)
    pw = packed_cache(w)
    for M in range(1, 17):
        x = x16[:M].contiguous()
        bias = b if with_bias else None
        y = gemv(x, pw, bias)
        assert y.shape == (M, N) and y.dtype == torch.bfloat16
        want = gemv_reference(x, w, bias)
        assert torch.equal(y, want), f"M={M}: {(y != want).sum().item()} of {y.numel()} differ"


@needs_kernel
@pytest.mark.parametrize("N,K", [(960, 576), (576, 1536), (100, 131), (33, 64)])
@pytest.mark.parametrize("M", [1, 2, 3, 5, 8, 12, 13, 16, 21])
def test_random_within_one_ulp(N, K, M):
    g = torch.Generator().manual_seed(M * 1000 + N)
    x = torch.randn(M, K, generator=g).bfloat16()
    w = (torch.randn(N, K, generator=g) / K ** 0.5).bfloat16()
    b = torch.randn(N, generator=g).bfloat16()
    for bias in (None, b):
        y = gemv(x, pack_gemv_weight(w), bias).float()
        ref = x.float() @ w.float().t() + (0 if bias is None else bias.float())  # [M, N] fp32
        slack = 2 * K * 2.0 ** -24 * (x.float().abs() @ w.float().abs().t())
        err = (y - ref).abs()
        assert (err <= ulp_bf16(ref) + slack).all(), f"max err {err.max().item()}"


@needs_kernel
def test_fp32_bias_and_leading_dims():
    x, w, b = exact_operands(6, 40, 24, seed=1)
    pw = pack_gemv_weight(w)
    y = gemv(x.view(2, 3, 24), pw, b.float())
    assert y.shape == (2, 3, 40)
    assert torch.equal(y.view(6, 40), gemv_reference(x, w, b.float()))


@needs_kernel
def test_special_values_stay_local():
    """Inf in one x row only affects that row; odd K pads x with a zero (0 * Inf would be NaN)."""
    x, w, _ = exact_operands(3, 40, 33, seed=2)
    x[1, 5] = float("inf")
    y = gemv(x, pack_gemv_weight(w))
    ref = gemv_reference(x, w)
    assert torch.equal(y[[0, 2]], ref[[0, 2]])
    assert torch.equal(y[1].isnan(), ref[1].isnan())


def test_bad_inputs_raise_value_error():
    w = torch.randn(40, 24).bfloat16()
    pw = pack_gemv_weight(w)
    x = torch.randn(2, 24).bfloat16()
    with pytest.raises(ValueError, match="^x:"):
        gemv(x.float(), pw)
    with pytest.raises(ValueError, match="^x:"):
        gemv(torch.randn(2, 25).bfloat16(), pw)
    with pytest.raises(ValueError, match="^x:.*contiguous"):
        gemv(torch.randn(24, 2).bfloat16().t(), pw)
    with pytest.raises(ValueError, match="^bias:"):
        gemv(x, pw, torch.randn(39).bfloat16())
    with pytest.raises(ValueError, match="^bias:"):
        gemv(x, pw, torch.randn(40, dtype=torch.float64))
    with pytest.raises(ValueError, match="^w:"):
        pack_gemv_weight(w.float())
    with pytest.raises(ValueError, match="^w:"):
        pack_gemv_weight(w[0])


@needs_kernel
def test_opcheck():
    x, w, b = exact_operands(3, 40, 24, seed=3)
    pw = pack_gemv_weight(w)
    torch.library.opcheck(torch.ops.vllm_dflash.gemv_bf16.default, (x, pw.packed, pw.n, b),
                          test_utils=("test_schema", "test_faketensor"))


@needs_kernel
def test_torch_compile_fullgraph():
    class Tiny(torch.nn.Module):
        def __init__(self, w: torch.Tensor, b: torch.Tensor):
            super().__init__()
            self.pw = pack_gemv_weight(w)
            self.b = b

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return gemv(x * 2, self.pw, self.b) + 1

    x, w, b = exact_operands(4, 40, 24, seed=4)
    m = Tiny(w, b)
    torch._dynamo.reset()
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x), m(x))


@needs_kernel
@pytest.mark.parametrize("N, K", [(960, 576), (100, 131)])
def test_batch_invariant(N, K):
    """Row m of gemv(x) is bitwise gemv(x[m:m+1]) for every M up to 16 (random inputs, so summation order shows):
    the kernel sums each output in one order whatever M is, so a verify step's rows match a 1-row decode step."""
    g = torch.Generator().manual_seed(N + K)
    w = torch.randn(N, K, generator=g).bfloat16()
    b = torch.randn(N, generator=g).bfloat16()
    pw = pack_gemv_weight(w)
    x = torch.randn(16, K, generator=g).bfloat16()
    alone = torch.cat([gemv(x[m:m + 1], pw, b) for m in range(16)])  # [16, N], one row per call
    for M in range(1, 17):
        assert torch.equal(gemv(x[:M], pw, b), alone[:M]), f"M={M}: rows differ from the 1-row results"
