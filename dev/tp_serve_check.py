# SPDX-License-Identifier: Apache-2.0
"""`vllm serve` at TP=2 over Ray with our drafter returns the TP=1 greedy text (issue #17's end-to-end check).

    python scripts/make_tp_pair.py /tmp/tp-pair        # the tiny 4 q / 2 kv pair (~1-2 min), once
    RAY_agent_register_timeout_ms=300000 python dev/tp_serve_check.py /tmp/tp-pair [ray|mp]

Starts `vllm serve` twice on loopback (float32, eager): TP=1 without speculation, then TP=2 with the given executor
and our DFlash drafter (adaptive, the default), sends the same greedy completions (token-id prompts) to both and
compares the texts; prints vLLM's τ and our request-step counters of the TP=2 run. Exit 0 when identical."""
import json
import random
import sys
import urllib.request
from pathlib import Path

from vllm_dflash.serve.server import Server
from vllm_dflash.serve.tau import spec_decode


def complete(url: str, prompt: list[int], max_tokens: int = 48) -> list[int]:
    body = {"model": "target", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "return_token_ids": True}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        ch = json.loads(r.read())["choices"][0]
    return ch.get("token_ids") or ch["text"]


def run(pair: Path, prompts, tp: int, backend: str | None, spec: dict | None, log: str):
    extra = ["--tensor-parallel-size", str(tp)] + (["--distributed-executor-backend", backend] if backend else [])
    env = {"VLLM_CPU_OMP_THREADS_BIND": "0|1" if tp == 2 else "0", "OMP_NUM_THREADS": "1"}
    with Server(str(pair / "target"), speculative_config=spec, extra_args=extra, env=env, dtype="float32",
                enforce_eager=True, max_model_len=512, log_path=log).start(timeout=1200) as srv:
        before = srv.metrics()
        outs = [complete(srv.url, p) for p in prompts]
        return outs, spec_decode(srv.metrics(), before)


def main() -> int:
    pair = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tp-pair")
    backend = sys.argv[2] if len(sys.argv) > 2 else "ray"
    rng = random.Random(0)
    prompts = [[rng.randrange(4, 384) for _ in range(12)] for _ in range(3)]
    ref, _ = run(pair, prompts, 1, None, None, "/tmp/tp_serve_tp1.log")
    spec = {"method": "dflash", "model": str(pair / "draft")}
    got, sd = run(pair, prompts, 2, backend, spec, f"/tmp/tp_serve_tp2_{backend}.log")
    same = sum(a == b for a, b in zip(ref, got))
    print(json.dumps({"backend": backend, "identical": f"{same}/{len(prompts)}", "tau": sd["tau"],
                      "drafts": sd["drafts"], "accepted": sd["accepted"], "request_steps": sd["request_steps"],
                      "tokens_per_forward": sd["tokens_per_forward"]}))
    return 0 if same == len(prompts) else 1


if __name__ == "__main__":
    sys.exit(main())
