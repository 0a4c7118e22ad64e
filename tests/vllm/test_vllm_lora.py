# SPDX-License-Identifier: Apache-2.0
"""LoRA with our DFlash drafter (issue 51, the soak's LoRA finding).

With --enable-lora the target's token embedding is vLLM's LoRA wrapper, whose token-to-adapter mapping is set for the
target's scheduled tokens; the draft shares the embedding, and its forward over another token count ended the engine
(einsum size mismatch in bgmv_expand). The drafter now embeds through the wrapped base layer.

Every request goes through a random adapter (rank 4, large enough to change the tiny target's output on q_proj /
v_proj, bench/soak/lora.py) on the tiny pair: greedy output with our default drafter equals greedy output without
speculation under the same adapter, token for token (float32), drafts are accepted, and the adapter really changes the
output (so it was applied)."""
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
    after = PER_ENGINE.format(prompts=PL_PROMPTS, use=PL_LORA, lora=str(lora), target=str(pair / "target"))
    runs = {
        "plain": common,
        "lora": {**common, "lora": str(lora), "llm_kwargs": lora_kwargs},
        "lora_ours": {**common, "lora": str(lora), "llm_kwargs": lora_kwargs, "speculative_config": spec,
                      "after": after},
    }
    names = list(runs)
    return dict(zip(names, run_vllm([runs[n] for n in names]), strict=True))


def test_adapter_changes_the_output(results):
    assert results["lora"]["tokens"] != results["plain"]["tokens"]


def test_lora_with_our_drafter_is_the_targets_output(results):
    assert results["lora_ours"]["tokens"] == results["lora"]["tokens"]
    assert "the draft embeds tokens with the target's base embedding" in results["lora_ours"]["log"]


def test_lora_drafts_are_accepted(results):
    assert counter(results["lora_ours"], "vllm:spec_decode_num_draft_tokens") > 0
    assert counter(results["lora_ours"], "vllm:spec_decode_num_accepted_tokens") > 0


# ---------------------------------------------------------------------------- LoRA batches: vLLM's CPU bugs
# 1. vLLM's LoRA logits kernel maps rows to adapters per sampled row of the step; prompt logprobs run it over prompt
#    rows, so with two requests in a step (or any speculation) the engine dies (upstream vllm-project/vllm#16668).
#    Fixed by integration/patches/lora_prompt_logprobs.py.
# 2. vLLM's CPU LoRA kernels select adapter weights with the row's slot index, and "no adapter" (-1) picks the last
#    slot: with max_loras=1 (vLLM's default) base-model requests batched with an adapter request run through the
#    adapter. Fixed by integration/patches/cpu_lora_no_adapter.py.
# References: each request alone in stock vLLM (one sampled row broadcasts, and a step without an adapter request
# skips the LoRA kernels, so both are right there).
PL_PROMPTS = [PROMPTS[1], PROMPTS[0], PROMPTS[2]]  # the first goes through the adapter, the others the base model
PL_LORA = [True, False, False]
# after our LoRA engine's run (`llm`): an engine without our drafter built beside it in the same process, then the
# mixed batch on each (greedy, 12 tokens: the batch runs below)
PER_ENGINE = """
import gc
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from vllm.lora.request import LoRARequest
adapter = LoRARequest("test-lora", 1, {lora!r})
prompts, loras = [TokensPrompt(prompt_token_ids=p) for p in {prompts!r}], [adapter if u else None for u in {use!r}]
sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
mixed = lambda e: [list(o.outputs[0].token_ids) for o in e.generate(prompts, sp, use_tqdm=False, lora_request=loras)]
other = LLM(model={target!r}, dtype="float32", enforce_eager=True, max_model_len=1024, kv_cache_memory_bytes=64 << 20,
            seed=0, max_num_seqs=16, enable_lora=True, max_lora_rank=8, max_loras=1)
probe["other_engine"] = mixed(other)
probe["ours_again"] = mixed(llm)
del other
gc.collect()
"""


def _batch_run(pair, lora, prompts, lora_list, prompt_logprobs=2, **extra):
    return {"model": str(pair / "target"), "prompts": prompts, "max_tokens": 12, "lora": str(lora),
            "lora_list": lora_list, "llm_kwargs": {"enable_lora": True, "max_lora_rank": 8, "max_loras": 1},
            "sampling": {"prompt_logprobs": prompt_logprobs}, **extra}


