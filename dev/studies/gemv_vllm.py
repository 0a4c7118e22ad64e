#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""Decode step time of the target inside vLLM with DFLASH_CPU_GEMV off and on (the in-model check of the kernel that
dev/studies/gemv.py measures in isolation).

    python dev/studies/gemv_vllm.py                       # eager and compiled, off / 8 rows, batch 1 and 8
    python dev/studies/gemv_vllm.py --modes compiled --repeats 2

Each (mode, setting) runs in a fresh process: offline `LLM` (bf16, worker in-process, OMP threads bound to every core
as the bench does), one warm-up generation, then 96 greedy tokens for 1 and for 8 requests; ms per decode step =
wall time / 96. Settings alternate within each repeat so drift of the machine (shared memory bandwidth) hits both.
Results: dev/results/gemv_vllm.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, os, sys, time
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
llm = LLM(model=sys.argv[1], dtype="bfloat16", enforce_eager=sys.argv[2] == "eager", max_model_len=1024,
          max_num_seqs=16, seed=0)
out = {}
for bs in (1, 8):
    prompts = [TokensPrompt(prompt_token_ids=list(range(100 + i, 140 + i))) for i in range(bs)]
    sp = SamplingParams(temperature=0, max_tokens=96, ignore_eos=True)
    llm.generate(prompts, sp, use_tqdm=False)
    t = time.perf_counter()
    llm.generate(prompts, sp, use_tqdm=False)
    out[f"bs{bs}"] = (time.perf_counter() - t) / 96 * 1e3
print("RESULT " + json.dumps(out), flush=True)
"""


def run_one(target: str, mode: str, gemv: str, threads: int) -> dict[str, float]:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
           "OMP_NUM_THREADS": str(threads), "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
           "DFLASH_CPU_GEMV": gemv}
    r = subprocess.run([sys.executable, "-c", CHILD, target, mode], env=env, capture_output=True, text=True)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"gemv_vllm: {mode}/{gemv} failed:\n{r.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def main() -> int:
    from vllm_dflash.ops.gemv import gemv_supported
    from vllm_dflash.target import cache_root
    from vllm_dflash.utils import cpu_kind

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default=str(cache_root() / "SmolLM2-135M-Instruct"))
    p.add_argument("--modes", default="eager,compiled")
    p.add_argument("--rows", default="8", help="the DFLASH_CPU_GEMV value compared with off")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" / "gemv_vllm"))
    a = p.parse_args()
    if not gemv_supported():
        raise SystemExit("gemv_vllm: the kernel needs avx512_bf16 (and the built extension); nothing to compare here")
    cpu = cpu_kind()
    runs = []
    for rep in range(a.repeats):
        for mode in a.modes.split(","):
            for gemv in (("off", a.rows) if rep % 2 == 0 else (a.rows, "off")):
                res = run_one(a.target, mode, gemv, a.threads)
                runs.append({"repeat": rep, "mode": mode, "cpu_gemv": gemv, **res})
                print(runs[-1], flush=True)
    rows = ["| mode | batch | off ms/step | ours ms/step | ours / off |", "|---|---|---|---|---|"]
    for mode in a.modes.split(","):
        for bs in ("bs1", "bs8"):
            off = statistics.median(r[bs] for r in runs if r["mode"] == mode and r["cpu_gemv"] == "off")
            on = statistics.median(r[bs] for r in runs if r["mode"] == mode and r["cpu_gemv"] == a.rows)
            rows.append(f"| {mode} | {bs[2:]} | {off:.1f} | {on:.1f} | {on / off:.2f} |")
    meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cpu": cpu, "cores": os.cpu_count(),
            "threads": a.threads, "command": "python " + " ".join(sys.argv), "target": a.target}
    Path(a.out + ".json").write_text(json.dumps({"gemv_vllm": meta, "measurements": runs}, indent=1) + "\n")
    md = [f"# DFLASH_CPU_GEMV inside vLLM ({meta['started']})", "",
          f"{cpu}; {a.threads} threads bound to the in-process worker, bf16, 96 greedy tokens; median of "
          f"{a.repeats} repeat(s); `{meta['command']}`", "", *rows, ""]
    Path(a.out + ".md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
