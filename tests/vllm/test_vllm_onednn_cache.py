# SPDX-License-Identifier: Apache-2.0
"""The onednn_cache patch on vLLM's own oneDNN GEMM handler (`vllm._custom_ops.create_onednn_mm`), in process:
- handlers get the larger row-count cache, and the first handler of each weight shape builds the decode-sized row
  counts of the engine being loaded (read from vLLM's current config), once per shape;
- `DFLASH_ONEDNN_CACHE=0` passes vLLM's own cache size through and builds nothing;
- a patched handler computes x @ W for every row count, including more row counts than vLLM's 32 (float32, where
  oneDNN runs on every x86 CPU; the primitive for a row count does not depend on when it was built)."""
import types

import pytest
import torch

from vllm_dflash.integration.patches import cpu_onednn_cache as patch_mod

pytestmark = pytest.mark.vllm

ops = pytest.importorskip("vllm._custom_ops")
if not getattr(ops, "_supports_onednn", False):
    pytest.skip("this vLLM build has no oneDNN GEMM", allow_module_level=True)


def engine_config(max_num_seqs: int, k: int | None, max_num_batched_tokens: int = 2048):
    spec = None if k is None else types.SimpleNamespace(num_speculative_tokens=k)
    sched = types.SimpleNamespace(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)
    return types.SimpleNamespace(scheduler_config=sched, speculative_config=spec)


@pytest.fixture
def patched(monkeypatch):
    """The patch applied over a spy on vLLM's own function (both undone after the test); yields the cache sizes
    vLLM's function was asked for."""
    calls = []
    original = ops.create_onednn_mm
    if getattr(original, "_vllm_dflash_patched", False):  # the plugin already patched this process
        original = patch_mod._ORIGINAL

    def spy(weight, primitive_cache_size=128):
        calls.append(primitive_cache_size)
        return original(weight, primitive_cache_size)

    monkeypatch.setattr(ops, "create_onednn_mm", spy)
    monkeypatch.setenv("DFLASH_VLLM_EXTRAS", "all")  # these configs have no DFlash drafter: the opt-in
    monkeypatch.setattr(patch_mod, "_ORIGINAL", None)
    monkeypatch.setattr(patch_mod, "_WARMED", set())
    patch_mod.apply()  # wraps the spy as it wraps vLLM's function
    assert ops.create_onednn_mm is patch_mod.create_onednn_mm and patch_mod._ORIGINAL is spy
    return calls


def test_warm_rows_is_the_largest_decode_step(monkeypatch):
    """1 .. max_num_seqs x (1 + k), capped at max_num_batched_tokens and half the cache; 0 outside an engine."""
    import vllm.config

    for cfg, cache, want in ((engine_config(8, 7), 512, 64), (engine_config(32, 7), 512, 256),
                             (engine_config(32, 7), 256, 128), (engine_config(256, None), 512, 256),
                             (engine_config(64, 7, max_num_batched_tokens=100), 512, 100),
                             (engine_config(4, None), 512, 4), (None, 512, 0)):
        monkeypatch.setattr(vllm.config, "get_current_vllm_config_or_none", lambda cfg=cfg: cfg)
        assert patch_mod.warm_rows(cache) == want, (cfg, cache)


def test_handlers_get_the_cache_and_each_shape_is_built_once(patched, monkeypatch):
    import vllm.config

    monkeypatch.setenv("DFLASH_ONEDNN_CACHE", "256")
    monkeypatch.setattr(vllm.config, "get_current_vllm_config_or_none", lambda: engine_config(4, 3))
    built = []
    monkeypatch.setattr(patch_mod, "_warm",
                        lambda handler, weight, rows: built.append((tuple(weight.shape), rows)) or rows)
    g = torch.Generator().manual_seed(0)
    w1 = torch.randn(40, 24, generator=g).t()  # [K=24, N=40] as vLLM passes it
    w2 = torch.randn(40, 24, generator=g).t()  # a second layer of the same shape
    w3 = torch.randn(24, 40, generator=g).t()  # another shape
    for w in (w1, w2, w3):
        ops.create_onednn_mm(w, 32)
    assert patched == [256, 256, 256], "vLLM asks for 32 row counts; the patch must ask for the setting's 256"
    assert built == [((24, 40), 16), ((40, 24), 16)], "each weight shape is built once, for M = 1..4 x (1 + 3)"


def test_off_keeps_vllms_cache_and_builds_nothing(patched, monkeypatch):
    import vllm.config

    monkeypatch.setenv("DFLASH_ONEDNN_CACHE", "off")
    monkeypatch.setattr(vllm.config, "get_current_vllm_config_or_none", lambda: engine_config(4, 3))
    built = []
    monkeypatch.setattr(patch_mod, "_warm", lambda *a: built.append(a) or 0)
    ops.create_onednn_mm(torch.randn(40, 24).t(), 32)
    assert patched == [32] and built == []


def test_patched_handler_computes_the_product_for_every_row_count(patched, monkeypatch):
    """float32 x @ W through the patched handler, for M = 1..80 (more than vLLM's 32 row counts), with the
    decode-sized ones (1..16) built up front; against torch's matmul in float64."""
    import vllm.config

    monkeypatch.setenv("DFLASH_ONEDNN_CACHE", "64")
    monkeypatch.setattr(vllm.config, "get_current_vllm_config_or_none", lambda: engine_config(8, 1))
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(48, 32, generator=g)  # [N, K] as the layer holds it
    handler = ops.create_onednn_mm(weight.t(), 32)
    for m in (*range(1, 81), 5, 17, 64, 1):
        x = torch.randn(m, 32, generator=g)
        got = ops.onednn_mm(handler, x, None)
        want = (x.double() @ weight.double().t()).float()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=f"M = {m}")


def test_warm_stops_at_its_budget():
    """The build-up-front loop goes smallest row count first and stops once its time budget is spent (a zero budget:
    after the first row count); with time left it builds every row count asked for."""
    weight = torch.randn(40, 24).t()  # [K=24, N=40]
    handler = patch_mod._ORIGINAL(weight, 64) if patch_mod._ORIGINAL is not None else ops.create_onednn_mm(weight, 64)
    assert patch_mod._warm(handler, weight, 20, budget_s=0.0) == 1
    assert patch_mod._warm(handler, weight, 20, budget_s=60.0) == 20
