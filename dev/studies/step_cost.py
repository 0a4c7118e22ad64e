# SPDX-License-Identifier: Apache-2.0
"""Target step cost against query tokens, compiled, as vLLM runs it: where verification turns compute-bound.

    python dev/studies/step_cost.py --out dev/results/step_cost      # JSON + markdown + PNG

One in-process engine (vLLM's defaults: torch.compile, the machine's fastest dtype, OMP_NUM_THREADS as set, 1 by
default like the serving benchmark's worker). For n query tokens it times the compiled target forward
(`_dummy_run(n)`, the runner's own warm-up path) and the logits of all n rows (what a verify step computes), median
of --repeats. Beside it, the bound of bench/limit.py from the measured read bandwidth and GEMM rate. Speculation can
only pay while verifying n = c * (1 + k) tokens costs little more than c: the 'knee' is the n where the step costs
20 % more than one token."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="1,2,4,8,12,16,24,32,48,64,96,128,192,256")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--dtype", default=None, help="default: the machine's fastest (bfloat16 with avx512_bf16)")
    ap.add_argument("--out", default="dev/results/step_cost")
    a = ap.parse_args()

    import torch
    from tqdm import tqdm
    from vllm import LLM

    from vllm_dflash.bench import limit
    from vllm_dflash.target import resolve_target
    from vllm_dflash.utils import default_dtype

    dtype = a.dtype or default_dtype()
    target = resolve_target(None)
    threads = int(os.environ["OMP_NUM_THREADS"])
    size = limit.model_size(target, getattr(torch, dtype))
    hw = limit.measure_hardware(threads, getattr(torch, dtype), size.hidden, size.intermediate)
    llm = LLM(model=str(target), dtype=dtype, max_model_len=2048, max_num_seqs=256, seed=0)
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    ns = [int(x) for x in a.tokens.split(",")]
    rows = []
    for n in tqdm(ns, desc="query tokens"):
        fwd, full = [], []
        for _ in range(a.repeats + 1):
            t0 = time.perf_counter()
            hidden, _ = runner._dummy_run(n)
            t1 = time.perf_counter()
            runner.model.compute_logits(hidden[:n])
            t2 = time.perf_counter()
            fwd.append(t1 - t0)
            full.append(t2 - t0)
        fwd, full = fwd[1:], full[1:]  # the first call of a new size may compile or allocate
        bound = limit.limit_tok_s(hw, size, n, 1.0, 1.0)
        rows.append({"tokens": n, "forward_ms": 1e3 * statistics.median(fwd),
                     "verify_ms": 1e3 * statistics.median(full),
                     "bound_ms": max(bound["memory_step_ms"], bound["compute_step_ms"]), "bound": bound["bound"]})
    base = rows[0]["verify_ms"]
    knee = next((r["tokens"] for r in rows if r["verify_ms"] > 1.2 * base), None)
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "?")
    flags = Path("/proc/cpuinfo").read_text()
    kind = "avx512_bf16" if "avx512_bf16" in flags else ("avx2" if "avx2" in flags else "other")
    import importlib.metadata as md
    result = {"meta": {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cpu": cpu, "cpu_kind": kind,
                       "cores": os.cpu_count(), "threads": threads, "dtype": dtype, "torch_threads":
                       torch.get_num_threads(), "compiled": True, "target": str(target),
                       "versions": {"vllm": md.version("vllm"), "torch": md.version("torch")},
                       "command": "python dev/studies/step_cost.py", **limit.hardware_record(hw, size)},
              "rows": rows, "knee_tokens": knee}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    lines = [f"# Target step cost against query tokens ({cpu}, {kind}, {threads} thread(s), {dtype}, compiled)", "",
             f"Read bandwidth {hw.read_gb_s:.1f} GB/s, GEMM {hw.gemm_tflops * 1e3:.0f} GFLOP/s; target "
             f"{size.params / 1e6:.1f} M parameters. Knee (verify step 20 % above one token): "
             f"{knee if knee else 'beyond the range'} tokens.", "",
             "| query tokens | forward ms | forward + logits ms | ms per token | bound ms (side) | of bound |",
             "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['tokens']} | {r['forward_ms']:.1f} | {r['verify_ms']:.1f} | "
                     f"{r['verify_ms'] / r['tokens']:.2f} | {r['bound_ms']:.1f} ({r['bound']}) | "
                     f"{100 * r['bound_ms'] / r['verify_ms']:.0f} % |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(ns, [r["verify_ms"] for r in rows], "o-", label="forward + logits (measured)")
        ax.plot(ns, [r["forward_ms"] for r in rows], "s--", label="forward only (measured)")
        ax.plot(ns, [r["bound_ms"] for r in rows], ":", label="hardware bound (bench/limit.py)")
        ax.set(xscale="log", xlabel="query tokens in the step", ylabel="ms",
               title=f"Target step cost, {kind}, {threads} thread(s), {dtype}, compiled")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out.with_name(out.name + ".png"), dpi=110)
    except ImportError:
        pass
    print("\n".join(lines))


if __name__ == "__main__":
    main()
