# SPDX-License-Identifier: Apache-2.0
"""A draft saved by this package loads in upstream vLLM 0.32's built-in `dflash` (our plugin disabled)
and runs, with greedy output identical to vLLM without speculation."""
import pytest

from support.vllm_helpers import counter, run_vllm

pytestmark = pytest.mark.vllm
PROMPTS = [list(range(5, 25)), list(range(30, 41)), list(range(100, 140))]


def test_our_checkpoint_runs_in_upstream_dflash(tiny_dir):
    target = str(tiny_dir / "target")
    base, spec = run_vllm([
        {"model": target, "prompts": PROMPTS, "max_tokens": 24},
        {"model": target, "prompts": PROMPTS, "max_tokens": 24,
         "speculative_config": {"method": "dflash", "model": str(tiny_dir / "draft-b8"), "num_speculative_tokens": 7}},
    ], env={"VLLM_PLUGINS": ""})  # no plugins: vLLM's own drafter
    assert spec["tokens"] == base["tokens"]
    assert counter(spec, "vllm:spec_decode_num_draft_tokens") > 0
    assert "vllm_dflash" not in spec["log"]
