# SPDX-License-Identifier: Apache-2.0
"""`vllm-dflash eval --engine vllm`: tokens per target forward from the run's counters (no vLLM needed; split from
tests/e2e/test_eval_cli.py)."""


def test_tokens_per_forward_of_a_vllm_run():
    from vllm_dflash.eval.vllm_engine import _tokens_per_forward

    m = {"vllm:spec_decode_num_drafts": 30.0, "vllm:request_success": 3.0, "vllm:generation_tokens": 99.0}
    assert _tokens_per_forward(m, 0.0) == 3.0  # fixed block: 30 verify steps + 3 prompt-finishing steps
    assert _tokens_per_forward(m, 45.0) == 2.2  # adaptive drafting counted its request-steps
    assert _tokens_per_forward({}, 0.0) is None
