# SPDX-License-Identifier: Apache-2.0
"""Pooled speed of twin servers: a configuration served by several processes in one interleaved run.

Two processes of one engine differ by up to ~8 % in speed for their whole life (dev/process_spread.py: six processes
of one configuration averaged 237-278 tok/s on a 2-core EPYC, each staying fast or slow across its waves), and
interleaved rounds do not average that out: each configuration has one server. A run that serves a configuration
twice or more (`NAME` and `NAME#p2`, `NAME#p3`, ...: labelled copies, bench/configs.py) measures that offset and pools
it: a pool's output tokens/s is its processes' tokens over their time, and its round-by-round ratio to another pool
is the mean of its processes' round rates over the other's. Each process's own ratio is kept, so the spread between
twins shows how far one server per configuration could have been off.

    python benchmarks/pooled.py RESULT.json [--baseline none+extras]"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from vllm_dflash.bench.configs import LABEL_SEP

POOL_LABEL = "p"  # NAME#p2, NAME#p3: more processes of NAME (labelled copies: bench/configs.py LABEL_SEP)


def pool_name(config: str) -> str:
    """`ours#p2` -> `ours`; any other name unchanged (`ours#s50` is another configuration, not a twin)."""
    base, sep, label = config.partition(LABEL_SEP)
    twin = sep and label.startswith(POOL_LABEL) and label[len(POOL_LABEL):].isdigit()
    return base if twin else config


def pool_runs(runs: list[dict[str, Any]]) -> dict[tuple[str, int, str], dict[str, Any]]:
    """(prompt set, concurrency, pool) -> {"members": [config, ...], "tok_s": pooled output tokens/s, "rounds":
    [mean of the members' round tok/s] or None, "member_tok_s": {config: tok/s}}. Failed runs are left out."""
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        if r.get("ok") and r.get("wall_s"):
            groups[(r["prompt_set"], int(r["concurrency"]), pool_name(r["config"]))].append(r)
    out = {}
    for key, members in groups.items():
        rounds = [m.get("round_tok_s") for m in members]
        same = all(rounds) and len({len(x) for x in rounds}) == 1
        out[key] = {
            "members": [m["config"] for m in members],
            "tok_s": sum(m["output_tokens"] for m in members) / sum(m["wall_s"] for m in members),
            "rounds": [sum(col) / len(col) for col in zip(*rounds)] if same else None,
            "member_tok_s": {m["config"]: m["output_tok_s"] for m in members},
        }
    return out


def pooled_ratios(pools: dict[tuple[str, int, str], dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """Every pool against the baseline pool of its prompt set and concurrency: pooled ratio, round-by-round ratios,
    and each member's own ratio to the pooled baseline."""
    rows = []
    for (ps, c, name), p in sorted(pools.items()):
        base = pools.get((ps, c, baseline))
        if base is None or name == baseline:
            continue
        rr = None
        if p["rounds"] and base["rounds"] and len(p["rounds"]) == len(base["rounds"]):
            rr = [a / b for a, b in zip(p["rounds"], base["rounds"])]
        rows.append({"prompt_set": ps, "concurrency": c, "pool": name, "processes": len(p["members"]),
                     "ratio": p["tok_s"] / base["tok_s"], "rounds": rr,
                     "members": {m: t / base["tok_s"] for m, t in p["member_tok_s"].items()},
                     "baseline_members": {m: t / base["tok_s"] for m, t in base["member_tok_s"].items()}})
    return rows


def render(rows: list[dict[str, Any]], baseline: str) -> str:
    lines = [f"| prompts | c | pool (processes) | over {baseline} (pooled) | rounds min–max | each process | "
             f"each {baseline} process |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        rounds = f"{min(r['rounds']):.2f}–{max(r['rounds']):.2f}" if r["rounds"] else "–"
        each = ", ".join(f"{m} {v:.2f}" for m, v in r["members"].items())
        base = ", ".join(f"{m} {v:.2f}" for m, v in r["baseline_members"].items())
        lines.append(f"| {r['prompt_set']} | {r['concurrency']} | {r['pool']} ({r['processes']}) | {r['ratio']:.3f} | "
                     f"{rounds} | {each} | {base} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", type=Path, help="a `vllm-dflash bench` result JSON")
    ap.add_argument("--baseline", default="none+extras", help="the pool the others are divided by")
    a = ap.parse_args(argv)
    rows = pooled_ratios(pool_runs(json.loads(a.result.read_text())["runs"]), a.baseline)
    if not rows:
        raise SystemExit(f"pooled: no run of {a.baseline!r} beside another configuration in {a.result}. Fix: bench "
                         f"--configs with {a.baseline} (and {a.baseline}{LABEL_SEP}{POOL_LABEL}2 for a second process)")
    print(render(rows, a.baseline))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
