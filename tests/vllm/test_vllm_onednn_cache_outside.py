# SPDX-License-Identifier: Apache-2.0
"""The onednn_cache patch when a weight shape is first met outside an engine (no vLLM config being loaded, so
nothing to size the build from): that handler builds nothing, and the first handler of the shape created while an
engine loads still builds the engine's decode-sized row counts."""
import pytest
import torch

from vllm_dflash.integration.patches import cpu_onednn_cache as patch_mod

pytestmark = pytest.mark.vllm

ops = pytest.importorskip("vllm._custom_ops")
if not getattr(ops, "_supports_onednn", False):
    pytest.skip("this vLLM build has no oneDNN GEMM", allow_module_level=True)

from test_vllm_onednn_cache import engine_config, patched  # noqa: E402,F401  (the same spy fixture)


def test_a_shape_met_outside_an_engine_is_built_by_the_first_engine(patched, monkeypatch):  # noqa: F811
    import vllm.config

    monkeypatch.setenv("DFLASH_ONEDNN_CACHE", "256")
    built = []
    monkeypatch.setattr(patch_mod, "_warm",
                        lambda handler, weight, rows: built.append((tuple(weight.shape), rows)) or rows)
    w = torch.randn(40, 24, generator=torch.Generator().manual_seed(0)).t()  # [K=24, N=40] as vLLM passes it

    monkeypatch.setattr(vllm.config, "get_current_vllm_config_or_none", lambda: None)  # no engine loading
    ops.create_onednn_mm(w, 32)
    assert built == [], "outside an engine there is no decode size to build"

    monkeypatch.setattr(vllm.config, "get_current_vllm_config_or_none", lambda: engine_config(4, 3))
    ops.create_onednn_mm(w, 32)
    ops.create_onednn_mm(w, 32)
    assert built == [((24, 40), 16)], "the first handler inside an engine builds M = 1..4 x (1 + 3), once"
