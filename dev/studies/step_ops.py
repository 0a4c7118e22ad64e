# SPDX-License-Identifier: Apache-2.0
"""Where one decode step of the target goes, op by op, at batch 1 without speculation (vLLM's defaults: compiled).

    VLLM_CPU_KVCACHE_SPACE=2 VLLM_CPU_OMP_THREADS_BIND=0-1 OMP_NUM_THREADS=2 \\
        python dev/studies/step_ops.py --out dev/results/step_ops        # JSON + markdown

Offline `LLM` in process (VLLM_ENABLE_V1_MULTIPROCESSING=0), greedy, one prompt, `--tokens` decode steps under
torch.profiler (CPU activities, shapes recorded). Every op's self CPU time is put in one group: the target's linear
layers per weight shape (with the weight read rate each reaches: weight bytes / time per call), attention, the KV-cache
write, the compiled graph's own kernels (norms, rotary, activation, residuals: inductor's C++), the sampler's argmax,
and the rest (input preparation, scheduling, bookkeeping). Beside it, the machine's streaming read rate and the step's
memory bound as the benchmark's limit column computes them (vllm_dflash/bench/limit.py): the question it answers is
how far a step without speculation is from that bound, and which part of the step holds the gap. Profiling adds its
own cost per op (the step is slower under it: both wall times are recorded)."""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

ENV = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS")  # recorded with the command
GEMM_OPS = ("_C::onednn_mm", "_C::weight_packed_linear", "aten::mm", "aten::addmm", "aten::linear",
            "vllm_dflash::linear_bf16", "vllm_dflash::linear_f32", "vllm_dflash::gemm_f32")
GROUPS = {  # op name -> group (ops not listed: "other host and glue ops")
    "vllm::unified_attention_with_output": "attention (vLLM's custom-op wrapper)",
    "_C::cpu_attention_with_kv_cache": "attention (kernel)",
    "vllm::unified_kv_cache_update": "KV-cache write (vLLM's custom-op wrapper)",
    "_C::cpu_attn_reshape_and_cache": "KV-cache write (kernel)",
    "## Call CompiledFxGraph None ##": "compiled graph's own kernels (norms, rotary, activation, residual)",
    "aten::argmax": "sampler argmax",
}


