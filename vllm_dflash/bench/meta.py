# SPDX-License-Identifier: Apache-2.0
"""What a serving benchmark's JSON records about its run besides the runs: the meta block (flags, engine, layout,
machine, versions) and the hardware limit of each run (limit.py), measured with every server stopped."""
from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import time
from pathlib import Path
from typing import Any

from vllm_dflash import settings
from vllm_dflash.bench import limit

# The result format: 2 since the configurations were renamed (`ours` the default, `ours-fixed` the paper's block:
# configs.RENAMED); a result without `meta.schema` is 1. Readers of result files go through `upgrade`.
SCHEMA = 2

# The servers' processes (TP 1): patches/cpu_uniproc.py keeps vLLM's `uni` executor on CPU where the plugin acts
PROCESSES = ("`vllm serve` with V1 multiprocessing (an API server and an engine core process; stock configurations "
             "(`none`, `ngram`: vllm_dflash not loaded) add vLLM's CPU worker process; where vllm_dflash acts, the "
             "engine core runs the model itself: vLLM's `uni` executor, kept on CPU by vllm_dflash; a `NAME@mp` "
             "configuration adds vLLM's CPU worker process, --distributed-executor-backend mp; overlap scheduling "
             "also keeps the worker process), TP 1")
LAYOUT = (PROCESSES + ", one process group per configuration, started one after another; the benchmark "
          "client (asyncio, one process) runs on the same machine")
LAYOUT_INTERLEAVED = (PROCESSES + ", one process group per configuration, **all up at once and interleaved**: per "
                      "prompt set and concurrency level the configurations run back to back, the prompts split into "
                      "up to {rounds} rounds (each of at least {waves} x `concurrency` prompts), the order rotated "
                      "by one with every round, across levels too; "
                      "a run's wall time is the sum of its rounds; the CPU time idle servers used meanwhile is "
                      "recorded per run; the benchmark client (asyncio, one process) runs on the same machine")


def machine() -> dict[str, Any]:
    """CPU model, its kind (utils.cpu_class: AMX, avx512_bf16 or AVX2), core count and load average at the start."""
    from vllm_dflash.utils import cpu_class

    info = Path("/proc/cpuinfo").read_text()
    cpu = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
    return {"cpu": cpu, "cpu_class": cpu_class(info), "cores": os.cpu_count(),
            "loadavg_start": [round(x, 2) for x in os.getloadavg()]}


def version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "?"


def gemm_f32_meta(dtype: str) -> str:
    """What DFLASH_CPU_GEMM_F32 (unset in the servers: its default) means for this run's float32 linear layers."""
    from vllm_dflash.integration.patches.cpu_gemv import NO_LIMIT, f32_rows
    from vllm_dflash.ops.gemm_f32 import gemm_f32_supported

    value = settings.PROCESS_FIELDS["cpu_gemm_f32"].default
    rows = f32_rows(value) if gemm_f32_supported() else 0
    what = "off" if rows <= 0 else "every call on our AVX2 GEMM" if rows >= NO_LIMIT else f"<= {rows} rows on ours"
    return f"{value} ({what}{'' if dtype == 'float32' else '; applies to float32 only'})"


