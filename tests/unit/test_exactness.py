# SPDX-License-Identifier: Apache-2.0
"""Greedy exactness and its explanation (vllm_dflash.exactness): where outputs differ, the first differing token and
the target's top-2 logprob margin there. float32 must be identical; bf16 may differ only at numerical near-ties.
The helpers without vLLM; the served bf16 check is tests/e2e/test_exactness_served.py."""
from vllm_dflash import exactness as ex
from vllm_dflash.exactness import Divergence, first_difference, summarize, verdict_line


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2  # a prefix differs at the shorter length
    assert first_difference([], [4]) == 0


def test_tolerance_per_dtype():
    assert ex.near_tie_nats("float32") == 0.0 and ex.is_exact_dtype("float32")
    assert ex.near_tie_nats("bfloat16") > 0 and ex.near_tie_nats("torch.bfloat16") == ex.near_tie_nats("bfloat16")


def test_near_tie_at_the_tolerance_survives_float32_rounding():
    """bench_v7 judged a bf16 divergence at margin 0.5000000596 (4/8 nat, the tolerance, read through float32
    logprobs) as real; a margin on the tolerance is a near-tie, one bf16 step above it is not, and float32 has none."""
    assert ex.is_near_tie(0.5000000596046448, "bfloat16")
    assert ex.is_near_tie(0.5, "bfloat16") and ex.is_near_tie(0.0, "bfloat16")
    assert not ex.is_near_tie(0.625, "bfloat16") and not ex.is_near_tie(0.5002, "bfloat16")
    assert not ex.is_near_tie(None, "bfloat16")  # a chosen token outside the target's top tokens
    assert not ex.is_near_tie(0.0, "float32")


def _div(margin, near):
    return Divergence(index=7, base_token=" a", other_token=" b", margin=margin, top2=(" a", " b"), near_tie=near)


def test_summary_and_verdict():
    ok32 = summarize(4, [], "float32")
    assert ok32["passed"] and ok32["identical"] == 4 and "4/4" in verdict_line(ok32) and "exact" in verdict_line(ok32)
    near = summarize(4, [_div(0.03, True)], "bfloat16")
    line = verdict_line(near)
    assert near["passed"] and near["near_ties"] == 1 and "3/4" in line and "0.030" in line and "near-tie" in line
    real = summarize(4, [_div(0.03, True), _div(4.2, False)], "bfloat16")
    assert not real["passed"] and real["real"] == 1 and "REAL" in verdict_line(real) and "4.200" in verdict_line(real)


def test_default_dtype_on_both_cpu_kinds(monkeypatch):
    """The fast dtype per CPU kind (bf16 with avx512_bf16, else fp32), whichever kind runs the test."""
    import torch

    from vllm_dflash import utils

    monkeypatch.delenv("VLLM_DFLASH_DTYPE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(utils, "cpu_has_bf16", lambda: True)
    assert utils.default_dtype() == "bfloat16"
    monkeypatch.setattr(utils, "cpu_has_bf16", lambda: False)
    assert utils.default_dtype() == "float32"
    monkeypatch.setenv("VLLM_DFLASH_DTYPE", "float32")
    monkeypatch.setattr(utils, "cpu_has_bf16", lambda: True)
    assert utils.default_dtype() == "float32"
