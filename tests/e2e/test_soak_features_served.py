# SPDX-License-Identifier: Apache-2.0
"""The served feature check (vllm_dflash/bench/soak/features.py, `vllm-dflash soak --features-check`) on the tiny
pair, float32: stock vLLM (our plugin not loaded) and the default DFlash config, side by side, give the same greedy
tokens for every request feature, valid n=2 samples, the same status for an over-long prompt, and our server is
healthy afterwards (marked vllm, ~1.5 min on 2 cores). The verdict logic is unit-tested without vLLM in
tests/unit/test_soak_features.py."""
import json
import subprocess
import sys

import pytest


@pytest.mark.vllm
def test_features_check_tiny_pair(pair, tmp_path):
    """Every check of the feature check passes; the stock server really ran without our plugin; each feature case
    ran (greedy ones identical, not merely near-ties: float32)."""
    out = tmp_path / "features.json"
    proc = subprocess.run([sys.executable, "-m", "vllm_dflash.bench.soak", "--features-check",
                           "--target", str(pair / "target"), "--draft", str(pair / "draft-b8"),
                           "--max-model-len", "512", "--dtype", "float32", "--out", str(out),
                           "--log", str(tmp_path / "serve.log")], capture_output=True, text=True, timeout=600)
    assert out.exists(), f"no JSON (exit {proc.returncode}): {proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    res = json.loads(out.read_text())
    failed = {c["name"]: c["detail"] for c in res["checks"] if not c["ok"]}
    assert not failed, failed
    assert proc.returncode == 0
    assert res["meta"]["plugin_loaded"] == {"stock": False, "dflash": True}
    cases = {c["name"]: c for c in res["cases"]}
    for name in ("logprobs", "penalties", "repetition_penalty", "stop", "json_schema", "regex", "max_tokens_1",
                 "min_tokens", "prompt_logprobs", "near_max_model_len"):
        assert cases[name]["ok"] and "first_difference" not in cases[name], cases[name]
    assert cases["too_long_prompt"]["ours_status"] == cases["too_long_prompt"]["stock_status"] == 400
    assert cases["stop"]["finish_reason"] == "stop"
