#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""Host cost of cross-request lookup per engine step (review NEW-2): N live requests of L tokens each, every step
one new token per request, and per request what the controller does each step (adaptive/controller.py `_lookup`):
`lookup` of its suffix, then `observe` of its history. Runs the index at the setting's default capacity (100,000
tokens: 64 x 2k = 128k live tokens are over it, evicting every few steps) and at a capacity above the live tokens.

    python benchmarks/cross_lookup_cost.py            # 64 requests x 2,048 tokens, 300 steps
    python benchmarks/cross_lookup_cost.py --quick

Writes benchmarks/results/cross_lookup_cost.json and prints a table: µs per step (all requests), the
thread's CPU time by default (robust on a shared machine), with the CPU model."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from vllm_dflash.adaptive.cross_lookup import CrossRequestIndex
from vllm_dflash.utils import cpu_kind

OUT = Path(__file__).resolve().parent / "results" / "cross_lookup_cost.json"


def measure(make_index, requests: int, tokens: int, steps: int, warmup: int, vocab: int, k: int, clock: str,
            seed: int = 0) -> dict:
    """Per-step cost of lookup + observe over `requests` live requests (µs), after building them (prefill)."""
    rng = np.random.default_rng(seed)
    now = time.thread_time_ns if clock == "cpu" else time.perf_counter_ns
    hists = rng.integers(0, vocab, (requests, tokens + warmup + steps), dtype=np.int64)
    ids = [f"req-{i}" for i in range(requests)]
    ix = make_index()
    t0 = now()
    for i, rid in enumerate(ids):
        ix.observe(rid, hists[i, :tokens])
    prefill_us = (now() - t0) / 1e3
    per_step = []
    for s in range(warmup + steps):
        L = tokens + s + 1
        t0 = now()
        for i, rid in enumerate(ids):
            h = hists[i, :L]
            ix.lookup(h, k)
            ix.observe(rid, h)
        if s >= warmup:
            per_step.append((now() - t0) / 1e3)
    us = np.asarray(per_step)
    return {"mean_us": float(us.mean()), "p50_us": float(np.percentile(us, 50)), "p90_us": float(np.percentile(us, 90)),
            "p99_us": float(np.percentile(us, 99)), "max_us": float(us.max()),
            "us_per_request_step": float(us.mean() / requests), "prefill_us": prefill_us,
            "held_tokens_end": int(getattr(ix, "tokens", -1))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--tokens", type=int, default=2048, help="tokens of each live request at the start")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--vocab", type=int, default=32_000)
    p.add_argument("--k", type=int, default=7, help="tokens a lookup returns at most (num_speculative_tokens)")
    p.add_argument("--capacities", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    p.add_argument("--quick", action="store_true", help="16 requests x 512 tokens, 100 steps")
    p.add_argument("--out", default=str(OUT))
    a = p.parse_args(argv)
    if a.quick:
        a.requests, a.tokens, a.steps = 16, 512, 100
    load = [round(x, 2) for x in os.getloadavg()]  # a shared machine: CPU time inflates under load too
    rows = []
    for cap in a.capacities:
        r = measure(lambda cap=cap: CrossRequestIndex(cap), a.requests, a.tokens, a.steps, a.warmup, a.vocab, a.k,
                    a.clock)
        rows.append({"capacity": cap, "live_tokens": a.requests * a.tokens, **r})
    meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "cpu": cpu_kind(), "loadavg_start": load, "clock": a.clock,
            "requests": a.requests, "tokens": a.tokens,
            "steps": a.steps, "warmup": a.warmup, "vocab": a.vocab, "k": a.k,
            "command": " ".join(["python benchmarks/cross_lookup_cost.py", *(sys.argv[1:] if argv is None else argv)])}
    lines = [f"cross-request lookup, lookup + observe per engine step ({a.requests} live requests, one new token "
             f"each; {a.clock} time; {meta['cpu']})", "",
             "| capacity | live tokens | mean µs/step | p50 | p90 | p99 | max | µs/request-step |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['capacity']:,} | {r['live_tokens']:,} | {r['mean_us']:.0f} | {r['p50_us']:.0f} | "
                     f"{r['p90_us']:.0f} | {r['p99_us']:.0f} | {r['max_us']:.0f} | {r['us_per_request_step']:.1f} |")
    table = "\n".join(lines)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