def _weight_shape(op: str, shapes: list) -> tuple[int, int] | None:
    """(out, in) of a linear call's weight from the op's recorded input shapes (None when they do not say)."""
    try:
        if op == "_C::onednn_mm":  # (out [M, N], x [M, K], bias, handle): the weight hides in the handle
            return shapes[0][1], shapes[1][1]
        if op == "_C::weight_packed_linear":  # (out, x, W [N, K], ...)
            return tuple(shapes[2])
        if op == "aten::linear":  # (x [M, K], W [N, K], ...)
            return tuple(shapes[1])
        if op == "vllm_dflash::linear_bf16":  # (x [M, K], packed [N / 32, 32 K], n, ...): N rounded up to 32
            return shapes[1][0] * 32, shapes[0][1]
        if op in ("vllm_dflash::linear_f32", "vllm_dflash::gemm_f32"):  # (x [M, K], packed [N / 16, 16 K], n, ...)
            return shapes[1][0] * 16, shapes[0][1]
        if op == "aten::mm":  # (x [M, K], W.T [K, N])
            return shapes[1][1], shapes[1][0]
        if op == "aten::addmm":  # (bias, x [M, K], W.T [K, N])
            return shapes[2][1], shapes[2][0]
    except (IndexError, TypeError, ValueError):
        pass
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=64, help="decode steps profiled")
    ap.add_argument("--dtype", default="auto", help="bfloat16, float32, or auto (vllm_dflash.utils.default_dtype: bf16 where the CPU has it)")
    ap.add_argument("--out", default="dev/results/step_ops", help="output path without extension")
    a = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile
    from vllm import LLM, SamplingParams

    from vllm_dflash.bench import limit
    from vllm_dflash.target import resolve_target
    from vllm_dflash.utils import cpu_kind, default_dtype

    dtype = a.dtype if a.dtype != "auto" else default_dtype()
    tdtype = getattr(torch, dtype)
    target = resolve_target(None)
    threads = torch.get_num_threads()
    size = limit.model_size(target, tdtype)
    hw = limit.measure_hardware(threads, tdtype, size.hidden, size.intermediate)
    llm = LLM(model=str(target), dtype=dtype, max_model_len=2048, max_num_seqs=8, seed=0)
    sp = SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True)
    prompt = ["Write a Python function that checks whether a number is prime."]
    for _ in range(2):
        llm.generate(prompt, sp, use_tqdm=False)  # warm: compile, oneDNN primitives, KV blocks
    t = time.perf_counter()
    llm.generate(prompt, sp, use_tqdm=False)
    step_ms = (time.perf_counter() - t) / a.tokens * 1e3
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        t = time.perf_counter()
        llm.generate(prompt, sp, use_tqdm=False)
        prof_step_ms = (time.perf_counter() - t) / a.tokens * 1e3

    width = torch.empty((), dtype=tdtype).element_size()
    groups: dict[str, float] = defaultdict(float)  # group -> self CPU µs over the run
    gemms: dict[tuple[int, int], dict[str, float]] = {}
    for ev in prof.key_averages(group_by_input_shape=True):
        us = ev.self_cpu_time_total
        if ev.key in GEMM_OPS:
            shape = _weight_shape(ev.key, ev.input_shapes)
            if shape is not None:
                g = gemms.setdefault(shape, {"calls": 0, "us": 0.0, "op": ev.key})
                g["calls"] += ev.count
                g["us"] += us
            groups["linear layers (GEMM)"] += us
        else:
            groups[GROUPS.get(ev.key, "other host and glue ops")] += us
    total_us = sum(groups.values())
    rows = []
    for (n, k), g in sorted(gemms.items(), key=lambda kv: -kv[1]["us"]):
        per_call = g["us"] / g["calls"]
        rows.append({"weight": [n, k], "op": g["op"], "calls_per_step": g["calls"] / a.tokens,
                     "ms_per_step": g["us"] / a.tokens / 1e3, "us_per_call": per_call,
                     "read_gb_s": n * k * width / (per_call * 1e-6) / 1e9})
    bound = limit.limit_tok_s(hw, size, 1, 1.0, 1.0)
    result = {
        "machine": {"cpu": cpu_kind(), "cores": os.cpu_count(), "platform": platform.platform(),
                    "l3_bytes": limit.l3_bytes()},
        "dtype": dtype, "threads": threads, "tokens": a.tokens,
        "hardware": {"read_gb_s": hw.read_gb_s, "gemm_tflops": hw.gemm_tflops},
        "model": {"params": size.params, "weight_bytes": size.weight_bytes},
        "memory_bound_step_ms": bound["memory_step_ms"], "step_ms": step_ms, "profiled_step_ms": prof_step_ms,
        "groups_ms_per_step": {k: v / a.tokens / 1e3 for k, v in sorted(groups.items(), key=lambda kv: -kv[1])},
        "profiled_cpu_ms_per_step": total_us / a.tokens / 1e3,
        "gemm": rows,
        "command": " ".join(f"{k}={os.environ[k]}" for k in ENV if k in os.environ)
                   + " python dev/studies/step_ops.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items()),
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(render(result))
    print(render(result))


def render(r: dict) -> str:
    gemm_ms = r["groups_ms_per_step"].get("linear layers (GEMM)", 0.0)
    lines = [
        "# Where one decode step goes", "",
        f"One decode step of the target at batch 1, no speculation, {r['dtype']}, compiled, {r['threads']} thread(s); "
        f"{r['machine']['cpu']}. Step {r['step_ms']:.1f} ms ({1e3 / r['step_ms']:.1f} tok/s), "
        f"{r['profiled_step_ms']:.1f} ms under the profiler. Memory bound: {r['model']['weight_bytes'] / 1e6:.0f} MB of "
        f"weights at the measured {r['hardware']['read_gb_s']:.1f} GB/s streaming read = "
        f"{r['memory_bound_step_ms']:.1f} ms, so the step runs at "
        f"{100 * r['memory_bound_step_ms'] / r['step_ms']:.0f} % of it; the linear layers alone take "
        + (f"{gemm_ms:.1f} ms ({100 * r['memory_bound_step_ms'] / gemm_ms:.0f} % of the bound's rate)." if gemm_ms
           else "no time (no linear op this script knows was called)."), "",
        "| part of the step (self CPU time, profiled) | ms per step | share |", "|---|---|---|"]
    tot = r["profiled_cpu_ms_per_step"]
    lines += [f"| {k} | {v:.2f} | {100 * v / tot:.0f} % |" for k, v in r["groups_ms_per_step"].items()]
    lines += ["", "| linear weight [out, in] | op | calls per step | µs per call | ms per step | weight read GB/s |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {g['weight']} | `{g['op']}` | {g['calls_per_step']:.0f} | {g['us_per_call']:.0f} | "
              f"{g['ms_per_step']:.2f} | {g['read_gb_s']:.1f} |" for g in r["gemm"]]
    lines += ["", f"Command: `{r['command']}`", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
