# SPDX-License-Identifier: Apache-2.0
"""LoRA with our DFlash drafter (issue 51, the soak's LoRA finding).

With --enable-lora the target's token embedding is vLLM's LoRA wrapper, whose token-to-adapter mapping is set for the
target's scheduled tokens; the draft shares the embedding, and its forward over another token count ended the engine
(einsum size mismatch in bgmv_expand). The drafter now embeds through the wrapped base layer.

Every request goes through a random adapter (rank 4, large enough to change the tiny target's output on q_proj / v_proj, bench/soak/lora.py) on the tiny pair:
greedy output with our default drafter equals greedy output without speculation under the same adapter, token for
token (float32), drafts are accepted, and the adapter really changes the output (so it was applied)."""
import pytest
import torch

from support.vllm_helpers import counter, run_vllm

pytestmark = pytest.mark.vllm

g = torch.Generator().manual_seed(5)
PROMPTS = [torch.randint(4, 384, (n,), generator=g).tolist() for n in (12, 40, 90)]


@pytest.fixture(scope="module")
def results(pair, tmp_path_factory):
    from vllm_dflash.bench.soak.lora import make_lora

    lora = make_lora(pair / "target", tmp_path_factory.mktemp("lora") / "adapter", rank=4, seed=0, scale=0.5)
    lora_kwargs = {"enable_lora": True, "max_lora_rank": 8, "max_loras": 1}
    common = {"model": str(pair / "target"), "prompts": PROMPTS, "max_tokens": 24}
    spec = {"method": "dflash", "model": str(pair / "draft-b8")}
    runs = {
        "plain": common,
        "lora": {**common, "lora": str(lora), "llm_kwargs": lora_kwargs},
        "lora_ours": {**common, "lora": str(lora), "llm_kwargs": lora_kwargs, "speculative_config": spec},
    }
    names = list(runs)
    return dict(zip(names, run_vllm([runs[n] for n in names])))


def test_adapter_changes_the_output(results):
    assert results["lora"]["tokens"] != results["plain"]["tokens"]


def test_lora_with_our_drafter_is_the_targets_output(results):
    assert results["lora_ours"]["tokens"] == results["lora"]["tokens"]
    assert "the draft embeds tokens with the target's base embedding" in results["lora_ours"]["log"]


def test_lora_drafts_are_accepted(results):
    assert counter(results["lora_ours"], "vllm:spec_decode_num_draft_tokens") > 0
    assert counter(results["lora_ours"], "vllm:spec_decode_num_accepted_tokens") > 0
