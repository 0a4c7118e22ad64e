# SPDX-License-Identifier: Apache-2.0
"""vLLM's spec-decode counters with our drafter agree with the reference loop: mean acceptance length
(1 + accepted / drafts) within 5% of the reference τ on the same prompts (float32 on both sides)."""
import pytest
import torch

from vllm_dflash.model import DFlashDraftModel
from vllm_dflash.reference import DecodeStats, ReferenceDecoder
from support.testing import load_target
from support.vllm_helpers import counter, run_vllm

pytestmark = pytest.mark.vllm
g = torch.Generator().manual_seed(99)
PROMPTS = [torch.randint(4, 384, (12,), generator=g).tolist() for _ in range(8)]


@pytest.mark.parametrize("block", [8, 16])
def test_metrics_tau_matches_reference_loop(pair, block):
    tgt = load_target(pair / "target", dtype=torch.float32)
    draft = DFlashDraftModel.from_pretrained(pair / f"draft-b{block}", target=tgt)
    dec = ReferenceDecoder(tgt, draft)
    stats = DecodeStats(block_size=block)
    ref_tokens = []
    for p in PROMPTS:
        r = dec.generate(p, max_new_tokens=48)
        stats.merge(r.stats)
        ref_tokens.append(r.token_ids)
    spec = {"method": "dflash", "model": str(pair / f"draft-b{block}"), "num_speculative_tokens": block - 1,
            "adaptive": False}
    (res,) = run_vllm([{"model": str(pair / "target"), "prompts": PROMPTS, "max_tokens": 48, "speculative_config": spec,
                        "llm_kwargs": {"dtype": "float32"}}])
    assert res["tokens"] == ref_tokens  # same trajectories, so τ is comparable
    tau_vllm = 1 + counter(res, "vllm:spec_decode_num_accepted_tokens") / counter(res, "vllm:spec_decode_num_drafts")
    print(f"block {block}: tau vLLM {tau_vllm:.3f} vs reference {stats.acceptance_length:.3f}")
    assert stats.acceptance_length > 1.5
    assert tau_vllm == pytest.approx(stats.acceptance_length, rel=0.05), (tau_vllm, stats.acceptance_length)
