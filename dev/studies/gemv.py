#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""bf16 GEMV micro-benchmark for decode-sized M: vLLM 0.32's CPU linear vs F.linear vs ours (csrc/gemv_cpu.cpp).

    python dev/studies/gemv.py                 # SmolLM2-135M shapes, M in {1,2,4,8,16}, 1 and 2 threads
    python dev/studies/gemv.py --quick         # fewer repeats

For each linear shape of SmolLM2-135M-Instruct (bf16) it times, per call:
  vllm     `layer.cpu_linear(x, layer.weight, None)` after vLLM's own `dispatch_cpu_unquantized_gemm(layer)`
           (which of sgl-kernel / oneDNN / F.linear it chose is recorded as `vllm_path`)
  flinear  torch.nn.functional.linear(x, W)
  ours     vllm_dflash.ops.gemv.gemv(x, pack_gemv_weight(W))  (Python checks included)
Weights are *cold*: each method cycles through enough distinct copies of the weight (>= 3x the L3 cache) that
every call streams its weight from DRAM, as in a real decode step (SmolLM2's ~270 MB of weights do not fit in
cache). `--hot` reuses one copy (cache-resident; flatters everything). Methods are interleaved: every repeat times
each method once (in rotated order), the reported number is the median over repeats. GB/s = N*K*2 bytes / time.
The `step` section times a whole decoder step's GEMMs in order (30 distinct layers x qkv, o, gate_up, down, then
lm_head) per method, the honest sum. Results: dev/results/gemv.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

SHAPES = {  # name: (N, K) of SmolLM2-135M (hidden 576, 9 q / 3 kv heads x 64, intermediate 1536, vocab 49152)
    "qkv": (960, 576),
    "o": (576, 576),
    "gate_up": (3072, 576),
    "down": (576, 1536),
    "lm_head": (49152, 576),
}
PER_STEP = {"qkv": 30, "o": 30, "gate_up": 30, "down": 30, "lm_head": 1}
METHODS = ("vllm", "flinear", "ours")
L3_BYTES = 32 << 20


