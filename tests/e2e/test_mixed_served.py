# SPDX-License-Identifier: Apache-2.0
"""The mixed-source check of sampled output (vllm_dflash/bench/soak/mixed.py, `vllm-dflash soak --mixed-check`) on
live `vllm serve` processes with the tiny pair and our default config, float32, at CI size (temperature 1.0, 4 tokens
per request; marked vllm, ~3 min on 2 cores): a forced plan gives each sampled request one proposal source (DFlash
block, merged, own prompt lookup, cross-request lookup, none) beside greedy requests, and per source our output's
distribution equals stock vLLM's by a two-sample chi-square (p > 1e-3), every drafting source's proposals having been
verified beside a hand-off of q. Negative control: the same plan with a mismatched q must fail for every drafting
source at the same size. The in-process form, at two temperatures: tests/vllm/test_vllm_sampling_mixed.py."""
import pytest
import torch

PER_GROUP = 500  # ~3 min on 2 cores; the mismatched q is caught far below 1e-3 (p < 1e-30 at 700)
# the in-process test's prompts (token ids): PROMPT's continuations stay uncertain at T 1.0 and repeat its tokens;
# CROSS_PROMPT ends like it after another start
PROMPT = torch.randint(4, 384, (12,), generator=torch.Generator().manual_seed(21)).tolist()
CROSS_PROMPT = torch.randint(4, 384, (9,), generator=torch.Generator().manual_seed(2001)).tolist() + PROMPT[9:]


@pytest.mark.vllm
def test_mixed_sources_served_and_negative_control(pair, tmp_path):
    from vllm_dflash.bench.soak.mixed import DRAFTING, P_MIN, run_mixed_check

    res = run_mixed_check(pair / "target", pair / "draft-b8", "float32", PER_GROUP, 4, [1.0], 48, True,
                          tmp_path, prompts=(PROMPT, CROSS_PROMPT), max_model_len=1024)
    failed = {c["name"]: c["detail"] for c in res["checks"] if not c["ok"]}
    assert res["passed"], failed
    r = res["temperatures"]["1.0"]
    for g, e in r["groups"].items():
        assert e["n"] == PER_GROUP and e["p"] > P_MIN, (g, e)
    for g in DRAFTING:  # every drafting source was verified with a q hand-off, and the mismatched q was caught
        assert r["groups"][g]["with_q"] > 0 and r["groups"][g]["control_p"] < P_MIN, (g, r["groups"][g])
    assert r["cross_lookups"] > 0 and r["greedy_identical"] == [PER_GROUP, PER_GROUP]
    assert {c["name"] for c in res["checks"]} >= {"mixed_control_caught:T1.0", "mixed_same_distribution:T1.0",
                                                   "mixed_verified_with_q:T1.0", "mixed_greedy_identical:T1.0"}
