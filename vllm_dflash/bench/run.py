# SPDX-License-Identifier: Apache-2.0
"""The serving benchmark driver: for each configuration, start a real `vllm serve` on loopback, warm it
up, then drive it with concurrent streaming chat clients for every prompt set and concurrency level,
scraping `/metrics` before and after each run. Writes <out-dir>/<name>.json, <name>.md and PNG plots;
server logs go to <log-dir>. The CLI flags live here too (`vllm-dflash bench` and
benchmarks/bench_serving.py share them)."""
from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import time
from pathlib import Path
from typing import Any

from vllm_dflash import settings
from vllm_dflash.bench import levels as levels_mod
from vllm_dflash.bench import limit, stats, waves
from vllm_dflash.bench.procs import process_layout
from vllm_dflash.bench.configs import DEFAULT_CONFIGS, REGISTRY, BenchConfig, select
from vllm_dflash.utils import get_logger

logger = get_logger(__name__)

# Results and server logs go under the current directory unless --out-dir / --log-dir say otherwise (never into the
# package's own folder: an installed package has no source tree).
DEFAULT_OUT_DIR = "bench-results"
# --quick and the full run differ only in these defaults (an explicit flag wins in both).
# Quick: each `vllm serve` start costs 1-3 min on 2 busy cores, so it leaves out ngram and ours-adaptive.
_ALL_CORES = f"0-{(os.cpu_count() or 1) - 1}"
# Layout of the full run: every core bound to the model worker (OMP_NUM_THREADS = cores). Measured on a 2-core
# bf16 CPU (dev/benchmark_notes.md, bench_v4 against bench_v5): no speculation 40 / 206 / 306 tok/s at
# c1 / c8 / c32 against 32 / 167 / 204 with vLLM's default (the worker on one core), our default drafter higher at
# every level too. The quick run keeps vLLM's default layout (light on a busy CI machine).
PRESETS = {"full": {"configs": ",".join(DEFAULT_CONFIGS), "concurrency": "1,8,32", "num_prompts": 16, "max_tokens": 256,
                    "waves": levels_mod.DEFAULT_WAVES, "name": "bench_serving", "threads": os.cpu_count() or 1,
                    "cpu_bind": _ALL_CORES},
           "quick": {"configs": "none,vllm-dflash,ours", "concurrency": "1,8", "num_prompts": 2, "max_tokens": 32,
                     "waves": 1, "name": "bench_serving_quick", "threads": 1, "cpu_bind": "auto"}}
# Our plugin's own env knobs: unset in every server unless a configuration sets them (no leaks from the shell).
PLUGIN_ENV = tuple(n for k in ("diffusion_steps", "confidence_threshold", "metrics_dir", "overlap", "kv_injection",
                                "adaptive", "cpu_gemv", "cpu_gemm_f32")
                   for n in (settings.env_name(k), settings.deprecated_env_name(k))) + ("DFLASH_VLLM_EXTRAS",)
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


