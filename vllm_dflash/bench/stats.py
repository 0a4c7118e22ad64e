# SPDX-License-Identifier: Apache-2.0
"""Pure benchmark maths (no vLLM, no I/O): percentiles, request-latency summaries, spec-decode counter
deltas from two `/metrics` scrapes (τ, per-position acceptance, tokens per target forward), output comparison
against the no-speculation baseline, and speedups."""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from vllm_dflash.serve import tau

PERCENTILES = (50, 90, 99)

ADAPTIVE_SOURCES = ("dflash", "ngram", "merged")


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (numpy's default).
    None for no values."""
    xs = sorted(float(v) for v in values)
    if not xs:
        return None
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile: q={q} outside [0, 100]")
    rank = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(rank), math.ceil(rank)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def summarize(values: Iterable[float], scale: float = 1.0) -> dict[str, float | None]:
    """{'mean', 'p50', 'p90', 'p99'} of the values times `scale` (e.g. 1000 for seconds -> ms)."""
    xs = [float(v) * scale for v in values]
    out: dict[str, float | None] = {"mean": sum(xs) / len(xs) if xs else None}
    for q in PERCENTILES:
        out[f"p{q}"] = percentile(xs, q)
    return out


def request_latencies(requests: list[dict[str, Any]]) -> dict[str, Any]:
    """TTFT and TPOT (ms) summaries over requests with `ttft_s`, `latency_s`, `completion_tokens`.

    TPOT of one request = (latency - TTFT) / (completion_tokens - 1); requests with one token have none."""
    ttft = [r["ttft_s"] for r in requests if r.get("ttft_s") is not None]
    tpot = [(r["latency_s"] - r["ttft_s"]) / (r["completion_tokens"] - 1) for r in requests
            if r.get("ttft_s") is not None and r["completion_tokens"] > 1]
    return {"ttft_ms": summarize(ttft, 1000.0), "tpot_ms": summarize(tpot, 1000.0)}


def throughput(requests: list[dict[str, Any]]) -> dict[str, float]:
    """Output tokens, wall time (first request sent .. last response done), output tokens/s, and completion tokens
    per streamed text chunk (client.py: about tokens per target forward, for every configuration)."""
    return throughput_of_rounds([requests])


def throughput_of_rounds(rounds: list[list[dict[str, Any]]]) -> dict[str, float]:
    """`throughput` of requests sent in several rounds (an interleaved benchmark sends a run's prompts in rounds, with
    other configurations in between): the wall time is the sum of each round's own span, so the gaps between rounds
    do not count."""
    rounds = [rd for rd in rounds if rd]
    if not rounds:
        return {"output_tokens": 0, "wall_s": 0.0, "output_tok_s": 0.0}
    reqs = [r for rd in rounds for r in rd]
    tokens = sum(r["completion_tokens"] for r in reqs)
    wall = sum(max(r["t_end"] for r in rd) - min(r["t_start"] for r in rd) for rd in rounds)
    chunks = sum(r.get("chunks", 0) for r in reqs)
    return {"output_tokens": tokens, "wall_s": wall, "output_tok_s": tokens / wall if wall > 0 else 0.0,
            "tokens_per_chunk": tokens / chunks if chunks else None}


def round_throughputs(rounds: list[list[dict[str, Any]]]) -> list[float]:
    """Output tok/s of each round on its own (`throughput` of its requests): round r of every configuration at one
    prompt set and concurrency sends the same prompts, back to back, so the ratio of two configurations' round r is a
    paired measurement, and its spread over the rounds shows how far machine drift moves a speed-up."""
    return [throughput(rd)["output_tok_s"] for rd in rounds]


def paired_ratios(run: dict[str, Any], base: dict[str, Any]) -> list[float] | None:
    """Per-round speed-ups of `run` over `base` (`round_throughputs` of both, round by round), or None when either
    ran in one round, their round counts differ (a failed run) or a baseline round measured nothing."""
    a, b = run.get("round_tok_s"), base.get("round_tok_s")
    if not a or not b or len(a) < 2 or len(a) != len(b) or not all(x > 0 for x in b):
        return None
    return [round(x / y, 4) for x, y in zip(a, b, strict=True)]


def sum_deltas(pairs: list[tuple[dict[str, float], dict[str, float]]]) -> dict[str, float]:
    """Counter deltas of several (before, after) /metrics scrapes of one server, summed per series: the `after` of a
    run measured in rounds (compare it with an empty `before`). Only counters and histogram sums / counts are
    meaningful in the result; gauges are summed differences too."""
    out: dict[str, float] = {}
    for before, after in pairs:
        for k, v in after.items():
            out[k] = out.get(k, 0.0) + v - before.get(k, 0.0)
    return out


def spec_decode_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """vLLM's spec-decode counters over one run (two parse_metrics() scrapes): serve.tau.spec_decode."""
    return tau.spec_decode(after, before)


def adaptive_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, Any] | None:
    """Adaptive drafting's choices over one run (our counters proposals_total, drafted_tokens_total and
    accepted_tokens_total by their `source` label): share of request-steps per source (dflash / ngram / merged /
    none), draft tokens and acceptance rate per source, mean draft length. None when the run made no choices."""
    def d(name: str, source: str) -> float:
        key = tau.series(f"vllm_dflash:{name}_total", source=source)
        return after.get(key, 0.0) - before.get(key, 0.0)

    props = {s: d("proposals", s) for s in ADAPTIVE_SOURCES + ("none",)}
    total = sum(props.values())
    if total <= 0:
        return None
    drafted = {s: d("drafted_tokens", s) for s in ADAPTIVE_SOURCES}
    accepted = {s: d("accepted_tokens", s) for s in ADAPTIVE_SOURCES}
    return {"request_steps": total, "share": {s: v / total for s, v in props.items()},
            "draft_tokens": drafted, "accepted_tokens": accepted,
            "acceptance_rate": {s: (accepted[s] / drafted[s] if drafted[s] > 0 else None) for s in drafted},
            "mean_draft_len": sum(drafted.values()) / total}


