# SPDX-License-Identifier: Apache-2.0
"""KV-injection micro-benchmark: our fused op vs the unfused PyTorch path vs vLLM 0.32's own precompute.

Each path takes the fc-projected context rows of one drafter step and ends with K/V in every draft layer's
paged cache (vLLM's CPU layout), so all three do the same work:
  fused    torch.ops.vllm_dflash.fused_context_kv_to_cache (csrc/kv_injection_cpu.cpp)
  unfused  our PyTorch reference (vllm_dflash.ops.inject_context_kv_reference) + vLLM's per-layer cache write
  vllm     vLLM's DFlashQwen3Model.precompute_and_store_context_kv (its own code, run on stand-in attention
           layers that hold real caches and vLLM's CPU cache-write op)
Shapes: the SmolLM2 draft (hidden 576, 3 KV heads x 64, 1 and 2 layers) and a Qwen3-8B draft (hidden 4096,
5 layers, 8 KV heads x 128). Usage:
  python benchmarks/bench_kv_injection.py [--threads 1] [--dtype float32] [--quick] [--out FILE.json]
  python -m vllm_dflash.bench.kernels ...     (the same; --out defaults to ./bench-results/kv_injection.json)
Writes JSON and prints a markdown table (time per call, speedups).
"""
from __future__ import annotations

import argparse
import json
import platform
import time
import types
from pathlib import Path

import torch

SHAPES = {  # name: (hidden, layers, kv heads, head dim)
    "smollm2-draft-1L": (576, 1, 3, 64),
    "smollm2-draft-2L": (576, 2, 3, 64),
    "qwen3-8b-draft-5L": (4096, 5, 8, 128),
}
TOKENS = (1, 8, 64, 512, 4096)
BLOCK = 32  # vLLM CPU KV-cache block size


def _weights(H, L, nkv, hd, dtype, max_pos):
    from vllm_dflash.ops import KVInjectionWeights

    inv = 1.0 / (1e6 ** (torch.arange(0, hd, 2).float() / hd))
    f = torch.arange(max_pos).float()[:, None] * inv[None]
    return KVInjectionWeights(hidden_norm_weight=torch.ones(H, dtype=dtype),
                              kv_weight=(torch.randn(L * 2 * nkv * hd, H) / H ** 0.5).to(dtype),
                              k_norm_weight=torch.ones(L, hd, dtype=dtype),
                              cos_sin_cache=torch.cat([f.cos(), f.sin()], -1).to(dtype),
                              num_layers=L, num_kv_heads=nkv, head_dim=hd, eps=1e-6, is_neox=True)


class _CPUAttnStandIn:
    """What vLLM's precompute touches on an attention layer: kv_cache, isa and impl.do_kv_cache_update."""

    def __init__(self, cache, isa):
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

        self.kv_cache, self.isa = cache, isa
        self._k_scale_float = self._v_scale_float = 1.0
        impl = CPUAttentionBackendImpl.__new__(CPUAttentionBackendImpl)
        impl.attn_type, impl.kv_cache_dtype = "decoder", "auto"
        self.impl = impl


def _vllm_model(w, caches, isa):
    """A stand-in `self` for vLLM's DFlashQwen3Model carrying exactly the attributes its precompute reads."""
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3Model

    m = types.SimpleNamespace(
        _num_attn_layers=w.num_layers, _kv_size=w.num_kv_heads * w.head_dim, _head_dim=w.head_dim,
        _num_kv_heads=w.num_kv_heads, _hidden_norm_weight=w.hidden_norm_weight, _fused_kv_weight=w.kv_weight,
        _fused_kv_bias=None, _k_norm_weights=w.k_norm_weight, _rms_norm_eps=w.eps,
        _rope_head_size=w.head_dim, _rope_cos_sin_cache=w.cos_sin_cache, _rope_is_neox=w.is_neox,
        layers=[types.SimpleNamespace(self_attn=types.SimpleNamespace())],
        _attn_layers=[_CPUAttnStandIn(c, isa) for c in caches])
    for name in ("_project_context_kv", "_normalize_context_k"):
        setattr(m, name, getattr(DFlashQwen3Model, name).__get__(m))
    return lambda ctx, pos, slots: DFlashQwen3Model.precompute_and_store_context_kv(m, ctx, pos, slots)


CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = time.perf_counter


def _time(fn, min_time: float, min_reps: int = 3) -> float:
    fn()  # warm-up
    n, t0 = 0, _clock()
    while n < min_reps or _clock() - t0 < min_time:
        fn()
        n += 1
    return (_clock() - t0) / n


def bench_one(shape: str, T: int, dtype: torch.dtype, min_time: float) -> dict:
    import vllm._custom_ops as ops

    from vllm_dflash.ops import CPU_VEC_LAYOUT, inject_context_kv_reference, inject_context_kv_to_cache

    H, L, nkv, hd = SHAPES[shape]
    max_pos = 8192
    w = _weights(H, L, nkv, hd, dtype, max_pos)
    nb = T // BLOCK + 2
    caches = [torch.zeros(nb, nkv, BLOCK, 2 * hd, dtype=dtype) for _ in range(L)]
    ctx = torch.randn(T, H).to(dtype)
    pos = torch.randint(0, max_pos, (T,))
    slots = torch.randperm(nb * BLOCK)[:T]

    def fused():
        assert inject_context_kv_to_cache(ctx, pos, slots, w, caches, CPU_VEC_LAYOUT) == "fused"

    def unfused():
        k, v = inject_context_kv_reference(ctx, pos, w)
        for i, c in enumerate(caches):
            kc, vc = c.view(nb, nkv, 2 * BLOCK, hd).chunk(2, dim=2)
            ops.cpu_attn_reshape_and_cache(k[i], v[i], kc, vc, slots, "vec")

    vllm_fn = _vllm_model(w, caches, "vec")
    row = {"shape": shape, "T": T, "hidden": H, "layers": L, "kv_heads": nkv, "head_dim": hd}
    x = torch.randn(T, H).to(dtype)
    for name, fn in (("fused", fused), ("unfused", unfused), ("vllm", lambda: vllm_fn(ctx, pos, slots)),
                     ("gemm_only", lambda: torch.mm(x, w.kv_weight.t()))):
        row[f"{name}_ms"] = _time(fn, min_time) * 1e3
    row["speedup_vs_unfused"] = row["unfused_ms"] / row["fused_ms"]
    row["speedup_vs_vllm"] = row["vllm_ms"] / row["fused_ms"]
    row["gemm_share_of_fused"] = row["gemm_only_ms"] / row["fused_ms"]  # the floor: the one K/V GEMM alone
    return row


def table(rows: list[dict]) -> str:
    out = ["| shape | T | fused ms | unfused PyTorch ms | vLLM 0.32 ms | GEMM alone ms | fused vs unfused | "
           "fused vs vLLM | GEMM share of fused |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['shape']} | {r['T']} | {r['fused_ms']:.3f} | {r['unfused_ms']:.3f} | {r['vllm_ms']:.3f} | "
                   f"{r['gemm_only_ms']:.3f} | {r['speedup_vs_unfused']:.2f}x | {r['speedup_vs_vllm']:.2f}x | "
                   f"{100 * r['gemm_share_of_fused']:.0f}% |")
    return "\n".join(out)