def add_arguments(p: argparse.ArgumentParser, out_dir_default: str = DEFAULT_OUT_DIR) -> None:
    """The bench flags. `out_dir_default`: --out-dir's default (a relative path is under the current directory)."""
    q = PRESETS["quick"]
    p.add_argument("--quick", action="store_true", help=f"small run (< 10 min on 2 cores): configs {q['configs']}, "
                   f"concurrency {q['concurrency']}, {q['num_prompts']} prompts, {q['max_tokens']} tokens")
    p.add_argument("--target", default=None, help="target folder (default: SmolLM2-135M-Instruct, prepared once)")
    p.add_argument("--draft", default=None, help="DFlash draft folder, or 'untrained' for a random draft shaped for "
                   "the target (flagged UNTRAINED in the results) (default: the trained draft of a source checkout, "
                   "models/SmolLM2-135M-Instruct-DFlash-b8, default target only; an error names the fix when it is "
                   "missing)")
    p.add_argument("--hinted-draft", default=None, help="the hinted draft (dflash_config.hint_ngram) that the "
                   "ours-hinted configuration serves (default: models/SmolLM2-135M-Instruct-DFlash-b8-hinted of a "
                   "source checkout, default target only)")
    p.add_argument("--configs", default=None, help=f"comma list of {list(REGISTRY)}; NAME@mp serves NAME with vLLM's "
                   "worker process (--distributed-executor-backend mp), NAME@onednn with vLLM's oneDNN GEMM, "
                   "NAME#LABEL is a labelled copy of NAME for A/Bs of --spec-extra / --env overrides "
                   f"(default: all; quick: {q['configs']})")
    p.add_argument("--prompt-sets", default="humaneval,chat",
                   help="comma list: humaneval (chat-wrapped), chat (held-out web chats, never trained on), open-chat "
                        "(held-out ShareGPT first turns; open-chat/CATEGORY for one category), math (held-out "
                        "GSM-Symbolic templates), or JSONL files")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature of every request (0: greedy; above 0 the outputs are not compared with "
                        "`none`, since sampled outputs differ run to run)")
    p.add_argument("--concurrency", default=None, help="comma list of requests in flight (default 1,8,32; quick 1,8)")
    p.add_argument("--num-prompts", default=None,
                   help="prompts per run = max(this, --waves x concurrency): one number, or one per concurrency "
                   "level (e.g. 32,72,96) (default 16; quick 2)")
    p.add_argument("--waves", type=int, default=None,
                   help="a run (and an interleaved round) holds at least this many x concurrency prompts, so the "
                   "batch stays full most of the run instead of draining with its slowest request (bench/levels.py; "
                   f"1 = a single wave) (default {levels_mod.DEFAULT_WAVES}; quick 1)")
    p.add_argument("--max-tokens", type=int, default=None, help="max output tokens per request (default 256; quick 32)")
    p.add_argument("--ignore-eos", action="store_true", help="always generate max_tokens")
    p.add_argument("--num-spec-tokens", type=int, default=None, help="DFlash drafts per step (default: block size - 1)")
    p.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of every server (default: every core, "
                   f"{PRESETS['full']['threads']} here; quick: 1)")
    p.add_argument("--cpu-bind", default=None, help="VLLM_CPU_OMP_THREADS_BIND of every server; 'auto' = vLLM's default "
                   f"layout (the model on one core) (default: every core to the model, {_ALL_CORES} here; quick: auto)")
    p.add_argument("--kv-cache-gib", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE of every server")
    p.add_argument("--max-model-len", type=int, default=2048, help="vLLM's max_model_len of every server")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="vLLM's max_num_seqs of every server (default: the largest concurrency)")
    p.add_argument("--dtype", default=None, help="model dtype of every server (default: the machine's fastest: bfloat16 "
                   "with avx512_bf16, else float32)")
    p.add_argument("--cpu-gemv", default=None, metavar="OFF|AUTO|ROWS",
                   help="DFLASH_CPU_GEMV of every server: bf16 linear calls with up to this many rows on our skinny-GEMM "
                   "kernel (docs/CONFIGURATION.md) (default: the setting's default, off)")
    p.add_argument("--enforce-eager", action="store_true",
                   help="run every server eager (default: vLLM's default, torch.compile; ~1-2 min more start-up each)")
    p.add_argument("--spec-extra", action="append", default=[], metavar="CONFIG:KEY=VALUE",
                   help="extra speculative-config key for one configuration (JSON value), repeatable")
    p.add_argument("--env", action="append", default=[], metavar="CONFIG:KEY=VALUE",
                   help="extra server env var for one configuration, repeatable")
    p.add_argument("--out-dir", default=out_dir_default,
                   help="results folder: <name>.json, <name>.md, plots (default: %(default)s, relative to the current "
                        "directory)")
    p.add_argument("--name", default=None, help="output file stem (default bench_serving / bench_serving_quick)")
    p.add_argument("--log-dir", default=None, help="server logs (default: <out-dir>/logs/<name>)")
    p.add_argument("--start-timeout", type=float, default=1200.0, help="seconds for a server to become healthy")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                   help="every configuration's server up at once; per prompt set and concurrency the configurations "
                        "run back to back, the prompts split into up to ROUNDS rounds (each keeps >= concurrency "
                        "prompts) in a rotated order, so a machine whose speed drifts slows them alike. Memory: every "
                        "server at once (about --kv-cache-gib + 2 GiB each) (default: 0, one server after another)")
    p.add_argument("--min-rounds", type=int, default=1, metavar="R",
                   help="with --interleave: a level whose prompts split into fewer than R rounds sends all of them "
                        "in each of R rounds instead, so it too gets paired per-round speed-ups (their spread is "
                        "the machine's drift; R x the level's time) (default: 1)")
    p.add_argument("--fail-on-mismatch", action="store_true",
                   help="exit 3 when a greedy output differs from none beyond a numerical near-tie (float32: any "
                        "difference; bf16: a top-2 logprob margin above vllm_dflash.exactness.NEAR_TIE_NATS)")


