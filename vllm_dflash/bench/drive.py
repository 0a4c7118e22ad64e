# SPDX-License-Identifier: Apache-2.0
"""The serving benchmark's runs: start and warm up each configuration's `vllm serve`, then run every prompt set x
concurrency level against it, one server after another or (--interleave) all up at once in rotated rounds. Each
finished run is judged against `none` (lossless.py) and printed as a progress line."""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from vllm_dflash.bench import levels as levels_mod
from vllm_dflash.bench import waves
from vllm_dflash.bench.configs import BenchConfig
from vllm_dflash.bench.lossless import exactness, own_f32_gemm
from vllm_dflash.bench.procs import process_layout
from vllm_dflash.utils import get_logger

logger = get_logger(__name__)


def omp_binding(log: str) -> list[str]:
    """vLLM's OpenMP binding report from a server log (e.g. 'core ids=[0]', 'reserved_cpus=[1]')."""
    keep = ("VLLM_CPU_OMP_THREADS_BIND", "core ids", "reserved_cpus")
    return [ln.split("]", 1)[-1].strip() for ln in log.splitlines()
            if "ompmultiprocessing" in ln and any(k in ln for k in keep)]


def _start(server: Any, timeout: float) -> str | None:
    """Start the server (one retry if another process took the port). Returns an error message or None."""
    from vllm_dflash.serve.server import free_port

    for attempt in range(2):
        try:
            server.start(timeout=timeout)
            return None
        except (RuntimeError, TimeoutError) as e:
            log = Path(server.log_path).read_text(errors="replace") if server.log_path else ""
            if attempt == 0 and "Address already in use" in log:
                server.port = free_port()
                continue
            errs = [ln.strip() for ln in log.splitlines() if "Error" in ln or "error:" in ln]
            return f"{e}" + (f" -- {errs[-1][:300]}" if errs else "")
    return "unreachable"


def _failed(name: str, ps: str, c: int, n_prompts: int, e: Exception) -> dict[str, Any]:
    """The record of a run that failed (logged; the rest of the benchmark goes on)."""
    logger.error("bench: %s / %s / c%d failed: %s", name, ps, c, e)
    return {"config": name, "prompt_set": ps, "concurrency": c, "num_prompts": n_prompts, "ok": False,
            "error": f"{type(e).__name__}: {e}"[:300]}


def _one_run(server: Any, cfg: BenchConfig, ps: str, items: list[dict[str, Any]], c: int, a: Any) -> dict[str, Any]:
    try:
        return waves.summarize(cfg, ps, c, [waves.measure(server, items, c, a)])
    except Exception as e:  # noqa: BLE001 - one failed run is recorded, the rest of the benchmark goes on
        return _failed(cfg.name, ps, c, len(items), e)


def _start_and_warm(server: Any, cfg: BenchConfig, entry: dict[str, Any], prompts: dict[str, list[dict[str, Any]]],
                    a: argparse.Namespace, t_start: float) -> bool:
    """Start one configuration's server and warm it up (not measured); False (recorded in `entry`) if it failed."""
    from vllm_dflash.bench.client import run_load

    print(f"[{time.time() - t_start:6.0f}s] starting vllm serve: {cfg.name} ...", flush=True)
    t0 = time.time()
    err = _start(server, a.start_timeout)
    if err:
        entry.update(status="failed", reason=err)
        logger.error("bench: %s did not start: %s", cfg.name, err)
        return False
    entry["start_s"] = round(time.time() - t0, 1)
    try:  # warm-up: not measured (each run's before-scrape comes after it)
        for ps in prompts:
            run_load(server.url, prompts[ps][-1:], 1, 16)
    except Exception as e:  # noqa: BLE001 - recorded; the other configurations still run
        entry.update(status="failed", reason=f"warm-up: {type(e).__name__}: {e}"[:300])
        server.stop()
        return False
    entry["processes"] = process_layout(server.proc.pid)
    entry["omp_binding"] = omp_binding(Path(server.log_path).read_text(errors="replace"))
    return True


