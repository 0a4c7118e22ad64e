# SPDX-License-Identifier: Apache-2.0
"""Serving benchmark end to end (split from tests/unit/test_bench_serving.py, which checks its maths without vLLM):
benchmarks/bench_serving.py --quick on the tiny pair (none, ours-fixed: the paper's fixed block, and ours: our
default, adaptive drafting; concurrency 1) through real `vllm serve` instances, JSON asserted."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the repository (benchmarks/bench_serving.py runs from there)


@pytest.mark.vllm
@pytest.mark.slow  # two server starts: 3.5-6.5 min here; CI runs -m "not slow"
def test_bench_quick_tiny_pair(pair, tmp_path):
    """The quick mode end to end: real servers, streaming clients, JSON/markdown/PNGs; our drafter accepts drafts
    and its greedy outputs equal those of stock vLLM without speculation (`none`: the plugin not loaded)."""
    cmd = [sys.executable, "benchmarks/bench_serving.py", "--quick", "--target", str(pair / "target"),
           "--draft", str(pair / "draft-b8"), "--configs", "none,ours-fixed,ours", "--concurrency", "1",
           "--prompt-sets", "humaneval", "--max-tokens", "32", "--max-model-len", "1024", "--kv-cache-gib", "1",
           "--out-dir", str(tmp_path), "--name", "tiny", "--log-dir", str(tmp_path / "logs"), "--enforce-eager"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "tiny.json").read_text())
    assert res["configs"]["ours"]["status"] == "ok"
    runs = {r["config"]: r for r in res["runs"]}
    assert set(runs) >= {"none", "ours-fixed", "ours"} and all(r["ok"] for r in res["runs"])
    ad = runs["ours"]
    assert ad["vs_baseline"]["identical"] == ad["vs_baseline"]["compared"] == 2
    assert ad["adaptive"]["request_steps"] > 0 and abs(sum(ad["adaptive"]["share"].values()) - 1) < 1e-9
    none, fixed = runs["none"], runs["ours-fixed"]  # the fixed block: every step verifies all 7 drafts
    assert none["output_tokens"] > 0 and none["output_tokens"] == none["server_generation_tokens"]
    assert none["spec_decode"] is None and none["speedup"] == 1.0
    sd = fixed["spec_decode"]
    assert sd["drafts"] > 0 and sd["tau"] > 1.0 and len(sd["per_position_rate"]) == 7
    assert sd["per_position_rate"][0] >= sd["per_position_rate"][-1]  # a prefix rule: later positions accept less
    assert fixed["speedup"] > 0 and fixed["ttft_ms"]["p50"] > 0 and fixed["tpot_ms"]["p99"] > 0
    assert fixed["vs_baseline"]["compared"] == 2
    assert fixed["vs_baseline"]["identical"] == 2, fixed["vs_baseline"]["mismatches"]
    assert res["losslessness"]["mismatches"] == 0
    # compared on the servers' token ids (kept out of the stored runs), every configuration's forward timed
    assert all("token_ids" not in r for r in res["runs"])
    assert fixed["exactness"]["compared"] == fixed["exactness"]["identical"] == 2
    # `none` is stock vLLM: the plugin is not loaded in its server (so nothing times its forward); ours is timed
    assert "vllm_dflash" not in res["configs"]["none"]["env"]["VLLM_PLUGINS"].split(",")
    assert none["time_split_s"] is None and none["adaptive"] is None
    assert fixed["time_split_s"]["target_forward"] > 0 and fixed["time_split_s"]["target_forwards"] > 0
    assert any(k.endswith("/main") for k in none["server_threads_cpu_s"]), none["server_threads_cpu_s"]
    assert res["meta"]["layout"]["omp_num_threads"] == 1 and res["configs"]["ours-fixed"]["processes"]
    assert res["meta"]["schema"] == 2
    # quick: one wave; every wave emptied the server's prefix cache first (/reset_prefix_cache answered, or it raised)
    assert res["meta"]["waves"] == 1 and res["meta"]["prompts_per_run"] == {"1": 2}
    for f in ("tiny.md", "tiny-speedup.png", "tiny-acceptance.png"):
        assert (tmp_path / f).stat().st_size > 0
    assert "| humaneval | 1 | ours |" in (tmp_path / "tiny.md").read_text()
    assert "| humaneval | 1 | ours-fixed |" in (tmp_path / "tiny.md").read_text()
