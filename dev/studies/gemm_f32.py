#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""fp32 linear layers of one decode / verify step: vLLM 0.32's CPU GEMM against ours (csrc/gemm_f32_cpu.cpp).

    python dev/studies/gemm_f32.py                      # SmolLM2-135M shapes, M = 1 .. 512, the machine's threads
    python dev/studies/gemm_f32.py --rows 1,8 --repeats 3

One "step" = every linear layer of SmolLM2-135M-Instruct in model order with distinct weights, as the model holds
them (30 layers x qkv, o, gate_up, down, then the LM head: 538 MB of fp32, far beyond any L3 here, so each step
streams its weights from memory as a real forward does), called with M rows:
  vllm   `layer.cpu_linear(x, layer.weight, None)` after vLLM's own `dispatch_cpu_unquantized_gemm(layer)` (no plugin
         loaded; which path it chose is recorded)
  ours   `torch.ops.vllm_dflash.linear_f32` with every call on our kernel (what cpu_gemm_f32 `all` installs)
The two alternate (rotated order) for `--repeats` rounds; the median step time is reported, with the memory bound
(weight bytes / measured read bandwidth) and the compute bound (2 x parameters x M / torch's fp32 GEMM rate at the MLP
shape with 256 rows, vllm_dflash/bench/limit.py). Results: dev/results/gemm_f32.{json,md,png}.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate_up, down of SmolLM2-135M
LAYERS = 30
LM_HEAD = (49152, 576)


def cpu_flags() -> tuple[str, list[str]]:
    model, flags = "?", set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
        elif line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
    keep = ["avx2", "fma", "avx512f", "avx512_bf16", "amx_tile"]
    return model, [f for f in keep if f in flags]


def vllm_linear(w: torch.Tensor):
    """vLLM's own choice for a layer with weight w [N, K] (dispatch_cpu_unquantized_gemm, unpatched)."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(w.clone(), requires_grad=False)
    dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    f = layer.cpu_linear
    path = "onednn" if "onednn_mm" in getattr(getattr(f, "__code__", None), "co_names", ()) else "other"
    return (lambda x: f(x, layer.weight, None)), path, layer


def ours_linear(w: torch.Tensor):
    from vllm_dflash.ops.gemm_f32 import pack_f32_weight

    p = pack_f32_weight(w)
    op, packed, n, none = torch.ops.vllm_dflash.linear_f32, p.packed, p.n, torch.empty(0)
    return lambda x: op(x, packed, n, None, 1 << 62, none)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1,2,4,6,8,12,16,24,32,48,64,128,256,512")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--out", default="dev/results/gemm_f32")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    import vllm

    from vllm_dflash.bench.limit import measure_hardware
    from vllm_dflash.ops.gemm_f32 import gemm_f32_supported

    if not gemm_f32_supported():
        raise SystemExit("gemm_f32: the kernel needs avx2 + fma and the built extension (bash scripts/setup.sh)")
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=g) * 0.02 for _ in range(LAYERS) for (n, k) in SHAPES]
    weights.append(torch.randn(*LM_HEAD, generator=g) * 0.02)
    nbytes = sum(w.numel() * 4 for w in weights)
    params = nbytes // 4
    vl = [vllm_linear(w) for w in weights]
    paths = sorted({p for _, p, _ in vl})
    methods = {"vllm": [f for f, _, _ in vl], "ours": [ours_linear(w) for w in weights]}
    del weights
    hw_ = measure_hardware(a.threads, torch.float32, hidden=576, intermediate=3072)
    hw = {"read_gbs": hw_.read_gb_s, "gemm_gflops": hw_.gemm_tflops * 1e3}
    rows = [int(r) for r in a.rows.split(",")]
    results = []
    for m in rows:
        xs = {k: torch.randn(m, k, generator=g) for k in (576, 1536)}
        times: dict[str, list[float]] = {k: [] for k in methods}
        for r in range(a.repeats):
            order = list(methods) if r % 2 == 0 else list(reversed(methods))
            for name in order:
                fns = methods[name]
                t0 = time.perf_counter()
                for f, (n, k) in zip(fns, [s for _ in range(LAYERS) for s in SHAPES] + [LM_HEAD]):
                    f(xs[k])
                times[name].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        bound = max(nbytes / hw["read_gbs"] / 1e6, 2 * params * m / hw["gemm_gflops"] / 1e6)
        results.append({"rows": m, "vllm_ms": med["vllm"], "ours_ms": med["ours"],
                        "speedup": med["vllm"] / med["ours"], "bound_ms": bound})
        print(f"M={m:4d}  vLLM {med['vllm']:7.1f} ms  ours {med['ours']:7.1f} ms  "
              f"{med['vllm'] / med['ours']:.2f}x  bound {bound:.1f} ms", flush=True)
    model, flags = cpu_flags()
    meta = {"cpu": model, "flags": flags, "threads": a.threads, "torch": torch.__version__, "vllm": vllm.__version__,
            "vllm_paths": paths, "weight_mb": nbytes / 1e6, "hardware": hw, "repeats": a.repeats,
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    lines = [f"# fp32 linear layers of one SmolLM2-135M step: vLLM's CPU GEMM against ours",
             "",
             f"{meta['started']}; CPU: {model} ({', '.join(flags)}), {a.threads} thread(s); torch {torch.__version__}, "
             f"vLLM {vllm.__version__} (its path here: {', '.join(paths)}). One step = 121 GEMMs, "
             f"{nbytes / 1e6:.0f} MB "
             f"of distinct fp32 weights in model order; median of {a.repeats} interleaved rounds. Bound = max(weights "
             f"/ {hw['read_gbs']:.1f} GB/s read, 2 x {params / 1e6:.1f} M x M / {hw['gemm_gflops']:.0f} GFLOP/s).",
             "", "| rows M | vLLM ms | ours ms | speedup | bound ms | vLLM / bound | ours / bound |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['rows']} | {r['vllm_ms']:.1f} | {r['ours_ms']:.1f} | {r['speedup']:.2f}x | "
                     f"{r['bound_ms']:.1f} | {r['vllm_ms'] / r['bound_ms']:.2f} | {r['ours_ms'] / r['bound_ms']:.2f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    xs_ = [r["rows"] for r in results]
    ax.plot(xs_, [r["vllm_ms"] for r in results], "o-", label="vLLM (oneDNN)")
    ax.plot(xs_, [r["ours_ms"] for r in results], "s-", label="ours (gemm_f32)")
    ax.plot(xs_, [r["bound_ms"] for r in results], "k--", label="hardware bound")
    ax.set(xscale="log", yscale="log", xlabel="rows per call (M)", ylabel="ms per step (121 GEMMs)",
           title=f"fp32 linear layers, SmolLM2-135M step\n{model}, {a.threads} threads")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    print(f"wrote {out}.json/.md/.png")


if __name__ == "__main__":
    main()
