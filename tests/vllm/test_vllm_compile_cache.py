# SPDX-License-Identifier: Apache-2.0
"""vLLM's compile cache on CPU (integration/patches/aot_compile_load.py).

vLLM saves every compiled model and loads it at the next start; on CPU the load fails ('function' object has no
attribute 'finalize_loading': torch's Inductor bundle lacks the method vLLM calls) and the model is compiled again.
Each case builds the tiny target compiled (vLLM's default, not eager) twice, in two fresh processes sharing one
empty VLLM_CACHE_ROOT: the first compiles and saves, the second must load the saved artifact. Greedy tokens of the
loaded model must equal the freshly compiled one's (float32)."""
import pytest

from support.vllm_helpers import run_vllm

pytestmark = pytest.mark.vllm

PROMPTS = [list(range(5, 40)), list(range(50, 62))]
LOADED = "Directly load AOT compilation"
FAILED = "Compiling model again due to a load failure"


def _twice(pair, cache, env, **extra):
    run = {"model": str(pair / "target"), "prompts": PROMPTS, "max_tokens": 12,
           "llm_kwargs": {"enforce_eager": False}, **extra}
    env = {"VLLM_CACHE_ROOT": str(cache), **env}
    return run_vllm([run], env=env)[0], run_vllm([run], env=env)[0]


# `slow`: what stock vLLM does cannot change while vLLM is pinned to 0.32.x (run it when the pin moves: when it
# fails, vLLM fixed the bug and the patch can go)
@pytest.mark.slow
def test_stock_vllm_compiles_again(pair, tmp_path_factory):
    """The patch is needed: stock vLLM 0.32 on CPU (plugin not loaded) cannot load its own saved artifact."""
    first, second = _twice(pair, tmp_path_factory.mktemp("cache-stock"), {"VLLM_PLUGINS": ""})
    assert LOADED not in second["log"]
    assert FAILED in second["log"] and "finalize_loading" in second["log"], second["log"][-3000:]
    assert second["tokens"] == first["tokens"]


# `extras` is `slow`: the same patch, reached through the opt-in, which test_walls.py checks applies every patch
@pytest.mark.parametrize("how", ["dflash", pytest.param("extras", marks=pytest.mark.slow)])
def test_compile_cache_loads(pair, tmp_path_factory, how):
    """With the fix (an engine with our drafter; or no speculation under DFLASH_VLLM_EXTRAS=fixes) the second start
    loads every saved model (no load failure) and its greedy tokens equal the first start's (that they equal no
    speculation's: test_vllm_drafter.py)."""
    if how == "dflash":
        extra, env = {"speculative_config": {"method": "dflash", "model": str(pair / "draft-b8")}}, {}
    else:
        extra, env = {}, {"DFLASH_VLLM_EXTRAS": "fixes"}
    first, second = _twice(pair, tmp_path_factory.mktemp(f"cache-{how}"), env, **extra)
    assert FAILED not in second["log"], second["log"][-3000:]
    assert LOADED in second["log"], second["log"][-3000:]
    assert second["tokens"] == first["tokens"]
