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


# ---------------------------------------------------------------------------- prompt logprobs with LoRA enabled
# vLLM's LoRA logits kernel maps rows to adapters per sampled row of the step; prompt logprobs run it over prompt
# rows, so with two requests in a step (or any speculation) the engine dies (upstream vllm-project/vllm#16668). The
# fix-kind patch integration/patches/lora_prompt_logprobs.py maps the prompt rows themselves. References: each
# request alone in stock vLLM (one sampled row broadcasts, so the kernel is right there).
PL_PROMPTS = [PROMPTS[1], PROMPTS[0]]  # the first goes through the adapter, the second through the base model
PL_LORA = [True, False]


def _prompt_logprobs_run(pair, lora, prompts, lora_list, **extra):
    return {"model": str(pair / "target"), "prompts": prompts, "max_tokens": 12, "lora": str(lora),
            "lora_list": lora_list, "llm_kwargs": {"enable_lora": True, "max_lora_rank": 8, "max_loras": 2},
            "sampling": {"prompt_logprobs": 2}, **extra}


@pytest.fixture(scope="module")
def logprob_runs(pair, tmp_path_factory):
    from vllm_dflash.bench.soak.lora import make_lora

    lora = make_lora(pair / "target", tmp_path_factory.mktemp("lora-pl") / "adapter", rank=4, seed=0, scale=0.5)
    stock = [_prompt_logprobs_run(pair, lora, [p], [use]) for p, use in zip(PL_PROMPTS, PL_LORA)]
    stock.append(_prompt_logprobs_run(pair, lora, PL_PROMPTS[:1], [False]))  # the adapter's prompt, base model
    stock.append(_prompt_logprobs_run(pair, lora, PL_PROMPTS, PL_LORA, generate_error=True))
    alone = run_vllm(stock, env={"VLLM_PLUGINS": ""})
    spec = {"method": "dflash", "model": str(pair / "draft-b8")}
    ours = run_vllm([_prompt_logprobs_run(pair, lora, PL_PROMPTS, PL_LORA),
                     _prompt_logprobs_run(pair, lora, PL_PROMPTS, PL_LORA, speculative_config=spec)],
                    env={"DFLASH_VLLM_EXTRAS": "fixes"})
    return {"alone": alone[:2], "base_first": alone[2], "stock_batch": alone[3], "fixes_batch": ours[0], "ours_batch": ours[1]}


def _assert_same_prompt_logprobs(got: list, want: list) -> None:
    assert len(got) == len(want)
    for pos, (g, w) in enumerate(zip(got, want)):
        if w is None:
            assert g is None
            continue
        assert set(g) == set(w), f"position {pos}: top tokens {sorted(g)} != {sorted(w)}"
        for t in w:
            assert g[t] == pytest.approx(w[t], abs=1e-4), f"position {pos}, token {t}"


def test_stock_vllm_dies_on_prompt_logprobs_with_lora(logprob_runs):
    """The patch is needed: stock vLLM 0.32 (plugin not loaded, no speculation) raises on the two-request batch."""
    err = logprob_runs["stock_batch"]["generate_error"]
    assert err and "einsum" in err, err


@pytest.mark.parametrize("run", ["fixes_batch", "ours_batch"])
def test_prompt_logprobs_with_lora_in_a_batch(logprob_runs, run):
    """With the fix (our DFlash engine; or stock under DFLASH_VLLM_EXTRAS=fixes) the batch is served, and each
    request's prompt logprobs and greedy tokens equal that request served alone by stock vLLM (float32)."""
    res = logprob_runs[run]
    assert res["generate_error"] is None
    for i, ref in enumerate(logprob_runs["alone"]):
        _assert_same_prompt_logprobs(res["prompt_logprobs"][i], ref["prompt_logprobs"][0])
        assert res["tokens"][i] == ref["tokens"][0]
    # the adapter reached the prompt logprobs (so rows mapped to no adapter would fail the equality above)
    assert logprob_runs["base_first"]["prompt_logprobs"][0] != res["prompt_logprobs"][0]
