# SPDX-License-Identifier: Apache-2.0
"""`vllm serve` with our drafter (default multi-process layout: API server, engine core, worker):
completions and chat, streaming and not, greedy output equal to vLLM without speculation, an aborted
stream that leaves the server healthy, and our metrics on /metrics from the worker processes (with the target
forward timed, VLLM_DFLASH_PROFILE=1)."""
import os
import signal
import time

import pytest

from vllm_dflash.serve.server import Server
from support.vllm_helpers import run_vllm

pytestmark = pytest.mark.vllm
PROMPTS = ["def parse_args(argv):\n    ", "import os\nimport sys\n\nclass Config:", "for i in range(10):\n    print("]


def test_serve_end_to_end(pair, tmp_path):
    from openai import OpenAI

    target = str(pair / "target")
    (base,) = run_vllm([{"model": target, "prompts": PROMPTS, "max_tokens": 32, "ignore_eos": False}])
    spec = {"method": "dflash", "model": str(pair / "draft-b8"), "num_speculative_tokens": 7, "adaptive": False}
    srv = Server(target, speculative_config=spec, log_path=str(tmp_path / "serve.log"), max_model_len=1024, dtype="float32",
                 env={"OMP_NUM_THREADS": "1", "VLLM_DFLASH_PROFILE": "1"})
    srv.start(timeout=400)
    try:
        client = OpenAI(base_url=srv.url + "/v1", api_key="none")
        texts = [client.completions.create(model="target", prompt=p, max_tokens=32, temperature=0).choices[0].text
                 for p in PROMPTS]
        assert texts == base["texts"]
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model="target", prompt=PROMPTS[0], max_tokens=32, temperature=0, stream=True))
        assert streamed == texts[0]
        msgs = [{"role": "user", "content": "Write a loop."}]
        chat = client.chat.completions.create(model="target", messages=msgs, max_tokens=24, temperature=0)
        chat_stream = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="target", messages=msgs, max_tokens=24, temperature=0, stream=True))
        assert chat.choices[0].message.content == chat_stream and chat.usage.completion_tokens > 0
        # a client that disconnects mid-stream: the request is aborted, its blocks freed
        stream = client.completions.create(model="target", prompt=PROMPTS[1], max_tokens=200, temperature=0, stream=True)
        for i, _ in enumerate(stream):
            if i == 2:
                break
        stream.response.close()
        time.sleep(1.0)
        again = client.completions.create(model="target", prompt=PROMPTS[2], max_tokens=32, temperature=0).choices[0].text
        assert again == base["texts"][2]
        time.sleep(1.0)  # metric snapshots flush every 0.5 s
        m = srv.metrics()
        assert m["vllm:spec_decode_num_draft_tokens_total"] > 0
        assert m["vllm:spec_decode_num_accepted_tokens_total"] > 0
        assert m["vllm_dflash:draft_forward_seconds_count"] > 0, "worker-side metrics missing on /metrics"
        assert m["vllm_dflash:kv_injection_seconds_count"] > 0
        # VLLM_DFLASH_PROFILE=1: every target forward timed in the worker (one per step, prefill included)
        assert m["vllm_dflash:target_forward_seconds_count"] >= m["vllm_dflash:draft_forward_seconds_count"] > 0
        assert m["vllm_dflash:target_forward_seconds_sum"] > 0
        assert m["vllm_dflash:accepted_tokens_per_step_count"] > 0, "engine-core metrics missing on /metrics"
        assert m["vllm_dflash:block_size"] == 8 and m["vllm_dflash:diffusion_steps"] == 1
        assert m.get("vllm:num_requests_running", 0) == 0
        assert m.get("vllm:kv_cache_usage_perc", 0) == 0
        log = (tmp_path / "serve.log").read_text()
        assert "our DFlash drafter is active" in log
    finally:
        pid = srv.proc.pid
        srv.stop()
    assert srv.proc.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


def test_a_restart_with_a_fixed_metrics_dir_counts_only_its_own_steps(pair, tmp_path):
    """DFLASH_METRICS_DIR fixed by the user outlives a server: the next server's /metrics must not add the previous
    server's counters. Each server writes into a folder of its own inside it (issue 51 item 9), removed at exit."""
    from openai import OpenAI

    target = str(pair / "target")
    spec = {"method": "dflash", "model": str(pair / "draft-b8"), "num_speculative_tokens": 7, "adaptive": False}
    fixed = tmp_path / "metrics"
    counts, files = [], []
    for run in range(2):
        srv = Server(target, speculative_config=spec, log_path=str(tmp_path / f"serve{run}.log"), max_model_len=512,
                     dtype="float32", env={"OMP_NUM_THREADS": "1", "DFLASH_METRICS_DIR": str(fixed)})
        srv.start(timeout=400)
        try:
            client = OpenAI(base_url=srv.url + "/v1", api_key="none")
            client.completions.create(model="target", prompt=PROMPTS[0], max_tokens=24, temperature=0)
            time.sleep(1.5)  # metric snapshots flush every 0.5 s
            m = srv.metrics()
            counts.append((m["vllm_dflash:draft_steps_total"], m["vllm:spec_decode_num_drafts_total"]))
            files.append(sorted(str(p.relative_to(fixed)) for p in fixed.rglob("proc-*.json")))
        finally:
            srv.stop()
    assert counts[0][0] > 0 and counts[1][0] > 0
    assert counts[1][0] == counts[0][0], f"the second server's count includes the first's: {counts}"
    assert files[0] and files[1] and not set(files[0]) & set(files[1]), f"the first server's snapshots remain: {files}"
    assert not list(fixed.rglob("proc-*.json")), "a stopped server left its folder"
