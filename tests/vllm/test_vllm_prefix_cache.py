# SPDX-License-Identifier: Apache-2.0
"""Prefix caching with our drafter keeps the last cached block (vLLM drops it for every hidden-state drafter).

Same prompts twice in one engine: the second pass hits the prefix cache. With our default the hit covers every
full block (vLLM's drop rule recomputes the last one), the output equals the target's own greedy output, and the
draft proposes and accepts exactly what it did on the cold pass: the cached draft K/V are exact. Negative control:
zeroing the draft's KV cache before the warm pass (stale draft K/V in the kept blocks) changes the drafts."""
import pytest
import torch

from support.vllm_helpers import run_vllm

pytestmark = pytest.mark.vllm

g = torch.Generator().manual_seed(5)
PROMPTS = [torch.randint(4, 384, (140,), generator=g).tolist() for _ in range(4)]  # 4 full 32-token blocks each
SMALL_BLOCKS = {"block_size": 32, "dtype": "float32"}
ZERO_DRAFT_KV = """
runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
ctx = runner.compilation_config.static_forward_context
for name in runner.drafter._draft_attn_layer_names:
    kv = ctx[name].kv_cache
    (kv[0] if isinstance(kv, list) else kv).zero_()
"""


@pytest.fixture(scope="module")
def results(pair):
    t = str(pair / "target")
    spec = {"method": "dflash", "model": str(pair / "draft-b8"), "num_speculative_tokens": 7, "adaptive": False}
    common = {"model": t, "prompts": PROMPTS, "max_tokens": 40, "repeat": 1, "llm_kwargs": SMALL_BLOCKS}
    runs = {
        "base": common,
        "ours": {**common, "speculative_config": spec},
        "ours_drop": {**common, "speculative_config": {**spec, "disable_eagle_block_drop": False}},
        "ours_stale": {**common, "speculative_config": spec, "before_repeat": ZERO_DRAFT_KV},
    }
    names = list(runs)
    return dict(zip(names, run_vllm([runs[n] for n in names])))


def test_warm_output_is_lossless(results):
    base = results["base"]["tokens"]
    for name in ("ours", "ours_drop"):
        assert results[name]["tokens"] == base, name
        assert results[name]["repeats"][0]["tokens"] == base, name


def test_last_block_is_kept(results):
    warm = results["ours"]["repeats"][0]["cached_tokens"]
    warm_drop = results["ours_drop"]["repeats"][0]["cached_tokens"]
    assert all(c >= 128 for c in warm), warm  # all 4 full blocks of each 140-token prompt
    assert all(d < c for c, d in zip(warm, warm_drop)), (warm, warm_drop)  # vLLM's rule drops one
    assert "disable_eagle_block_drop=True" in results["ours"]["log"] or "block dropping is disabled" in \
        results["ours"]["log"]


def _counters(r, warm: bool) -> tuple[float, float]:
    c = r["repeats"][0]["counters"] if warm else r["first_counters"]
    return c["vllm:spec_decode_num_draft_tokens"], c["vllm:spec_decode_num_accepted_tokens"]


def test_cached_draft_kv_is_exact(results):
    r = results["ours"]
    assert _counters(r, warm=False)[1] > 0
    assert _counters(r, warm=True) == _counters(r, warm=False)  # same drafts, same acceptance


def test_stale_draft_kv_would_be_caught(results):
    r = results["ours_stale"]
    assert r["tokens"] == results["base"]["tokens"] and r["repeats"][0]["tokens"] == results["base"]["tokens"]
    assert _counters(r, warm=True) != _counters(r, warm=False)
