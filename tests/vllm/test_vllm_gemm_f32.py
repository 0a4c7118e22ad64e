# SPDX-License-Identifier: Apache-2.0
"""The cpu_gemm_f32 patch inside real vLLM (float32 tiny target): every layer vLLM gives to oneDNN gets our AVX2 GEMM
and no other layer does; speculation on it is exact (greedy tokens identical to no speculation, float32); against
vLLM's oneDNN GEMM the tokens are identical or part at a near-tie of two summation orders; compiled as eager.

The setting is forced to `all` (and `off` for the baseline), so this runs on any CPU with avx2 and fma, also where
`auto` leaves the patch off (CPUs with avx512f)."""
import pytest
import torch

from vllm_dflash.exactness import first_difference
from vllm_dflash.ops.gemm_f32 import gemm_f32, gemm_f32_reference, gemm_f32_supported, pack_f32_weight

from support.vllm_helpers import linear_probe, run_vllm

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not gemm_f32_supported(), reason="the fp32 GEMM needs avx2 and fma (and the built "
                                 "extension); elsewhere the patch leaves vLLM's GEMM alone")]

g = torch.Generator().manual_seed(9)
PROMPTS = [torch.randint(4, 384, (n,), generator=g).tolist() for n in (7, 12, 19, 30)]
# Two fp32 GEMMs that sum in different orders give logits a few ulp apart: a greedy choice can only flip where the
# top-2 logprobs are closer than this (nats). Far above fp32 order noise (~1e-5), far below a real difference.
ORDER_TIE_NATS = 1e-3

PROBE = linear_probe("_dflash_gemm_f32")  # which layers got which GEMM: ours, vLLM's oneDNN, other


@pytest.fixture(scope="module")
def results(pair):
    t = str(pair / "target")
    spec = {"method": "dflash", "model": str(pair / "draft-b8"), "num_speculative_tokens": 7, "adaptive": False}
    common = {"model": t, "prompts": PROMPTS, "max_tokens": 24, "after": PROBE, "sampling": {"logprobs": 5},
              "llm_kwargs": {"dtype": "float32"}}
    # engines without our drafter get the kernel under the opt-in only (the walls: tests/vllm/test_walls.py)
    on, off = {"DFLASH_CPU_GEMM_F32": "all", "DFLASH_VLLM_EXTRAS": "all"}, {"DFLASH_CPU_GEMM_F32": "off"}
    runs = {
        "off": {**common, "env": off},
        "on": {**common, "env": on},
        "on_spec": {**common, "env": on, "speculative_config": spec},
        "on_compiled": {**common, "env": on, "llm_kwargs": {"dtype": "float32", "enforce_eager": False}},
    }
    return dict(zip(runs, run_vllm(list(runs.values()))))


def test_layers_vllm_gives_to_onednn_get_ours(results):
    """With the setting, exactly the layers vLLM gave to oneDNN (run `off`) carry our linear; without it, none."""
    off, on = results["off"]["probe"], results["on"]["probe"]
    assert off["onednn"] and not off["ours"], off
    assert sorted(on["ours"]) == sorted(off["onednn"]) and not on["onednn"], (on, off)
    assert on["other"] == off["other"]


def test_speculation_on_our_gemm_is_exact(results):
    """float32: DFlash speculation (verify steps of 1 + k rows) gives the tokens of plain decode, all of them."""
    assert results["on_spec"]["tokens"] == results["on"]["tokens"]


@pytest.mark.parametrize("run", ["on", "on_compiled"])
def test_tokens_match_onednn_up_to_order_ties(results, run):
    """Against vLLM's oneDNN GEMM (eager) every prompt is identical, or its first difference is a tie of the
    baseline's top-2 within ORDER_TIE_NATS."""
    base, other = results["off"], results[run]
    for i, (a, b) in enumerate(zip(base["tokens"], other["tokens"])):
        j = first_difference(a, b)
        if j is None:
            continue
        assert j < min(len(a), len(b)), (i, j)
        lp = base["logprobs"][i][j]
        assert str(b[j]) in lp and lp[str(a[j])] - lp[str(b[j])] <= ORDER_TIE_NATS, (i, j, lp)


def test_linear_f32_routes_by_rows():
    """linear_f32 (the op the patch installs): rows <= max_rows on our kernel (bitwise gemm_f32), more rows on vLLM's
    oneDNN handler; with an empty handler and no limit every call is ours."""
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    from vllm import _custom_ops as ops

    g = torch.Generator().manual_seed(11)
    w, b = torch.randn(96, 64, generator=g), torch.randn(96, generator=g)
    pw = pack_f32_weight(w)
    handler = ops.create_onednn_mm(w.t(), 32)
    op = torch.ops.vllm_dflash.linear_f32
    x = torch.randn(12, 64, generator=g)
    ours = gemm_f32(x, pw, b)
    assert torch.equal(op(x, pw.packed, 96, b, 12, handler.handler_tensor), ours)
    routed = op(x, pw.packed, 96, b, 4, handler.handler_tensor)  # 12 rows > 4: oneDNN
    torch.testing.assert_close(routed, gemm_f32_reference(x, w, b), rtol=1e-5, atol=1e-5)
    assert torch.equal(op(x.view(3, 4, 64), pw.packed, 96, b, 1 << 62, torch.empty(0)), ours.view(3, 4, 96))