def _csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def load_prompt_set(name: str, n: int) -> list[dict[str, Any]]:
    """n chat items of a prompt set. 'chat' is the held-out split of the chat-web source (never trained on)."""
    from vllm_dflash.data.prompts import get_prompts

    items = get_prompts(name, n)
    if name == "chat":
        from vllm_dflash.data.sources import split_of

        assert all(split_of(it["id"]) == "eval" for it in items), "chat eval prompts must come from the held-out split"
    return [it if "messages" in it else {**it, "messages": [{"role": "user", "content": it["prompt"]}]} for it in items]


def resolve_draft(draft: str | None, target: Path, default_target: bool = True) -> tuple[Path, bool]:
    """(draft folder, trained?) for --draft: a folder (must exist), 'untrained', or None: the trained draft of a
    source checkout (default target only; a clear error with the fix when it is missing)."""
    from vllm_dflash.drafts import resolve_draft_arg

    path, untrained = resolve_draft_arg(draft, target, default_target=default_target)
    if untrained:
        logger.warning("benchmarking an UNTRAINED draft (%s): expect τ ≈ 1", path)
    return path, not untrained


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


def _losslessness(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per configuration: identical / compared, near-ties (bf16 numerics, explained) and real differences."""
    per: dict[str, dict[str, Any]] = {}
    for r in runs:
        if r.get("vs_baseline"):
            v = per.setdefault(r["config"], {"identical": 0, "compared": 0, "near_ties": 0, "real": 0, "unjudged": 0,
                                             "margins": []})
            ex = r.get("exactness")
            if ex:  # judged on the servers' token ids (or the texts where a run has none)
                for k in ("identical", "compared", "near_ties", "real", "unjudged"):
                    v[k] += ex.get(k, 0)
                v["margins"] += [d["margin"] for d in ex.get("divergences", []) if d["near_tie"]]
            else:  # not judged: every text difference counts as real
                v["identical"] += r["vs_baseline"]["identical"]
                v["compared"] += r["vs_baseline"]["compared"]
                v["real"] += r["vs_baseline"]["compared"] - r["vs_baseline"]["identical"]
    return {"per_config": per, "mismatches": sum(v["compared"] - v["identical"] for v in per.values()),
            "real": sum(v["real"] for v in per.values()), "unjudged": sum(v["unjudged"] for v in per.values())}


def _machine() -> dict[str, Any]:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "?")
    return {"cpu": cpu, "cores": os.cpu_count(), "loadavg_start": [round(x, 2) for x in os.getloadavg()]}


def _version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "?"


def _gemm_f32_meta(dtype: str) -> str:
    """What DFLASH_CPU_GEMM_F32 (unset in the servers: its default) means for this run's float32 linear layers."""
    from vllm_dflash.integration.patches.cpu_gemv import NO_LIMIT, f32_rows
    from vllm_dflash.ops.gemm_f32 import gemm_f32_supported

    value = settings.PROCESS_FIELDS["cpu_gemm_f32"].default
    rows = f32_rows(value) if gemm_f32_supported() else 0
    what = "off" if rows <= 0 else "every call on our AVX2 GEMM" if rows >= NO_LIMIT else f"<= {rows} rows on ours"
    return f"{value} ({what}{'' if dtype == 'float32' else '; applies to float32 only'})"


def _meta(a: argparse.Namespace, target: Path, draft: Path | None, trained: bool, k: int | None, levels: list[int],
          prompt_sets: list[str], dtype: str, max_num_seqs: int) -> dict[str, Any]:
    return {"name": a.name, "quick": a.quick, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "target": str(target), "draft": str(draft) if draft else None, "draft_trained": trained,
            "num_speculative_tokens": k, "prompt_sets": prompt_sets, "num_prompts": a.num_prompts,
            "waves": a.waves, "prompts_per_run": {str(c): n for c, n in a.prompts_per_run.items()},
            "concurrency": levels, "max_tokens": a.max_tokens, "ignore_eos": a.ignore_eos, "temperature": a.temperature,
            "engine": {"dtype": dtype, "enforce_eager": a.enforce_eager, "max_model_len": a.max_model_len,
                       "max_num_seqs": max_num_seqs, "kv_cache_gib": a.kv_cache_gib,
                       "cpu_gemv": settings.parse_value("cpu_gemv", a.cpu_gemv) if a.cpu_gemv is not None
                       else settings.PROCESS_FIELDS["cpu_gemv"].default,
                       "cpu_gemm_f32": _gemm_f32_meta(dtype)},
            "layout": {"omp_num_threads": a.threads,
                       "cpu_bind": a.cpu_bind or os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto (vLLM default)"),
                       "ld_preload": os.environ.get("LD_PRELOAD", ""),
                       "description": (LAYOUT_INTERLEAVED.format(rounds=a.interleave, waves=a.waves) if a.interleave
                                       else LAYOUT)},
            "interleave": a.interleave, "min_rounds": a.min_rounds,
            "spec_extra": list(a.spec_extra), "env_extra": list(a.env),
            "machine": _machine(),
            "versions": {"vllm_dflash": _version("vllm-dflash"), "vllm": _version("vllm"), "torch": _version("torch")}}


def own_f32_gemm(cfg: BenchConfig, dtype: str) -> bool:
    """Do this configuration's float32 linear layers run on our GEMM (DFLASH_CPU_GEMM_F32 on this CPU), while stock
    `none` runs oneDNN's? Only in a server where the plugin acts: a DFlash engine with our drafter, or the opt-in
    DFLASH_VLLM_EXTRAS=all."""
    from vllm_dflash.integration.patches.cpu_gemv import runs_own_f32_gemm

    if cfg.stock or dtype != "float32":
        return False
    ours = cfg.env.get("DFLASH_DRAFTER", cfg.spec_extra.get("drafter", "ours")) == "ours"
    if not (cfg.env.get("DFLASH_VLLM_EXTRAS") == "all" or (cfg.method == "dflash" and ours)):
        return False
    return runs_own_f32_gemm(cfg.env.get("DFLASH_CPU_GEMM_F32", settings.PROCESS_FIELDS["cpu_gemm_f32"].default))


def _exactness(server: Any, tokenizer: Any, items: list[dict[str, Any]], base: dict[str, Any],
               run: dict[str, Any], kernels_differ: bool = False) -> dict[str, Any]:
    """Greedy outputs vs `none` on the same prompts; each difference explained by the target's top-2 logprob margin
    at its first differing token (vllm_dflash.exactness: float32 must be identical, bf16 may differ at near-ties;
    kernels_differ: float32 through our GEMM against stock oneDNN, near-ties within F32_KERNELS_NATS).
    Compared on the servers' token ids where both runs have them (else on the re-encoded text)."""
    from vllm_dflash.exactness import explain, server_ids, summarize

    by_id = {it["id"]: it for it in items}
    outputs, tok = run["outputs"], run.get("token_ids") or {}
    ids = [i for i in outputs if i in base["outputs"]]
    divs = []
    for i in ids:  # explain: None when the outputs are identical
        a, b = (base["token_ids"].get(i) or {}), (tok.get(i) or {})
        d = explain(server.url, tokenizer, by_id[i], base["outputs"][i], outputs[i], server.dtype,
                    ids=server_ids(a.get("prompt"), a.get("output"), b.get("output")), kernels_differ=kernels_differ)
        if d:
            divs.append(d)
    return summarize(len(ids), divs, server.dtype, kernels_differ)


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
        run["exactness"] = _exactness(server, tokenizer, items, baseline[key], run, own_f32_gemm(cfg, server.dtype))
    run.pop("token_ids", None)  # compared above; not stored (the texts are)
    print(f"[{time.time() - t_start:6.0f}s] {cfg.name:13s} {run['prompt_set']:10s} c{run['concurrency']:<3d} "
          + (f"{run['output_tok_s']:7.1f} tok/s  tau {_tau(run)}" if run["ok"] else run["error"]), flush=True)
    return run


def _bench_config(server: Any, cfg: BenchConfig, entry: dict[str, Any], prompts: dict[str, list[dict[str, Any]]],
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


def _bench_interleaved(servers: dict[str, Any], cfgs: dict[str, BenchConfig], entries: dict[str, dict[str, Any]],
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


def _write(result: dict[str, Any], out_dir: Path, name: str, plots: bool) -> None:
    from vllm_dflash.bench import report

    out_dir.mkdir(parents=True, exist_ok=True)
    prefix = out_dir / name
    prefix.with_suffix(".json").write_text(json.dumps(result, indent=1))
    prefix.with_suffix(".md").write_text(report.render_markdown(result))
    pngs = report.plot(result, prefix) if plots else []
    print("\n" + report.render_table(result["runs"]) + "\n")
    for p in [prefix.with_suffix(".json"), prefix.with_suffix(".md"), *pngs]:
        print(f"wrote {p}")


def run_from_args(a: argparse.Namespace) -> int:
    from vllm_dflash.serve.server import Server
    from vllm_dflash.target import resolve_target
    from vllm_dflash.utils import default_dtype

    import signal

    def _terminate(signum, frame):  # SIGTERM unwinds like Ctrl-C, so the running server is stopped (finally:)
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _terminate)
    preset = PRESETS["quick" if a.quick else "full"]
    for k in ("configs", "concurrency", "num_prompts", "waves", "max_tokens", "name", "threads", "cpu_bind"):
        if getattr(a, k) is None:
            setattr(a, k, preset[k])
    if a.cpu_bind == "auto":
        a.cpu_bind = None  # vLLM's own choice
    levels = sorted({int(c) for c in _csv(a.concurrency)})
    configs = select(_csv(a.configs), a.spec_extra, a.env)
    prompt_sets = _csv(a.prompt_sets)
    t_start = time.time()
    target = resolve_target(a.target)
    draft, trained, k = None, True, a.num_spec_tokens
    if any(c.uses_draft for c in configs):
        from vllm_dflash.config import DFlashConfig
        from vllm_dflash.target import DEFAULT_TARGET_NAME

        draft, trained = resolve_draft(a.draft, target, default_target=a.target in (None, "", "default",
                                                                                    DEFAULT_TARGET_NAME))
        k = k or DFlashConfig.from_pretrained(draft).block_size - 1
    hinted = None
    if any(c.hinted for c in configs):
        hinted = Path(a.hinted_draft) if a.hinted_draft else Path(str(draft) + "-hinted")
        if not (hinted / "config.json").exists() or DFlashConfig.from_pretrained(hinted).hint_ngram is None:
            raise ValueError(f"bench: ours-hinted needs a hinted draft; {str(hinted)!r} is not one (no config.json "
                             "with dflash_config.hint_ngram). Fix: --hinted-draft <folder of a draft trained with "
                             "`vllm-dflash train --hints 2 4`>")
    a.prompts_per_run = levels_mod.prompts_per_run(levels, levels_mod.parse_num_prompts(a.num_prompts, levels),
                                                   a.waves)
    need = levels_mod.prompts_needed(a.prompts_per_run)  # the largest level + the warm-up prompt
    prompts = {ps: load_prompt_set(ps, need) for ps in prompt_sets}
    for ps, items in prompts.items():
        if len(items) < need:
            raise ValueError(f"bench: prompt set {ps!r} has {len(items)} prompts; {a.prompts_per_run} prompts per "
                             f"level (--num-prompts {a.num_prompts}, --waves {a.waves}) need {need}. Fix: fewer "
                             "prompts, fewer --waves or lower concurrency")
    max_num_seqs, dtype = a.max_num_seqs or max(levels), a.dtype or default_dtype()
    log_dir = Path(a.log_dir or Path(a.out_dir) / "logs" / a.name)
    log_dir.mkdir(parents=True, exist_ok=True)
    base_env: dict[str, str | None] = {"OMP_NUM_THREADS": str(a.threads), "VLLM_CPU_KVCACHE_SPACE": str(a.kv_cache_gib),
                                       "TOKENIZERS_PARALLELISM": "false", **{e: None for e in PLUGIN_ENV},
                                       "DFLASH_PROFILE": "1",  # target forward timed (with our drafter)
                                       "VLLM_SERVER_DEV_MODE": "1"}  # /reset_prefix_cache before each wave (waves.py)
    if a.cpu_bind:
        base_env["VLLM_CPU_OMP_THREADS_BIND"] = a.cpu_bind
    if a.cpu_gemv is not None:
        settings.parse_value("cpu_gemv", a.cpu_gemv)  # a bad value fails here, naming the setting, not in a server
        base_env[settings.env_name("cpu_gemv")] = a.cpu_gemv
    meta = _meta(a, target, draft, trained, k, levels, prompt_sets, dtype, max_num_seqs)
    meta["hinted_draft"] = str(hinted) if hinted else None
    hw, size = _hardware(target, dtype, a.threads)  # the first reading, while the machine is quiet
    result: dict[str, Any] = {"meta": meta, "configs": {}, "runs": []}
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(target))
    baseline: dict[tuple[str, int], dict[str, str]] = {}
    configs = sorted(configs, key=lambda c: c.name != "none")  # `none` first: the others are explained against it
    servers: dict[str, Any] = {}
    for cfg in configs:
        spec = cfg.speculative_config(str(hinted if cfg.hinted else draft) if draft else None, k)
        entry = result["configs"][cfg.name] = {"description": cfg.description, "speculative_config": spec,
                                               "env": dict(cfg.env), "server_args": list(cfg.server_args),
                                               "status": "ok", "reason": None}
        reason = cfg.unavailable_reason()
        if reason:
            entry.update(status="unavailable", reason=reason)
            logger.warning("bench: %s unavailable: %s", cfg.name, reason)
            continue
        server = Server(str(target), speculative_config=spec,
                        extra_args=["--max-num-seqs", str(max_num_seqs), *cfg.server_args],
                        env={**base_env, **cfg.env}, max_model_len=a.max_model_len, dtype=dtype,
                        enforce_eager=a.enforce_eager,
                        log_path=str(log_dir / f"{cfg.name}.log"))
        if a.interleave:
            servers[cfg.name] = server
        else:
            result["runs"] += _bench_config(server, cfg, entry, prompts, levels, a, t_start, baseline, tokenizer)
    if a.interleave:
        result["runs"] = _bench_interleaved(servers, {c.name: c for c in configs}, result["configs"], prompts, levels,
                                            a, t_start, baseline, tokenizer)
    stats.attach_baseline(result["runs"], compare=a.temperature == 0)
    # measured again with every server stopped; the better reading of each side counts (a disturbed 60 ms of
    # GEMMs once read 29 GFLOP/s against 150 on the same machine)
    hw = limit.better(hw, _hardware(target, dtype, a.threads)[0])
    meta["limit"] = limit.hardware_record(hw, size, limit.l3_bytes())
    attach_limits(result, hw, size)
    result["losslessness"] = _losslessness(result["runs"])
    meta["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    meta["elapsed_s"] = round(time.time() - t_start, 1)
    _write(result, Path(a.out_dir), a.name, not a.no_plots)
    mism, real = result["losslessness"]["mismatches"], result["losslessness"]["real"]
    unj = result["losslessness"]["unjudged"]
    if mism:
        print(f"LOSSLESSNESS: {mism} greedy output(s) differ from `none` ({mism - real - unj} at numerical near-ties "
              f"of the target in {dtype}, {real} real, {unj} not judged; see the markdown)" + ("" if real else
              ". Run with --dtype float32 for token-exact outputs"))
    print(f"elapsed {meta['elapsed_s']:.0f}s")
    if not any(r.get("ok") for r in result["runs"]):
        return 1
    return 3 if real and a.fail_on_mismatch else 0


def _hardware(target: Path, dtype: str, threads: int) -> tuple[limit.Hardware, limit.ModelSize]:
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


def _tau(run: dict[str, Any]) -> str:
    tau = (run.get("spec_decode") or {}).get("tau")
    return "–" if tau is None else f"{tau:.2f}"


def main(argv: list[str] | None = None, out_dir_default: str = DEFAULT_OUT_DIR) -> int:
    """benchmarks/bench_serving.py's entry point; `out_dir_default` lets a script keep its own results folder."""
    from vllm_dflash.utils import HelpFormatter

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    p = argparse.ArgumentParser(prog="bench_serving", description=__doc__, formatter_class=HelpFormatter)
    add_arguments(p, out_dir_default)
    return run_from_args(p.parse_args(argv))