def _finish_run(run: dict[str, Any], server: Any, cfg: BenchConfig, items: list[dict[str, Any]],
                baseline: dict[tuple[str, int], dict[str, Any]], tokenizer: Any, t_start: float,
                sampled: bool = False) -> dict[str, Any]:
    """`none` records its outputs as the baseline; any other configuration's greedy outputs are explained against it
    on its own server (still up). sampled (--temperature > 0): nothing to compare."""
    key = (run["prompt_set"], run["concurrency"])
    if run["ok"] and cfg.name == "none":
        baseline[key] = {"outputs": run["outputs"], "token_ids": run.get("token_ids") or {}}
    elif run["ok"] and baseline.get(key) is not None and not sampled:
        run["exactness"] = exactness(server, tokenizer, items, baseline[key], run, own_f32_gemm(cfg, server.dtype))
    run.pop("token_ids", None)  # compared above; not stored (the texts are)
    print(f"[{time.time() - t_start:6.0f}s] {cfg.name:13s} {run['prompt_set']:10s} c{run['concurrency']:<3d} "
          + (f"{run['output_tok_s']:7.1f} tok/s  tau {_tau(run)}" if run["ok"] else run["error"]), flush=True)
    return run


def bench_config(server: Any, cfg: BenchConfig, entry: dict[str, Any], prompts: dict[str, list[dict[str, Any]]],
                 levels: list[int], a: argparse.Namespace, t_start: float,
                 baseline: dict[tuple[str, int], dict[str, Any]], tokenizer: Any) -> list[dict[str, Any]]:
    """Start one configuration's server, warm it up, run every prompt set x concurrency level, stop it.
    `baseline`: the outputs of `none` per (prompt set, concurrency), filled when `none` runs (it runs first)."""
    if not _start_and_warm(server, cfg, entry, prompts, a, t_start):
        return []
    runs = []
    try:
        slices = levels_mod.level_slices(a.prompts_per_run)
        for ps, items in prompts.items():
            for c in levels:
                runs.append(_finish_run(_one_run(server, cfg, ps, items[slices[c]], c, a), server, cfg,
                                        items[slices[c]], baseline, tokenizer, t_start, a.temperature > 0))
    finally:
        server.stop()
    return runs


def bench_interleaved(servers: dict[str, Any], cfgs: dict[str, BenchConfig], entries: dict[str, dict[str, Any]],
                      prompts: dict[str, list[dict[str, Any]]], levels: list[int], a: argparse.Namespace,
                      t_start: float, baseline: dict[tuple[str, int], dict[str, str]],
                      tokenizer: Any) -> list[dict[str, Any]]:
    """Every configuration's server up at once; each prompt set x concurrency level runs every configuration back
    to back, its prompts split into rounds with the configurations' order rotated per round, so a machine whose
    speed drifts over minutes slows every configuration alike. Idle servers' CPU use is recorded with each run."""
    live: list[str] = []
    try:
        for name, server in servers.items():
            if _start_and_warm(server, cfgs[name], entries[name], prompts, a, t_start):
                live.append(name)
        runs = []
        slices = levels_mod.level_slices(a.prompts_per_run)
        runs_done = 0  # the first configuration's turn moves on with every run, so a level in one round (c32) does
        for ps, items in prompts.items():  # not always start with the same configuration
            for c in levels:
                its = items[slices[c]]
                chunks = levels_mod.round_chunks(its, c, a.interleave, a.waves, a.min_rounds)
                n = len(chunks)
                waves_of: dict[str, list[dict[str, Any]]] = {name: [] for name in live}
                failed: dict[str, dict[str, Any]] = {}
                for r, chunk in enumerate(chunks):
                    for name in levels_mod.rotation(live, runs_done + r):
                        if name in failed:
                            continue
                        others = {o: servers[o] for o in live if o != name}
                        time.sleep(0.5)  # the server that ran last settles (OpenMP threads stop spinning)
                        try:
                            waves_of[name].append(waves.measure(servers[name], chunk, c, a, others))
                        except Exception as e:  # noqa: BLE001 - one failed run is recorded, the rest go on
                            failed[name] = _failed(name, ps, c, len(its), e)
                runs_done += n
                for name in sorted(live, key=lambda x: x != "none"):  # none first: the others are explained against it
                    run = failed.get(name) or waves.summarize(cfgs[name], ps, c, waves_of[name])
                    runs.append(_finish_run(run, servers[name], cfgs[name], its, baseline, tokenizer, t_start,
                                            a.temperature > 0))
        return runs
    finally:
        for server in servers.values():
            server.stop()


def _tau(run: dict[str, Any]) -> str:
    tau = (run.get("spec_decode") or {}).get("tau")
    return "–" if tau is None else f"{tau:.2f}"