def cpu_info() -> dict:
    model, flags = platform.processor(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    keep = ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16"]
    import vllm
    return {"model": model, "flags": [f for f in keep if f in flags], "torch": torch.__version__,
            "vllm": vllm.__version__, "cores": torch.get_num_threads()}


def vllm_layer(w: torch.Tensor) -> tuple[torch.nn.Module, str]:
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(w, requires_grad=False)
    dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    free = layer.cpu_linear.__code__.co_freevars
    path = "onednn" if "handler" in free else "sgl" if "packed_weight" in free else "zentorch" if "zen_weight" in free \
        else "F.linear"
    return layer, path


def make_calls(name: str, copies: int, with_bias: bool = False):
    """-> ({method: [callable(x) per copy]}, vllm_path)."""
    from vllm_dflash.ops.gemv import gemv, pack_gemv_weight
    N, K = SHAPES[name]
    calls: dict[str, list] = {m: [] for m in METHODS}
    path = "?"
    for c in range(copies):
        w = (torch.randn(N, K) / K ** 0.5).to(torch.bfloat16)  # [N, K]
        layer, path = vllm_layer(w)
        pw = pack_gemv_weight(w)
        calls["vllm"].append(lambda x, _l=layer: _l.cpu_linear(x, _l.weight, None))
        calls["flinear"].append(lambda x, _w=w: F.linear(x, _w))
        calls["ours"].append(lambda x, _p=pw: gemv(x, _p))
    return calls, path


def time_calls(fns: list, x: torch.Tensor, iters: int) -> list[float]:
    """µs of each call, cycling through fns. Callers take medians of single calls, not the mean of a loop: on a shared
    machine a call whose thread waits for a core (a whole scheduler slice, ~10 ms) would otherwise dominate."""
    n = len(fns)
    ts = []
    clock = time.perf_counter
    for i in range(iters):
        f = fns[i % n]
        t0 = clock()
        f(x)
        ts.append((clock() - t0) * 1e6)
    return ts


def bench_shapes(ms: list[int], threads: list[int], repeats: int, hot: bool, target_ms: float) -> list[dict]:
    rows = []
    for name, (N, K) in SHAPES.items():
        nbytes = N * K * 2
        copies = 1 if hot else max(2, -(-3 * L3_BYTES // nbytes))
        calls, path = make_calls(name, copies)
        for nt in threads:
            torch.set_num_threads(nt)
            for M in ms:
                x = torch.randn(M, K).to(torch.bfloat16)  # [M, K]
                for m in METHODS:  # warm-up (oneDNN primitive creation, page faults) and the iteration count
                    for f in calls[m]:
                        f(x)
                est = min(statistics.median(time_calls(calls[m], x, max(4, copies))) for m in METHODS)
                iters = max(copies, 15, int(target_ms * 1e3 / est))
                res: dict[str, list[float]] = {m: [] for m in METHODS}
                every: dict[str, list[float]] = {m: [] for m in METHODS}
                for r in range(repeats):
                    order = METHODS[r % 3:] + METHODS[:r % 3]
                    for m in order:
                        ts = time_calls(calls[m], x, iters)
                        res[m].append(statistics.median(ts))
                        every[m] += ts
                row = {"shape": name, "N": N, "K": K, "M": M, "threads": nt, "vllm_path": path, "copies": copies}
                for m in METHODS:
                    us = statistics.median(res[m])
                    row[f"{m}_us"] = round(us, 2)
                    row[f"{m}_gbps"] = round(nbytes / us / 1e3, 2)
                    # 10th percentile of single calls: the cost when nothing else took the core (shared machine)
                    row[f"{m}_p10_us"] = round(statistics.quantiles(every[m], n=10)[0], 2)
                row["speedup_vs_vllm"] = round(row["vllm_us"] / row["ours_us"], 3)
                rows.append(row)
                print(f"  {name:8s} M={M:2d} t={nt}  vllm({path}) {row['vllm_us']:9.1f} us {row['vllm_gbps']:6.1f} GB/s"
                      f" | F.linear {row['flinear_us']:9.1f} | ours {row['ours_us']:9.1f} us {row['ours_gbps']:6.1f}"
                      f" GB/s  x{row['speedup_vs_vllm']:.2f}", flush=True)
        del calls
    return rows


def bench_step(ms: list[int], threads: list[int], repeats: int) -> list[dict]:
    """A whole decoder step's GEMMs, in model order, with distinct weights for all 30 layers (cold by size)."""
    layers = []
    for _ in range(PER_STEP["qkv"]):
        per = {}
        for name in ("qkv", "o", "gate_up", "down"):
            c, _ = make_calls(name, 1)
            per[name] = c
        layers.append(per)
    head, _ = make_calls("lm_head", 1)
    rows = []
    for nt in threads:
        torch.set_num_threads(nt)
        for M in ms:
            xs = {n: torch.randn(M, K).to(torch.bfloat16) for n, (N, K) in SHAPES.items()}

            def step(m: str) -> None:
                for per in layers:
                    for name in ("qkv", "o", "gate_up", "down"):
                        per[name][m][0](xs[name])
                head[m][0](xs["lm_head"])

            for m in METHODS:
                step(m)
            res: dict[str, list[float]] = {m: [] for m in METHODS}
            for r in range(repeats):
                order = METHODS[r % 3:] + METHODS[:r % 3]
                for m in order:
                    t0 = time.perf_counter()
                    step(m)
                    res[m].append((time.perf_counter() - t0) * 1e3)
            row = {"M": M, "threads": nt}
            for m in METHODS:
                row[f"{m}_ms"] = round(statistics.median(res[m]), 3)
            row["speedup_vs_vllm"] = round(row["vllm_ms"] / row["ours_ms"], 3)
            rows.append(row)
            print(f"  step M={M:2d} t={nt}  vllm {row['vllm_ms']:.2f} ms | F.linear {row['flinear_ms']:.2f} ms | "
                  f"ours {row['ours_ms']:.2f} ms  x{row['speedup_vs_vllm']:.2f}", flush=True)
    return rows


def to_markdown(info: dict, rows: list[dict], steps: list[dict], hot: bool) -> str:
    total = sum(N * K * 2 * PER_STEP[n] for n, (N, K) in SHAPES.items())
    out = [f"# bf16 GEMV: vLLM CPU linear vs F.linear vs ours ({'hot' if hot else 'cold'} weights)", "",
           f"CPU: {info['model']}; flags: {' '.join(info['flags'])}; torch {info['torch']}, vLLM {info['vllm']}.",
           "Median µs per call over interleaved repeats; GB/s = weight bytes / time. vLLM path = what "
           "dispatch_cpu_unquantized_gemm picked.", "",
           "p10 = 10th percentile of single calls (the cost when no other process took the core).", "",
           "| shape | N x K | M | thr | vLLM path | vLLM µs | vLLM GB/s | F.linear µs | ours µs | ours GB/s "
           "| speedup | vLLM p10 µs | ours p10 µs | p10 speedup |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['shape']} | {r['N']}x{r['K']} | {r['M']} | {r['threads']} | {r['vllm_path']} | "
                   f"{r['vllm_us']:.1f} | {r['vllm_gbps']:.1f} | {r['flinear_us']:.1f} | {r['ours_us']:.1f} | "
                   f"{r['ours_gbps']:.1f} | {r['speedup_vs_vllm']:.2f}x | {r['vllm_p10_us']:.1f} | "
                   f"{r['ours_p10_us']:.1f} | {r['vllm_p10_us'] / r['ours_p10_us']:.2f}x |")
    # per-step sum from the per-shape medians
    out += ["", "Sum over one SmolLM2 decoder step from the per-shape rows (30 x (qkv + o + gate_up + down) + "
            f"lm_head, {total / 1e6:.0f} MB of weights):", "",
            "| M | thr | vLLM ms | F.linear ms | ours ms | ours GB/s | speedup |", "|---|---|---|---|---|---|---|"]
    for nt in sorted({r["threads"] for r in rows}):
        for M in sorted({r["M"] for r in rows}):
            sel = [r for r in rows if r["threads"] == nt and r["M"] == M]
            s = {m: sum(r[f"{m}_us"] * PER_STEP[r["shape"]] for r in sel) / 1e3 for m in METHODS}
            out.append(f"| {M} | {nt} | {s['vllm']:.2f} | {s['flinear']:.2f} | {s['ours']:.2f} | "
                       f"{total / s['ours'] / 1e6:.1f} | {s['vllm'] / s['ours']:.2f}x |")
    if steps:
        out += ["", "Measured whole step (all 121 GEMMs in model order, distinct weights per layer):", "",
                "| M | thr | vLLM ms | F.linear ms | ours ms | ours GB/s | speedup |", "|---|---|---|---|---|---|---|"]
        for r in steps:
            out.append(f"| {r['M']} | {r['threads']} | {r['vllm_ms']:.2f} | {r['flinear_ms']:.2f} | "
                       f"{r['ours_ms']:.2f} | {total / r['ours_ms'] / 1e6:.1f} | {r['speedup_vs_vllm']:.2f}x |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--target-ms", type=float, default=20.0, help="time per measurement")
    p.add_argument("--hot", action="store_true", help="reuse one weight copy (cache-resident)")
    p.add_argument("--no-step", action="store_true", help="skip the whole-step measurement")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" / "gemv"))
    a = p.parse_args(argv)
    if a.quick:
        a.repeats, a.target_ms = 3, 8.0
    from vllm_dflash.ops.gemv import gemv_supported
    if not gemv_supported():
        print("gemv kernel unavailable here (extension not built or no avx512_bf16): nothing to compare")
        return 1
    info = cpu_info()
    print(f"CPU: {info['model']}  flags: {' '.join(info['flags'])}  torch {info['torch']}  vLLM {info['vllm']}")
    torch.manual_seed(0)
    rows = bench_shapes(a.m, a.threads, a.repeats, a.hot, a.target_ms)
    steps = [] if a.no_step else bench_step(sorted({1, 8} & set(a.m)) or a.m[:1], a.threads, max(9, a.repeats))
    md = to_markdown(info, rows, steps, a.hot)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"cpu": info, "hot": a.hot, "shapes": rows, "step": steps},
                                                   indent=1) + "\n")
    out.with_suffix(".md").write_text(md)
    print()
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
