# SPDX-License-Identifier: Apache-2.0
"""The flags of `vllm-dflash bench` and benchmarks/bench_serving.py, and the presets (--quick and the full run)
that fill the ones left unset."""
from __future__ import annotations

import argparse
import os

from vllm_dflash.bench import levels as levels_mod
from vllm_dflash.bench.configs import DEFAULT_CONFIGS, REGISTRY

# Results and server logs go under the current directory unless --out-dir / --log-dir say otherwise (never into the
# package's own folder: an installed package has no source tree).
DEFAULT_OUT_DIR = "bench-results"
# --quick and the full run differ only in these defaults (an explicit flag wins in both).
# Quick: each `vllm serve` start costs 1-3 min on 2 busy cores, so it runs stock vLLM, vLLM's own DFlash drafter and
# `ours`, our drafter as deployed (the default: adaptive drafting), and leaves out ngram and `ours-fixed`.
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
    p.add_argument("--configs", default=None, help=f"comma list of {list(REGISTRY)} (`ours`: our default, adaptive "
                   "drafting; `ours-fixed`: the paper's fixed block); NAME@mp serves NAME with vLLM's worker process "
                   "(--distributed-executor-backend mp), NAME@onednn with vLLM's oneDNN GEMM, "
                   "NAME#LABEL is a labelled copy of NAME for A/Bs of --spec-extra / --env overrides "
                   f"(default: all; quick: {q['configs']})")
    p.add_argument("--prompt-sets", default="humaneval,chat",
                   help="comma list: humaneval (chat-wrapped), chat (held-out web chats, never trained on), open-chat "
                        "(held-out ShareGPT first turns; open-chat/CATEGORY for one category), math (held-out "
                        "GSM-Symbolic templates), or JSONL files")
    p.add_argument("--export-prompts", nargs=2, default=None, metavar=("SET", "OUT"),
                   help="write prompt set SET (a --prompt-sets name or JSONL file), in order, to the file OUT as the "
                        "ShareGPT JSON that `vllm bench serve --dataset-name sharegpt` reads, and exit "
                        "(docs/BENCHMARKS-VLLM.md)")
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
    p.add_argument("--cpu-bind", default=None, help="VLLM_CPU_OMP_THREADS_BIND of every server; 'auto' = vLLM's "
                   "default layout (the model on one core) (default: every core to the model, "
                   f"{_ALL_CORES} here; quick: auto)")
    p.add_argument("--kv-cache-gib", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE of every server")
    p.add_argument("--max-model-len", type=int, default=2048, help="vLLM's max_model_len of every server")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="vLLM's max_num_seqs of every server (default: the largest concurrency)")
    p.add_argument("--dtype", default=None, help="model dtype of every server (default: the machine's fastest: "
                   "bfloat16 with avx512_bf16, else float32)")
    p.add_argument("--cpu-gemv", default=None, metavar="OFF|AUTO|ROWS",
                   help="DFLASH_CPU_GEMV of every server: bf16 linear calls with up to this many rows on our "
                   "skinny-GEMM kernel (docs/CONFIGURATION.md) (default: the setting's default, off)")
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


def csv_list(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]
