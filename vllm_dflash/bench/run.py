# SPDX-License-Identifier: Apache-2.0
"""The serving benchmark driver: for each configuration, start a real `vllm serve` on loopback, warm it
up, then drive it with concurrent streaming chat clients for every prompt set and concurrency level,
scraping `/metrics` before and after each run. Writes <out-dir>/<name>.json, <name>.md and PNG plots;
server logs go to <log-dir>. The CLI flags are in args.py (`vllm-dflash bench` and
benchmarks/bench_serving.py share them); the runs in drive.py."""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from vllm_dflash import settings
from vllm_dflash.bench import levels as levels_mod
from vllm_dflash.bench import limit, stats
from vllm_dflash.bench.args import DEFAULT_OUT_DIR, PRESETS, add_arguments, csv_list
from vllm_dflash.bench.configs import select
from vllm_dflash.bench.drive import bench_config, bench_interleaved
from vllm_dflash.bench.lossless import losslessness, own_f32_gemm  # noqa: F401 (own_f32_gemm: re-exported)
from vllm_dflash.bench.meta import attach_limits, build_meta, hardware
from vllm_dflash.utils import get_logger

logger = get_logger(__name__)

# Our plugin's own env knobs: unset in every server unless a configuration sets them (no leaks from the shell).
PLUGIN_ENV = tuple(n for k in ("diffusion_steps", "confidence_threshold", "metrics_dir", "overlap", "kv_injection",
                                "adaptive", "cpu_gemv", "cpu_gemm_f32")
                   for n in (settings.env_name(k), settings.deprecated_env_name(k))) + ("DFLASH_VLLM_EXTRAS",)


def load_prompt_set(name: str, n: int | None) -> list[dict[str, Any]]:
    """n chat items of a prompt set (None: all). 'chat' is the held-out split of the chat-web source (never trained
    on)."""
    from vllm_dflash.data.prompts import get_prompts

    items = get_prompts(name, n)
    if name == "chat":
        from vllm_dflash.data.sources import split_of

        assert all(split_of(it["id"]) == "eval" for it in items), "chat eval prompts must come from the held-out split"
    return [it if "messages" in it else {**it, "messages": [{"role": "user", "content": it["prompt"]}]} for it in items]


def export_prompts(name: str, out: str) -> int:
    """Write a prompt set, in order, as the ShareGPT JSON that `vllm bench serve --dataset-name sharegpt` reads: the
    human turn is the prompt, sent as the one user message of a chat request, as this bench sends it; the gpt turn
    stays empty (--sharegpt-output-len sets the output length). docs/BENCHMARKS-VLLM.md."""
    rows = []
    for it in load_prompt_set(name, None):
        roles = [m["role"] for m in it["messages"]]
        if roles != ["user"]:
            raise ValueError(f"bench: prompt {it['id']!r} of {name!r} has the turns {roles}; the ShareGPT form sends "
                             "one user message. Fix: export a set of single-turn prompts")
        rows.append({"id": it["id"], "conversations": [{"from": "human", "value": it["messages"][0]["content"]},
                                                       {"from": "gpt", "value": ""}]})
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wrote {len(rows)} prompts of {name} to {path}")
    return 0


def resolve_draft(draft: str | None, target: Path, default_target: bool = True) -> tuple[Path, bool]:
    """(draft folder, trained?) for --draft: a folder (must exist), 'untrained', or None: the trained draft of a
    source checkout (default target only; a clear error with the fix when it is missing)."""
    from vllm_dflash.drafts import resolve_draft_arg

    path, untrained = resolve_draft_arg(draft, target, default_target=default_target)
    if untrained:
        logger.warning("benchmarking an UNTRAINED draft (%s): expect τ ≈ 1", path)
    return path, not untrained


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
    import signal

    from vllm_dflash.serve.server import Server
    from vllm_dflash.target import resolve_target
    from vllm_dflash.utils import default_dtype

    def _terminate(signum, frame):  # SIGTERM unwinds like Ctrl-C, so the running server is stopped (finally:)
        raise KeyboardInterrupt(f"signal {signum}")

    if a.export_prompts:
        return export_prompts(*a.export_prompts)
    signal.signal(signal.SIGTERM, _terminate)
    preset = PRESETS["quick" if a.quick else "full"]
    for k in ("configs", "concurrency", "num_prompts", "waves", "max_tokens", "name", "threads", "cpu_bind"):
        if getattr(a, k) is None:
            setattr(a, k, preset[k])
    if a.cpu_bind == "auto":
        a.cpu_bind = None  # vLLM's own choice
    levels = sorted({int(c) for c in csv_list(a.concurrency)})
    configs = select(csv_list(a.configs), a.spec_extra, a.env)
    prompt_sets = csv_list(a.prompt_sets)
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
    meta = build_meta(a, target, draft, trained, k, levels, prompt_sets, dtype, max_num_seqs)
    meta["hinted_draft"] = str(hinted) if hinted else None
    hw, size = hardware(target, dtype, a.threads)  # the first reading, while the machine is quiet
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
            result["runs"] += bench_config(server, cfg, entry, prompts, levels, a, t_start, baseline, tokenizer)
    if a.interleave:
        result["runs"] = bench_interleaved(servers, {c.name: c for c in configs}, result["configs"], prompts, levels,
                                           a, t_start, baseline, tokenizer)
    stats.attach_baseline(result["runs"], compare=a.temperature == 0)
    # measured again with every server stopped; the better reading of each side counts (a disturbed 60 ms of
    # GEMMs once read 29 GFLOP/s against 150 on the same machine)
    hw = limit.better(hw, hardware(target, dtype, a.threads)[0])
    meta["limit"] = limit.hardware_record(hw, size, limit.l3_bytes())
    attach_limits(result, hw, size)
    result["losslessness"] = losslessness(result["runs"])
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


def main(argv: list[str] | None = None, out_dir_default: str = DEFAULT_OUT_DIR) -> int:
    """benchmarks/bench_serving.py's entry point; `out_dir_default` lets a script keep its own results folder."""
    from vllm_dflash.utils import HelpFormatter

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    p = argparse.ArgumentParser(prog="bench_serving", description=__doc__, formatter_class=HelpFormatter)
    add_arguments(p, out_dir_default)
    return run_from_args(p.parse_args(argv))