def build_meta(a: argparse.Namespace, target: Path, draft: Path | None, trained: bool, k: int | None,
               levels: list[int], prompt_sets: list[str], dtype: str, max_num_seqs: int) -> dict[str, Any]:
    """The JSON's `meta` block as the run starts (run.py adds the hinted draft, and once the runs are done the hardware
    limit, the end load and the elapsed time)."""
    return {"schema": SCHEMA, "name": a.name, "quick": a.quick, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "target": str(target), "draft": str(draft) if draft else None, "draft_trained": trained,
            "num_speculative_tokens": k, "prompt_sets": prompt_sets, "num_prompts": a.num_prompts,
            "waves": a.waves, "prompts_per_run": {str(c): n for c, n in a.prompts_per_run.items()},
            "concurrency": levels, "max_tokens": a.max_tokens, "ignore_eos": a.ignore_eos, "temperature": a.temperature,
            "engine": {"dtype": dtype, "enforce_eager": a.enforce_eager, "max_model_len": a.max_model_len,
                       "max_num_seqs": max_num_seqs, "kv_cache_gib": a.kv_cache_gib,
                       "cpu_gemv": settings.parse_value("cpu_gemv", a.cpu_gemv) if a.cpu_gemv is not None
                       else settings.PROCESS_FIELDS["cpu_gemv"].default,
                       "cpu_gemm_f32": gemm_f32_meta(dtype)},
            "layout": {"omp_num_threads": a.threads,
                       "cpu_bind": a.cpu_bind or os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto (vLLM default)"),
                       "ld_preload": os.environ.get("LD_PRELOAD", ""),
                       "description": (LAYOUT_INTERLEAVED.format(rounds=a.interleave, waves=a.waves) if a.interleave
                                       else LAYOUT)},
            "interleave": a.interleave, "min_rounds": a.min_rounds,
            "spec_extra": list(a.spec_extra), "env_extra": list(a.env),
            "machine": machine(),
            "versions": {"vllm_dflash": version("vllm-dflash"), "vllm": version("vllm"), "torch": version("torch")}}


def hardware(target: Path, dtype: str, threads: int) -> tuple[limit.Hardware, limit.ModelSize]:
    """Measured once before any server starts (the machine is quiet then): the inputs of the limit column."""
    import torch

    tdt = getattr(torch, dtype)
    size = limit.model_size(target, tdt)
    hw = limit.measure_hardware(threads, tdt, size.hidden, size.intermediate)
    print(f"hardware ({threads} thread(s)): read {hw.read_gb_s:.1f} GB/s, {dtype} GEMM {hw.gemm_tflops * 1e3:.0f} "
          f"GFLOP/s ({hw.gemm_op}); target {size.params / 1e6:.0f} M parameters = {size.weight_bytes / 1e6:.0f} MB",
          flush=True)
    return hw, size


def attach_limits(result: dict[str, Any], hw: limit.Hardware, size: limit.ModelSize) -> None:
    """Per run: the hardware limit of its shape (limit.py) and the measured fraction of it."""
    for r in result["runs"]:
        if not r.get("ok"):
            continue
        tpf, q = limit.run_shape(r)
        lim = limit.limit_tok_s(hw, size, r["concurrency"], tpf, q)
        r["limit"] = {**lim, "tokens_per_forward": tpf, "query_per_request": q,
                      "fraction": r["output_tok_s"] / lim["limit_tok_s"]}


def upgrade(result: dict[str, Any]) -> dict[str, Any]:
    """A serving result as today's code writes it: one of schema 1 gets today's configuration names (configs.RENAMED:
    old `ours` -> `ours-fixed`, old `ours-adaptive` -> `ours`, suffixes and labels kept) wherever a name is a key
    or a value: the configurations, the runs, the greedy check, the overrides. A copy; a current result is returned
    as it is."""
    from vllm_dflash.bench.configs import renamed

    if result["meta"].get("schema", 1) >= SCHEMA:
        return result

    def override(item: str) -> str:  # CONFIG:KEY=VALUE
        name, sep, rest = item.partition(":")
        return renamed(name) + sep + rest

    ll = result.get("losslessness")
    return {**result,
            "meta": {**result["meta"], "schema": SCHEMA,
                     "spec_extra": [override(x) for x in result["meta"].get("spec_extra", [])],
                     "env_extra": [override(x) for x in result["meta"].get("env_extra", [])]},
            "configs": {renamed(n): c for n, c in result["configs"].items()},
            "runs": [{**r, "config": renamed(r["config"])} for r in result["runs"]],
            **({"losslessness": {**ll, "per_config": {renamed(n): v for n, v in ll["per_config"].items()}}}
               if ll else {})}
