# SPDX-License-Identifier: Apache-2.0
"""The hardware limit of a serving run: how many output tokens per second this machine could give at best.

A decode step streams every weight once (memory-bound) and spends ~2 FLOPs per parameter per query token
(compute-bound); the step cannot be faster than the slower of the two:

    step_time >= max(weight_bytes / read_bandwidth, query_tokens * 2 * params / gemm_flops)

With c requests in flight, each yielding `tokens_per_forward` tokens per step and feeding the target
`query_per_request` tokens (1 + drafts verified), the limit is

    limit_tok_s = c * tokens_per_forward / max(weight_bytes / bw, c * query_per_request * 2 * params / flops)

`bw` and `flops` are measured here, on the threads the model worker gets (not datasheet figures): read bandwidth by
summing a tensor much larger than the caches, GEMM throughput with the target's own layer shape in its serving
dtype, from the faster of torch's GEMM and, in float32 where it runs, this package's kernel (ops/gemm_f32.py, which
serves vLLM's float32 linear layers on AVX2 CPUs and beats torch's rate from about 24 rows on). Attention, the KV
cache and host work are left out, so the limit is optimistic (an upper bound)."""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Hardware:
    threads: int
    read_gb_s: float  # sustained read bandwidth, GB/s (1e9 bytes)
    gemm_tflops: float  # dense GEMM throughput at the target's layer shape, TFLOP/s
    dtype: str
    gemm_shape: tuple[int, int, int]  # (tokens, in, out)
    gemm_op: str = "torch"  # whose GEMM gave gemm_tflops: "torch" or "vllm_dflash.gemm_f32"


@dataclass(frozen=True)
class ModelSize:
    params: int  # every weight read by one decode step (tied embeddings counted once)
    weight_bytes: int
    hidden: int
    intermediate: int


def _best(fn, repeats: int) -> float:
    fn()  # warm-up (page faults, oneDNN primitive creation)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure_hardware(threads: int, dtype: torch.dtype, hidden: int, intermediate: int, tokens: int = 256,
                     bytes_read: int = 1 << 29, repeats: int = 5) -> Hardware:
    """Read bandwidth and GEMM throughput on `threads` threads (restores torch's thread count)."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        buf = torch.ones(bytes_read // 4, dtype=torch.float32)  # 512 MiB: far beyond any cache
        t = _best(lambda: buf.sum(), repeats)
        read_gb_s = bytes_read / t / 1e9
        buf = None  # free the 512 MiB before the GEMM
        x = torch.randn(tokens, hidden, dtype=dtype)  # [tokens, hidden]
        w = torch.randn(intermediate, hidden, dtype=dtype)  # [intermediate, hidden]
        t, op = _best(lambda: torch.nn.functional.linear(x, w), repeats * 4), "torch"
        if dtype == torch.float32:
            from vllm_dflash.ops.gemm_f32 import gemm_f32, gemm_f32_supported, pack_f32_weight

            if gemm_f32_supported():
                pw = pack_f32_weight(w)
                t_ours = _best(lambda: gemm_f32(x, pw), repeats * 4)
                if t_ours < t:
                    t, op = t_ours, "vllm_dflash.gemm_f32"
        tflops = 2 * tokens * hidden * intermediate / t / 1e12
    finally:
        torch.set_num_threads(old)
    return Hardware(threads, round(read_gb_s, 2), round(tflops, 4), str(dtype).removeprefix("torch."),
                    (tokens, hidden, intermediate), op)


def better(a: Hardware, b: Hardware) -> Hardware:
    """Two readings of the same machine (e.g. before and after a benchmark): the higher bandwidth and GEMM rate of
    the two. Each reading is a best of a few short repeats, so a busy moment can pull one far down, never up."""
    return Hardware(a.threads, max(a.read_gb_s, b.read_gb_s), max(a.gemm_tflops, b.gemm_tflops), a.dtype,
                    a.gemm_shape, a.gemm_op if a.gemm_tflops >= b.gemm_tflops else b.gemm_op)


def model_size(model_dir: str | Path, dtype: torch.dtype) -> ModelSize:
    """Parameters of a Hugging Face folder (safetensors headers only, nothing loaded) at `dtype`'s width."""
    import torch
    from safetensors import safe_open

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"{model_dir}: no config.json and *.safetensors weights to size. Fix: pass a Hugging Face "
                         "model folder")
    cfg = json.loads((model_dir / "config.json").read_text())
    params = 0
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():
                n = 1
                for d in st.get_slice(k).get_shape():
                    n *= d
                params += n
    if params == 0:
        raise ValueError(f"{model_dir}: no *.safetensors weights to size. Fix: pass a Hugging Face model folder")
    width = torch.empty((), dtype=dtype).element_size()
    return ModelSize(params, params * width, int(cfg["hidden_size"]), int(cfg["intermediate_size"]))


def limit_tok_s(hw: Hardware, size: ModelSize, concurrency: int, tokens_per_forward: float,
                query_per_request: float) -> dict[str, float]:
    """The bound for one run: {'limit_tok_s', 'memory_step_ms', 'compute_step_ms', 'bound'} (bound: which side)."""
    mem = size.weight_bytes / (hw.read_gb_s * 1e9)
    comp = concurrency * query_per_request * 2 * size.params / (hw.gemm_tflops * 1e12)
    step = max(mem, comp)
    return {"limit_tok_s": concurrency * tokens_per_forward / step, "memory_step_ms": mem * 1e3,
            "compute_step_ms": comp * 1e3, "bound": "memory" if mem >= comp else "compute"}


def run_shape(run: dict[str, Any]) -> tuple[float, float]:
    """(tokens per target forward, query tokens per request-step) of a bench run, from the server's counters.

    Every request-step yields its accepted drafts plus one token, so request-steps = generated - accepted; it
    feeds the target 1 + the drafts it verifies. No speculation: (1, 1)."""
    sd = run.get("spec_decode") or {}
    gen = sd.get("generated_tokens") or run.get("server_generation_tokens") or run.get("output_tokens") or 0
    accepted, drafted = sd.get("accepted") or 0.0, sd.get("draft_tokens") or 0.0
    steps = sd.get("request_steps") or max(gen - accepted, 1.0)
    if not gen:
        return 1.0, 1.0
    return gen / steps, 1.0 + drafted / steps


def l3_bytes(sysfs: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The last-level (L3) cache size the OS reports for CPU 0, or None when unknown. When the target's weights fit
    in it, a decode step need not stream them from DRAM, and the memory bound above is too pessimistic."""
    for idx in sorted(sysfs.glob("index*")):
        try:
            if (idx / "level").read_text().strip() != "3":
                continue
            size = (idx / "size").read_text().strip().upper()  # e.g. "32768K", "300M"
        except OSError:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        digits = size.rstrip("KMG")
        return int(digits) * mult if digits.isdigit() else None
    return None


def hardware_record(hw: Hardware, size: ModelSize, l3: int | None = None) -> dict[str, Any]:
    return {"hardware": {**asdict(hw), "l3_bytes": l3}, "model": asdict(size)}
