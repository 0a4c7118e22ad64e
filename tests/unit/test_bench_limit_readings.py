# SPDX-License-Identifier: Apache-2.0
"""The benchmark reads the hardware before and after its runs and keeps the better reading of each side
(bench/limit.py `better`), so one disturbed reading does not put a run's limit far below what it measured."""
from vllm_dflash.bench import limit


def test_the_better_reading_of_each_side_counts():
    before = limit.Hardware(2, read_gb_s=17.2, gemm_tflops=0.0292, dtype="float32", gemm_shape=(256, 576, 1536))
    after = limit.Hardware(2, read_gb_s=16.0, gemm_tflops=0.150, dtype="float32", gemm_shape=(256, 576, 1536))
    hw = limit.better(before, after)
    assert (hw.read_gb_s, hw.gemm_tflops) == (17.2, 0.150)
    assert limit.better(after, before) == hw
    size = limit.ModelSize(params=134_515_008, weight_bytes=538_060_032, hidden=576, intermediate=1536)
    # none at c32: the disturbed GEMM reading alone bounded it at 108.5 tok/s; the better one at 5x that
    low = limit.limit_tok_s(before, size, 32, 1.0, 1.0)["limit_tok_s"]
    high = limit.limit_tok_s(hw, size, 32, 1.0, 1.0)["limit_tok_s"]
    assert round(low, 1) == 108.5 and round(high / low, 2) == round(0.150 / 0.0292, 2)
