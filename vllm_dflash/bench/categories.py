# SPDX-License-Identifier: Apache-2.0
"""Per-category speed at concurrency 1 (issue 54.3): on `open-chat`, each configuration's output tokens / request
latency summed per category of the prompts (writing, role-play, reasoning, math, coding, ...), as a speed-up over
`none` (stock vLLM) and beside stock n-gram. Only at concurrency 1, where a request has the engine to itself and its
latency is its own cost; at higher concurrency requests share steps and per-request figures mean little. Beside it,
completion tokens per streamed chunk (vLLM streams one chunk per engine step of a request: tokens per target forward,
an upper estimate; runs before session 42 did not record it)."""
from __future__ import annotations

from collections import defaultdict
from typing import Any


CAPTION = ("Open chat per category at concurrency 1: speed-up over `none` · completion tokens per streamed chunk (one "
           "chunk per engine step of a request: tokens per target forward, an upper estimate), in brackets output "
           "tokens / request latency summed per category; the best speed-up per category in bold")


def categories_of(prompt_set: str) -> dict[str, str]:
    """Prompt id -> category for an open-chat prompt set ({} for any other set)."""
    if not prompt_set.startswith("open-chat"):
        return {}
    from vllm_dflash.data.prompts import get_prompts

    return {it["id"]: it["category"] for it in get_prompts(prompt_set)}


def per_category(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """-> {category: {config: {"tok_s", "requests"[, "tokens_per_chunk"]}}} over the c1 runs of open-chat sets (empty
    if none)."""
    out: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    cats: dict[str, dict[str, str]] = {}
    for r in runs:
        if r.get("concurrency") != 1 or not r.get("ok", True) or not r.get("requests"):
            continue
        ps = r["prompt_set"]
        if ps not in cats:
            cats[ps] = categories_of(ps)
        if not cats[ps]:
            continue
        sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0, 0])  # tokens, latency, requests, chunks
        for q in r["requests"]:
            c = cats[ps].get(q["id"])
            if c is not None and q.get("latency_s"):
                s = sums[c]
                s[0] += q["completion_tokens"]
                s[1] += q["latency_s"]
                s[2] += 1
                s[3] += q.get("chunks") or 0
        for c, (tok, lat, n, chunks) in sums.items():
            out[c][r["config"]] = {"tok_s": tok / lat, "requests": n,
                                   **({"tokens_per_chunk": tok / chunks} if chunks else {})}
    return dict(out)


def render_categories(runs: list[dict[str, Any]]) -> str | None:
    """A markdown table: per category, each configuration's tok/s at c1 and its speed-up over `none` (the best in bold)."""
    table = per_category(runs)
    if not table:
        return None
    configs = list(dict.fromkeys(r["config"] for r in runs if r.get("concurrency") == 1))
    out = ["| category | requests | " + " | ".join(configs) + " |", "|---|---|" + "---|" * len(configs)]
    for cat in sorted(table):
        row = table[cat]
        base = row.get("none", {}).get("tok_s")
        best = max((row[c]["tok_s"] for c in configs if c != "none" and c in row), default=None)
        cells = []
        for c in configs:
            v = row.get(c)
            if v is None:
                cells.append("–")
            elif base and c != "none":
                ratio = f"{v['tok_s'] / base:.2f}×"
                tpc = f" · {v['tokens_per_chunk']:.2f}" if "tokens_per_chunk" in v else ""
                cells.append(f"{f'**{ratio}**' if v['tok_s'] == best else ratio}{tpc} ({v['tok_s']:.1f} tok/s)")
            else:
                cells.append(f"{v['tok_s']:.1f} tok/s")
        n = max(v["requests"] for v in row.values())
        out.append(f"| {cat} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(out)