@pytest.fixture(scope="module")
def batch_runs(pair, tmp_path_factory):
    from vllm_dflash.bench.soak.lora import make_lora

    lora = make_lora(pair / "target", tmp_path_factory.mktemp("lora-batch") / "adapter", rank=4, seed=0, scale=0.5)
    stock = [_batch_run(pair, lora, [p], [use]) for p, use in zip(PL_PROMPTS, PL_LORA, strict=True)]
    stock.append(_batch_run(pair, lora, PL_PROMPTS[:1], [False]))  # the adapter's prompt, base model
    stock.append(_batch_run(pair, lora, PL_PROMPTS, PL_LORA, generate_error=True))
    stock.append(_batch_run(pair, lora, PL_PROMPTS, PL_LORA, prompt_logprobs=None))
    alone = run_vllm(stock, env={"VLLM_PLUGINS": ""})
    spec = {"method": "dflash", "model": str(pair / "draft-b8")}
    ours = run_vllm([_batch_run(pair, lora, PL_PROMPTS, PL_LORA),
                     _batch_run(pair, lora, PL_PROMPTS, PL_LORA, speculative_config=spec)],
                    env={"DFLASH_VLLM_EXTRAS": "fixes"})
    n = len(PL_PROMPTS)
    return {"alone": alone[:n], "base_first": alone[n], "stock_batch": alone[n + 1], "stock_mixed": alone[n + 2],
            "fixes_batch": ours[0], "ours_batch": ours[1]}


def _assert_same_prompt_logprobs(got: list, want: list) -> None:
    assert len(got) == len(want)
    for pos, (g, w) in enumerate(zip(got, want, strict=True)):
        if w is None:
            assert g is None
            continue
        assert set(g) == set(w), f"position {pos}: top tokens {sorted(g)} != {sorted(w)}"
        for t in w:
            assert g[t] == pytest.approx(w[t], abs=1e-4), f"position {pos}, token {t}"


def test_stock_vllm_dies_on_prompt_logprobs_with_lora(batch_runs):
    """Bug 1 is vLLM's: stock vLLM 0.32 (plugin not loaded, no speculation) raises on the three-request batch."""
    err = batch_runs["stock_batch"]["generate_error"]
    assert err and "einsum" in err, err


def test_stock_vllm_applies_the_adapter_to_base_requests(batch_runs):
    """Bug 2 is vLLM's: in stock vLLM's mixed batch (no prompt logprobs), a base-model request's greedy output
    differs from the same request alone."""
    mixed = batch_runs["stock_mixed"]["tokens"]
    alone = [r["tokens"][0] for r in batch_runs["alone"]]
    assert mixed[0] == alone[0]  # the adapter request itself is right
    assert any(m != a for m, a in zip(mixed[1:], alone[1:], strict=True)), \
        "stock vLLM no longer leaks the adapter: drop the patch"


@pytest.mark.parametrize("run", ["fixes_batch", "ours_batch"])
def test_prompt_logprobs_with_lora_in_a_batch(batch_runs, run):
    """With the fixes (our DFlash engine; or stock under DFLASH_VLLM_EXTRAS=fixes) the batch is served, and each
    request's prompt logprobs equal that request's served alone by stock vLLM (float32)."""
    res = batch_runs[run]
    assert res["generate_error"] is None
    for i, ref in enumerate(batch_runs["alone"]):
        _assert_same_prompt_logprobs(res["prompt_logprobs"][i], ref["prompt_logprobs"][0])
    # the adapter reached the prompt logprobs (so rows mapped to no adapter would fail the equality above)
    assert batch_runs["base_first"]["prompt_logprobs"][0] != res["prompt_logprobs"][0]


@pytest.mark.parametrize("run", ["fixes_batch", "ours_batch"])
def test_base_requests_batched_with_an_adapter_request(batch_runs, run):
    """With the fixes, every request of the mixed batch (one adapter request, two base-model requests) has the greedy
    tokens of the same request served alone by stock vLLM (float32), with and without speculation."""
    assert batch_runs[run]["tokens"] == [r["tokens"][0] for r in batch_runs["alone"]]


def test_no_adapter_fix_is_per_engine(results, batch_runs):
    """Two live engines in one process, no opt-in: an engine without our drafter built after ours (its punica wrapper
    the last one built) is stock vLLM, its base requests through the adapter; ours still serves the mixed batch
    right afterwards (the fix follows each engine's wrapper, not the last one built)."""
    probe = results["lora_ours"]["probe"]
    assert probe["other_engine"] == batch_runs["stock_mixed"]["tokens"]
    assert probe["ours_again"] == [r["tokens"][0] for r in batch_runs["alone"]]