def serving_share(target: str, draft: str, num_prompts: int, max_tokens: int) -> dict:
    """Share of the drafter's step spent in KV injection inside real vLLM (our drafter, offline LLM, in-process
    engine), PyTorch reference path vs the fused op, from our drafter's own timers (vllm_dflash metrics)."""
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the drafter runs in this process: read its timers
    from vllm import LLM, SamplingParams

    from vllm_dflash.data.prompts import humaneval_prompts
    from vllm_dflash.ops._ext import kv_injection_mode
    from vllm_dflash.serve.metrics import MetricsSink

    llm = LLM(model=target, speculative_config={"method": "dflash", "model": draft, "num_speculative_tokens": 7,
                                                        "adaptive": False},
              dtype="float32", enforce_eager=True, max_model_len=2048, seed=0,
              kv_cache_memory_bytes=1 << 30)
    prompts = [p["messages"] for p in humaneval_prompts(num_prompts)]
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    out = {}
    for mode in ("reference", "auto", "reference", "auto"):  # interleaved twice: drift hits both alike
        sink = MetricsSink.get()
        before = sink.snapshot()["hists"]
        with kv_injection_mode(mode):  # the engine runs in this thread (no multiprocessing): its "auto" follows this
            llm.chat(prompts, sp, use_tqdm=False)
        after = sink.snapshot()["hists"]
        d = {k: after[k]["sum"] - before[k]["sum"] for k in ("kv_injection_seconds", "draft_forward_seconds")}
        n = after["kv_injection_seconds"]["count"] - before["kv_injection_seconds"]["count"]
        acc = out.setdefault("fused" if mode == "auto" else "reference", {"inj_s": 0.0, "fwd_s": 0.0, "steps": 0})
        acc["inj_s"] += d["kv_injection_seconds"]
        acc["fwd_s"] += d["draft_forward_seconds"]
        acc["steps"] += n
    for v in out.values():
        v["injection_ms_per_step"] = 1e3 * v["inj_s"] / max(v["steps"], 1)
        v["injection_share_of_draft_step"] = v["inj_s"] / max(v["inj_s"] + v["fwd_s"], 1e-12)
    return out


OUT_DEFAULT = "bench-results/kv_injection.json"  # under the current directory (benchmarks/ passes results/)


def main(argv=None, out_default: str = OUT_DEFAULT) -> int:
    from tqdm import tqdm

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="torch threads (vLLM's CPU worker default here: 1)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES))
    ap.add_argument("--tokens", nargs="*", type=int, default=list(TOKENS))
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds of repetitions per measurement")
    ap.add_argument("--quick", action="store_true", help="T in {1, 64, 512}, SmolLM2 shapes only, 0.2 s each")
    ap.add_argument("--clock", default="wall", choices=tuple(CLOCK),
                    help="wall time, or process CPU time (robust on a shared machine; single-threaded runs only)")
    ap.add_argument("--serving", action="store_true", help="also measure the injection's share of a draft step in vLLM")
    ap.add_argument("--draft", default=None, help="draft for --serving (default: the bundled/untrained SmolLM2 draft)")
    ap.add_argument("--out", default=out_default)
    a = ap.parse_args(argv)
    global _clock
    _clock = CLOCK[a.clock]
    if a.clock == "cpu" and a.threads != 1:
        ap.error("--clock cpu measures one thread's work; use it with --threads 1")
    if a.quick:
        a.shapes, a.tokens, a.min_time = ["smollm2-draft-1L"], [1, 64, 512], 0.2
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dtype = getattr(torch, a.dtype)
    jobs = [(s, t) for s in a.shapes for t in a.tokens]
    rows = [bench_one(s, t, dtype, a.min_time) for s, t in tqdm(jobs, desc="kv-injection", unit="case")]
    import vllm

    meta = {"dtype": a.dtype, "threads": a.threads, "clock": a.clock, "torch": torch.__version__, "vllm": vllm.__version__,
            "cpu": platform.processor() or platform.machine(), "cache_block_size": BLOCK}
    try:
        meta["cpu_model"] = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    result = {"meta": meta, "rows": rows}
    md = table(rows)
    if a.serving:
        from vllm_dflash.drafts import checkout_draft_dir, ensure_draft
        from vllm_dflash.target import resolve_target

        target = resolve_target(None)
        draft, _ = ensure_draft(a.draft or checkout_draft_dir(), target)
        result["serving"] = sh = serving_share(str(target), str(draft), num_prompts=8, max_tokens=64)
        result["meta"]["serving_draft"] = str(draft)
        md += ("\n\nServing path (vLLM, our drafter, SmolLM2 + block-8 draft, 8 HumanEval prompts x 64 tokens): "
               "KV injection per draft step " + ", ".join(
                   f"{k} {v['injection_ms_per_step']:.2f} ms ({100 * v['injection_share_of_draft_step']:.0f}% of "
                   f"injection + draft forward)" for k, v in sh.items()))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    Path(a.out).with_suffix(".md").write_text(f"{json.dumps(meta)}\n\n{md}\n")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