def compare_outputs(base: dict[str, str], other: dict[str, str], excerpt: int = 80) -> dict[str, Any]:
    """Greedy outputs of a configuration vs the baseline on the same prompt ids: how many are identical,
    and for each mismatch where it starts (character offset) with an excerpt of both texts from there."""
    ids = [i for i in other if i in base]
    mismatches = []
    for i in ids:
        a, b = base[i], other[i]
        if a == b:
            continue
        at = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        mismatches.append({"id": i, "first_diff_char": at, "base_len": len(a), "other_len": len(b),
                           "base": a[at: at + excerpt], "other": b[at: at + excerpt]})
    return {"identical": len(ids) - len(mismatches), "compared": len(ids), "mismatches": mismatches}


def baseline_runs(runs: list[dict[str, Any]], baseline: str) -> dict[tuple[str, int], dict[str, Any]]:
    """(prompt set, concurrency) -> the successful run of configuration `baseline` at that level."""
    return {(r["prompt_set"], r["concurrency"]): r for r in runs if r["config"] == baseline and r.get("ok")}


def attach_baseline(runs: list[dict[str, Any]], baseline: str = "none", compare: bool = True) -> None:
    """In place: speedup (output tok/s over the baseline's) and output comparison (greedy runs: compare) for every
    run that has a baseline run at the same prompt set and concurrency."""
    base = baseline_runs(runs, baseline)
    for r in runs:
        b = base.get((r["prompt_set"], r["concurrency"]))
        if not r.get("ok") or b is None:
            r["speedup"], r["vs_baseline"] = None, None
            continue
        r["speedup"] = r["output_tok_s"] / b["output_tok_s"] if b["output_tok_s"] > 0 else None
        # per interleaved round: the speed-up's spread under drift (the baseline's own ratios would all be 1)
        r["speedup_rounds"] = None if r is b else paired_ratios(r, b)
        r["vs_baseline"] = None if r is b or not compare else compare_outputs(b["outputs"], r["outputs"])
    attach_over(runs, EXTRAS_BASELINE)


EXTRAS_BASELINE = "none+extras"  # our engine's CPU speed-ups without speculation: what speculation must not lose to


def attach_over(runs: list[dict[str, Any]], baseline: str) -> None:
    """In place: `over[baseline]` = {"ratio": output tok/s over that configuration's run at the same prompt set and
    concurrency, "rounds": its per-round ratios (`paired_ratios`) or None} for every other run that has one."""
    base = baseline_runs(runs, baseline)
    for r in runs:
        b = base.get((r["prompt_set"], r["concurrency"]))
        if r is b or b is None or not r.get("ok") or not b["output_tok_s"] > 0:
            continue
        r.setdefault("over", {})[baseline] = {"ratio": r["output_tok_s"] / b["output_tok_s"],
                                              "rounds": paired_ratios(r, b)}
