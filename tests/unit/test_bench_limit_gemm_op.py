# SPDX-License-Identifier: Apache-2.0
"""The limit's compute term takes the faster GEMM: torch's, or (float32, where it runs) this package's kernel.

The servers' float32 linear layers run on ops/gemm_f32.py on AVX2 CPUs, and it beats torch's rate from about 24
rows on; a bound that used torch's rate alone would not be an upper bound there."""
from __future__ import annotations

import pytest
import torch

from vllm_dflash.bench import limit
from vllm_dflash.ops.gemm_f32 import gemm_f32_supported


def _timed(monkeypatch, times):
    """limit._best returns these seconds in call order (read, torch GEMM, our GEMM), running each fn once."""
    calls = iter(times)
    seen = []

    def fake_best(fn, repeats):
        fn()
        seen.append(fn)
        return next(calls)
    monkeypatch.setattr(limit, "_best", fake_best)
    return seen


@pytest.mark.skipif(not gemm_f32_supported(), reason="needs the fp32 kernel (avx2 + fma, extension built)")
@pytest.mark.parametrize("ours_s,expect_op", [(0.5e-3, "vllm_dflash.gemm_f32"), (2e-3, "torch")])
def test_float32_takes_the_faster_gemm(monkeypatch, ours_s, expect_op):
    seen = _timed(monkeypatch, [0.01, 1e-3, ours_s])
    hw = limit.measure_hardware(1, torch.float32, hidden=64, intermediate=128, tokens=32, bytes_read=1 << 20)
    assert len(seen) == 3, "float32 on a CPU with the kernel: read, torch's GEMM and ours are each timed"
    assert hw.gemm_op == expect_op
    assert hw.gemm_tflops == pytest.approx(round(2 * 32 * 64 * 128 / min(1e-3, ours_s) / 1e12, 4))


def test_bfloat16_times_torch_alone(monkeypatch):
    seen = _timed(monkeypatch, [0.01, 1e-3])
    hw = limit.measure_hardware(1, torch.bfloat16, hidden=64, intermediate=128, tokens=32, bytes_read=1 << 20)
    assert len(seen) == 2 and hw.gemm_op == "torch"


def test_better_keeps_the_op_of_the_higher_rate():
    a = limit.Hardware(2, 20.0, 0.120, "float32", (256, 576, 1536), "torch")
    b = limit.Hardware(2, 22.0, 0.140, "float32", (256, 576, 1536), "vllm_dflash.gemm_f32")
    assert limit.better(a, b).gemm_op == "vllm_dflash.gemm_f32"
    assert limit.better(b, a).gemm_tflops == 0.140 and limit.better(b, a).gemm_op == "vllm_dflash.gemm_f32"
    assert limit.better(a, a).gemm_op == "torch"
