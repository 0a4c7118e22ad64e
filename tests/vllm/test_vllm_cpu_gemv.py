# SPDX-License-Identifier: Apache-2.0
"""The cpu_gemv patch inside real vLLM (bf16 target, CPU with avx512_bf16): every layer vLLM gives to oneDNN gets our
two-path linear and no other layer does; greedy output with it equals vLLM's own GEMM except at bf16 near-ties (each
divergence explained by the baseline's own top-2 margin), eager and compiled, with and without DFlash speculation.

AMX CPUs give layers of at most 1 MiB to vLLM's sgl-kernel GEMM instead of oneDNN (the whole tiny test target):
every run here sets `check_cpu_sgl_kernel` to False first, so the target's layers take the oneDNN path they take on
any other avx512_bf16 CPU, and the patch has something to replace."""
import pytest
import torch

from vllm_dflash.exactness import first_difference, is_near_tie
from vllm_dflash.ops.gemv import gemv_supported

from support.vllm_helpers import linear_probe, run_vllm

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not gemv_supported(), reason="the skinny-GEMM kernel needs avx512_bf16 (and the built "
                                 "extension); elsewhere the patch leaves vLLM's GEMM alone")]

g = torch.Generator().manual_seed(5)
PROMPTS = [torch.randint(4, 384, (n,), generator=g).tolist() for n in (7, 12, 19, 30)]

NO_SGL = "import vllm.model_executor.layers.utils as U\nU.check_cpu_sgl_kernel = lambda n, k, dtype: False\n"
PROBE = linear_probe("_dflash_gemv")  # which layers got which GEMM: ours, vLLM's oneDNN, other


def divergences(base: dict, other: dict) -> list[dict]:
    """Per prompt, the first token where `other` leaves `base`, with the baseline's margin between the two tokens
    (None: the other token is not in the baseline's top-k there, i.e. far from a tie, or one output is a prefix of
    the other)."""
    out = []
    for i, (a, b) in enumerate(zip(base["tokens"], other["tokens"])):
        j = first_difference(a, b)
        if j is None:
            continue
        if j >= min(len(a), len(b)):  # one output is a prefix of the other: no token pair to weigh
            out.append({"prompt": i, "position": j, "margin": None})
            continue
        lp = base["logprobs"][i][j]
        margin = lp[str(a[j])] - lp[str(b[j])] if str(b[j]) in lp else None
        out.append({"prompt": i, "position": j, "margin": margin})
    return out


def near_ties(divs: list[dict]) -> bool:
    return all(is_near_tie(d["margin"], "bfloat16") for d in divs)


@pytest.fixture(scope="module")
def results(pair):
    t = str(pair / "target")
    spec = {"method": "dflash", "model": str(pair / "draft-b8"), "num_speculative_tokens": 7, "adaptive": False}
    common = {"model": t, "prompts": PROMPTS, "max_tokens": 24, "patch": NO_SGL, "after": PROBE,
              "sampling": {"logprobs": 5}, "llm_kwargs": {"dtype": "bfloat16"}}
    on = {"DFLASH_CPU_GEMV": "8", "DFLASH_VLLM_EXTRAS": "all"}  # engines without our drafter: the opt-in
    runs = {
        "off": {**common},
        "on": {**common, "env": on},
        "on_spec": {**common, "env": on, "speculative_config": spec},
        "on_compiled": {**common, "env": on, "llm_kwargs": {"dtype": "bfloat16", "enforce_eager": False}},
    }
    return dict(zip(runs, run_vllm(list(runs.values()))))


def test_layers_vllm_gives_to_onednn_get_ours(results):
    """With the setting, exactly the layers vLLM gave to oneDNN (run `off`) carry our linear; without it, none."""
    off, on = results["off"]["probe"], results["on"]["probe"]
    assert off["onednn"] and not off["ours"], off
    assert sorted(on["ours"]) == sorted(off["onednn"]) and not on["onednn"], (on, off)
    assert on["other"] == off["other"]


@pytest.mark.parametrize("run", ["on", "on_spec", "on_compiled"])
def test_greedy_output_matches_vllm_gemm_up_to_near_ties(results, run):
    """Greedy tokens with our GEMM (eager, with DFlash speculation, compiled) vs vLLM's oneDNN GEMM: identical, or
    the first difference of a prompt is a bf16 near-tie of the baseline (margin <= the bf16 near-tie bound)."""
    divs = divergences(results["off"], results[run])
    assert near_ties(divs), divs
    assert len(divs) < len(PROMPTS), f"every prompt diverged: {divs}"


def test_divergence_check_flags_a_wrong_token(results):
    """Negative control: the baseline with one token replaced by its least likely top-5 alternative is flagged."""
    base = results["off"]
    lp = base["logprobs"][0][3]
    worst = min(lp, key=lp.get)
    doctored = {"tokens": [list(t) for t in base["tokens"]]}
    doctored["tokens"][0][3] = int(worst)
    divs = divergences(base, doctored)
    assert divs and not near_ties(divs), divs
