# SPDX-License-Identifier: Apache-2.0
"""vLLM's compile cache on CPU (integration/patches/aot_compile_load.py).

vLLM saves every compiled model and loads it at the next start; on CPU the load fails ('function' object has no
attribute 'finalize_loading': torch's Inductor bundle lacks the method vLLM calls) and the model is compiled again.
Each case builds the tiny target compiled (vLLM's default, not eager) twice, in two fresh processes sharing one
empty VLLM_CACHE_ROOT: the first compiles and saves, the second must load the saved artifact. Greedy tokens of the
loaded model must equal the freshly compiled one's (float32).

The key must cover our CPU linear routing (issue 61 item 5, review NEW-4): with our drafter a third start, between
the two, runs vLLM's oneDNN GEMM instead of our fp32 GEMM (DFLASH_CPU_GEMM_F32) and must compile its own graph under
another key. Without the key's routing factor it loaded the graph traced for our GEMM and failed at its first forward
(IndexError in the compiled forward); the key alone, without vLLM: tests/unit/test_aot_compile_key.py."""
import re

import pytest
from support.vllm_helpers import linear_probe, run_vllm

from vllm_dflash.ops.gemm_f32 import gemm_f32_supported

pytestmark = pytest.mark.vllm

PROMPTS = [list(range(5, 40)), list(range(50, 62))]
LOADED = "Directly load AOT compilation"
FAILED = "Compiling model again due to a load failure"
PROBE = linear_probe("_dflash_gemm_f32")  # which layers run our fp32 GEMM, which vLLM's oneDNN
F32 = gemm_f32_supported()  # avx2 and fma: our fp32 GEMM can run (forced to `all`, so also where `auto` is off)
OURS_GEMM, VLLM_GEMM = {"DFLASH_CPU_GEMM_F32": "all"}, {"DFLASH_CPU_GEMM_F32": "off"}


def _run(pair, **extra) -> dict:
    return {"model": str(pair / "target"), "prompts": PROMPTS, "max_tokens": 12,
            "llm_kwargs": {"enforce_eager": False}, **extra}


def _twice(pair, cache, env, **extra):
    run = _run(pair, **extra)
    env = {"VLLM_CACHE_ROOT": str(cache), **env}
    return run_vllm([run], env=env)[0], run_vllm([run], env=env)[0]


def _keys(res: dict, what: str) -> set[str]:
    """The key folders (under torch_compile_cache/torch_aot_compile/) a start saved to or loaded from."""
    line = "saved AOT compiled function to" if what == "saved" else LOADED
    return set(re.findall(re.escape(line) + r".*?torch_aot_compile/([0-9a-f]+)/", res["log"]))


@pytest.fixture(scope="module")
def dflash_starts(pair, tmp_path_factory) -> dict:
    """Three starts of one DFlash engine, each a fresh process, on one empty VLLM_CACHE_ROOT: `first` (our fp32 GEMM
    where the CPU has it) compiles and saves; `other` (vLLM's oneDNN GEMM, the only difference; run only where ours
    can run) compiles and saves under its own key; `again` (as `first`) loads `first`'s artifact."""
    run = _run(pair, speculative_config={"method": "dflash", "model": str(pair / "draft-b8")}, after=PROBE)
    cache = {"VLLM_CACHE_ROOT": str(tmp_path_factory.mktemp("cache-dflash"))}
    ours = {**cache, **OURS_GEMM} if F32 else cache
    starts = {"first": run_vllm([run], env=ours)[0]}
    if F32:
        starts["other"] = run_vllm([run], env={**cache, **VLLM_GEMM})[0]
    starts["again"] = run_vllm([run], env=ours)[0]
    return starts


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
def test_compile_cache_loads(pair, tmp_path_factory, request, how):
    """With the fix (an engine with our drafter; or no speculation under DFLASH_VLLM_EXTRAS=fixes) the second start
    loads every saved model (no load failure) and its greedy tokens equal the first start's (that they equal no
    speculation's: test_vllm_drafter.py). With our drafter a start on another GEMM came in between (the next test):
    its artifact, saved beside, is not the one loaded."""
    if how == "dflash":
        starts = request.getfixturevalue("dflash_starts")
        first, second = starts["first"], starts["again"]
        assert _keys(second, "loaded") == _keys(first, "saved"), (_keys(second, "loaded"), _keys(first, "saved"))
    else:
        first, second = _twice(pair, tmp_path_factory.mktemp(f"cache-{how}"), {"DFLASH_VLLM_EXTRAS": "fixes"})
    assert FAILED not in second["log"], second["log"][-3000:]
    assert LOADED in second["log"], second["log"][-3000:]
    assert second["tokens"] == first["tokens"]


@pytest.mark.skipif(not F32, reason="needs our fp32 GEMM (avx2 and fma, the built extension) as the other routing")
def test_another_gemm_routing_compiles_its_own(dflash_starts):
    """A start that differs only in the CPU linear routing (vLLM's oneDNN after our fp32 GEMM) does not load the
    artifact saved for the other: it compiles and saves under another key, and its layers run vLLM's GEMM."""
    first, other = dflash_starts["first"], dflash_starts["other"]
    assert first["probe"]["ours"] and not first["probe"]["onednn"], first["probe"]
    assert other["probe"]["onednn"] == first["probe"]["ours"] and not other["probe"]["ours"], other["probe"]
    assert LOADED not in other["log"] and FAILED not in other["log"], other["log"][-3000:]
    saved = _keys(first, "saved"), _keys(other, "saved")
    assert saved[0] and saved[1] and not saved[0] & saved[1], saved
    assert dflash_starts["again"]["probe"] == first["probe"]
