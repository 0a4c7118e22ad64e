# SPDX-License-Identifier: Apache-2.0
"""vLLM's own serving benchmark against our server (issue 63 item 5; the commands: docs/BENCHMARKS-VLLM.md).

`vllm serve` runs the tiny pair with our default config (`{"method": "dflash", "model": "<tiny pair>/draft-b8"}`:
adaptive drafting); `vllm bench serve` drives it as a user would (openai-chat, 16 prompts in the ShareGPT form that
`vllm-dflash bench --export-prompts` writes, 4 in flight, greedy) and saves its JSON. `vllm bench serve` scrapes
/metrics before and after the run and sums every `vllm:spec_decode*_total` line; our `vllm_dflash:` series on the
same page, labelled by `source`, must not enter its figures. Its acceptance rate, acceptance length, drafts, draft
and accepted tokens and per-position rates must equal those of vLLM's counters over the same run, scraped by the
test before and after, and its output tokens over our request-steps must be the tokens per forward of our series."""
import json
import os
import subprocess
import time

import pytest

from vllm_dflash.bench import stats
from vllm_dflash.bench.run import export_prompts
from vllm_dflash.serve.server import Server, vllm_executable

pytestmark = pytest.mark.vllm
CONCURRENCY, MAX_TOKENS = 4, 48
# plain ASCII, which the tiny target's byte-level vocabulary reads token for token: code and prose, some repeating
# themselves (prompt lookup finds continuations)
PROMPTS = ["def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i)\n",
           "the cat sat on the mat. the cat sat on the mat.", "import os\nimport sys\n\nclass Config:\n",
           "hello world, hello world, hello", "a b c d e f g h i j k", "x = [1, 2, 3, 4, 5]\ny = [",
           "while True:\n    line = input()\n", "one two three four five six", "def parse_args(argv):\n    ",
           "if x > 0:\n    return x\nelse:\n", "the quick brown fox jumps over", "print('hello')\nprint('hello')\n",
           "class Point:\n    def __init__(self, x, y):\n", "total = 0\nfor n in nums:\n",
           "red green blue red green blue"]


def _settled(srv: Server, timeout: float = 60.0) -> dict[str, float]:
    """A scrape once no request runs and vLLM's and our counters held still over a second (ours reach /metrics
    within half a second of vLLM's)."""
    prev, deadline = None, time.time() + timeout
    while time.time() < deadline:
        m = srv.metrics()
        cur = {k: v for k, v in m.items() if k.startswith(("vllm:", "vllm_dflash:")) and "_total" in k}
        if cur == prev and not m.get("vllm:num_requests_running"):
            return m
        prev = cur
        time.sleep(1.0)
    raise TimeoutError("the server's counters did not settle")


def _bench_serve(srv: Server, dataset, target: str, out_dir) -> subprocess.CompletedProcess:
    cmd = vllm_executable() + [
        "bench", "serve", "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
        "--port", str(srv.port), "--model", "target", "--tokenizer", target,
        "--dataset-name", "sharegpt", "--dataset-path", str(dataset), "--disable-shuffle",
        "--sharegpt-output-len", str(MAX_TOKENS), "--num-prompts", str(len(PROMPTS)),
        "--max-concurrency", str(CONCURRENCY), "--temperature", "0", "--disable-tqdm",
        "--save-result", "--result-dir", str(out_dir), "--result-filename", "result.json"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=out_dir,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_vllm_bench_serve_reports_our_acceptance(pair, tmp_path):
    prompts, dataset = tmp_path / "prompts.jsonl", tmp_path / "prompts.json"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    export_prompts(str(prompts), str(dataset))  # `vllm-dflash bench --export-prompts prompts.jsonl prompts.json`
    target = str(pair / "target")
    srv = Server(target, speculative_config={"method": "dflash", "model": str(pair / "draft-b8")},
                 log_path=str(tmp_path / "serve.log"), max_model_len=1024, dtype="float32",
                 env={"OMP_NUM_THREADS": "1"})
    srv.start(timeout=400)
    try:
        t0 = time.time()
        before = _settled(srv)
        r = _bench_serve(srv, dataset, target, tmp_path)
        assert r.returncode == 0, f"vllm bench serve failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        after = _settled(srv)
        print(f"vllm bench serve and the scrapes: {time.time() - t0:.0f} s")
    finally:
        srv.stop()
    res = json.loads((tmp_path / "result.json").read_text())
    sd, ad = stats.spec_decode_delta(before, after), stats.adaptive_delta(before, after)
    assert res["completed"] == len(PROMPTS) and res["failed"] == 0, res.get("errors")
    # our labelled series moved during the run too, and none of them entered vLLM bench's sums
    assert ad is not None and ad["request_steps"] > 0 and sum(ad["accepted_tokens"].values()) > 0, ad
    assert res["spec_decode_num_drafts"] == sd["drafts"] > 0
    assert res["spec_decode_draft_tokens"] == sd["draft_tokens"] > 0
    assert res["spec_decode_accepted_tokens"] == sd["accepted"] > 0
    assert res["spec_decode_acceptance_rate"] == pytest.approx(100 * sd["draft_acceptance_rate"])
    assert res["spec_decode_acceptance_length"] == pytest.approx(sd["tau"]) and sd["tau"] > 1
    assert res["spec_decode_per_position_acceptance_rates"] == pytest.approx(sd["per_position_rate"])
    # the same run on both sides: its output tokens are vLLM's generated tokens, which over our request-steps give
    # our tokens per forward
    assert res["total_output_tokens"] == sd["generated_tokens"]
    tokens_per_forward = res["total_output_tokens"] / sd["request_steps"]
    assert tokens_per_forward == pytest.approx(sd["tokens_per_forward"]) and tokens_per_forward > 1
    assert "Acceptance length:" in r.stdout and f"{sd['tau']:.2f}" in r.stdout, r.stdout[-2000:]
