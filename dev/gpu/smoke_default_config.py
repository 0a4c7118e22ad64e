# SPDX-License-Identifier: Apache-2.0
"""GPU smoke test of the default DFlash configuration (issue 51 items 1 and 2): on a CUDA machine with vLLM 0.32 and
vllm_dflash installed, build the default config (`{"method": "dflash", "model": DRAFT}`, no other key), generate a
few greedy prompts with it and without speculation, and check:

- the engine starts (on CUDA vLLM turns async scheduling on for dflash; our default adaptive drafter runs
  synchronously, so the plugin turns it off and logs it);
- the V1 model runner is used (vLLM 0.32 defaults to Model Runner V2 on a GPU with Triton; the plugin names its
  drafter among V2's unsupported features) and the drafter in it is ours (`DFlashDrafter`);
- drafts are proposed and accepted, and the greedy tokens equal those without speculation (float32: exact; bf16:
  the first difference of each prompt is printed, near-ties are expected there);
- with `--served`, the same through `vllm serve` on 127.0.0.1 (completions API, greedy).

It cannot run on the development machine (CPU only; the lent GPU machine has no vLLM so far): it is written to be run
as soon as a GPU machine with vLLM is available:

    python dev/gpu/smoke_default_config.py --target TARGET --draft DRAFT [--dtype float32] [--served]

Exit status 0: every check passed; 1: a check failed (printed); the summary is one JSON line starting `SMOKE `.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Write a haiku about the sea.",
           "List three prime numbers greater than 100:"]


def offline(target: str, draft: str, dtype: str, max_tokens: int) -> dict:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the runner is reachable in this process
    from vllm import LLM, SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    out: dict = {}
    for name, spec in (("none", None), ("dflash", {"method": "dflash", "model": draft})):
        t0 = time.perf_counter()
        llm = LLM(model=target, dtype=dtype, speculative_config=spec, max_model_len=2048, disable_log_stats=False,
                  gpu_memory_utilization=0.5, seed=0)
        cfg = llm.llm_engine.vllm_config
        res = llm.generate(PROMPTS, sp, use_tqdm=False)
        run = {"tokens": [list(r.outputs[0].token_ids) for r in res], "s": round(time.perf_counter() - t0, 1),
               "v2_runner": bool(cfg.use_v2_model_runner),
               "async_scheduling": bool(cfg.scheduler_config.async_scheduling),
               "scheduler_cls": str(cfg.scheduler_config.scheduler_cls)}
        if spec is not None:
            runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
            run["drafter"] = type(getattr(runner, "drafter", None)).__name__
            counters = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
            run["drafted"] = counters.get("vllm:spec_decode_num_draft_tokens")
            run["accepted"] = counters.get("vllm:spec_decode_num_accepted_tokens")
        out[name] = run
        del llm
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()
    return out


def served(target: str, draft: str, dtype: str, max_tokens: int, port: int) -> dict:
    out = {}
    for name, spec in (("none", None), ("dflash", {"method": "dflash", "model": draft})):
        cmd = ["vllm", "serve", target, "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
               "--max-model-len", "2048", "--gpu-memory-utilization", "0.5"]
        if spec:
            cmd += ["--speculative-config", json.dumps(spec)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.time() + 600
            while time.time() < deadline:
                if proc.poll() is not None:
                    return {**out, name: {"error": f"server exited {proc.returncode}: {proc.stdout.read()[-4000:]}"}}
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                    break
                except OSError:
                    time.sleep(2)
            texts = []
            for p in PROMPTS:
                body = json.dumps({"model": target, "prompt": p, "max_tokens": max_tokens, "temperature": 0.0,
                                   "ignore_eos": True}).encode()
                req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                             {"Content-Type": "application/json"})
                texts.append(json.load(urllib.request.urlopen(req, timeout=300))["choices"][0]["text"])
            out[name] = {"texts": texts}
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    return out


def first_difference(a: list, b: list) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--served", action="store_true", help="also through `vllm serve` on 127.0.0.1")
    ap.add_argument("--port", type=int, default=8765)
    a = ap.parse_args()
    problems = []
    res = offline(a.target, a.draft, a.dtype, a.max_tokens)
    d, n = res["dflash"], res["none"]
    if d["v2_runner"]:
        problems.append("the DFlash engine runs on Model Runner V2 (our drafter is not used there)")
    if d.get("drafter") != "DFlashDrafter":
        problems.append(f"the runner's drafter is {d.get('drafter')}, not our DFlashDrafter")
    if not d.get("drafted") or not d.get("accepted"):
        problems.append(f"no drafts proposed or accepted: {d.get('drafted')} / {d.get('accepted')}")
    diffs = [first_difference(x, y) for x, y in zip(n["tokens"], d["tokens"])]
    if any(i is not None for i in diffs):
        (problems if a.dtype == "float32" else [])\
            .append(f"greedy tokens differ from no speculation at positions {diffs}")
        print(f"first differences per prompt (none vs dflash): {diffs}")
    summary = {"offline": {k: {x: y for x, y in v.items() if x != "tokens"} for k, v in res.items()},
               "first_differences": diffs}
    if a.served:
        s = served(a.target, a.draft, a.dtype, a.max_tokens, a.port)
        summary["served"] = s
        if any("error" in v for v in s.values()):
            problems.append(f"a server failed: {s}")
        elif a.dtype == "float32" and s["none"]["texts"] != s["dflash"]["texts"]:
            problems.append("served greedy texts differ from no speculation")
    summary["problems"] = problems
    print("SMOKE " + json.dumps(summary))
    for p in problems:
        print(f"FAILED: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
