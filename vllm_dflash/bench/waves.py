# SPDX-License-Identifier: Apache-2.0
"""One wave of benchmark requests against one server (`measure`: the requests, the /metrics scrapes around them and
the CPU time of the server's threads, of idle servers and of everything else on the machine meanwhile), and a run
summarized from its waves (`summarize`; several in interleaved mode). The orchestration is in bench/run.py."""
from __future__ import annotations

import os
import time
from typing import Any

from vllm_dflash.bench import stats
from vllm_dflash.bench.configs import BenchConfig
from vllm_dflash.bench.procs import cpu_delta, group_cpu_s, group_thread_cpu_s, machine_cpu_s, outside_cpu_s
from vllm_dflash.serve import tau
from vllm_dflash.serve.metric_names import GAUGES, LABELS, PREFIX


def settled_metrics(server: Any, timeout: float = 10.0) -> dict[str, float]:
    """A /metrics scrape once no request runs and the spec-decode counters stopped moving."""
    keys = (tau.DRAFTS + "_total", tau.ACCEPTED + "_total", tau.GENERATED + "_total", "vllm:num_requests_running")
    prev, deadline = None, time.time() + timeout
    while True:
        m = server.metrics()
        cur = tuple(m.get(k) for k in keys)
        if (cur == prev and not m.get("vllm:num_requests_running")) or time.time() > deadline:
            return m
        prev = cur
        time.sleep(0.3)




def measure(server: Any, items: list[dict[str, Any]], c: int, a: Any,
             others: dict[str, Any] | None = None) -> dict[str, Any]:
    """One wave of requests against one server: the requests, the /metrics scrapes around them, the load average,
    the CPU seconds the `others` (servers left idle meanwhile, interleaved mode, by configuration name) used during
    it, and every process outside the measured server that used CPU meanwhile (what competed with it). The server's
    prefix cache is emptied first (its prompts may have run at an earlier level)."""
    from vllm_dflash.bench.client import run_load

    others = others or {}
    before = settled_metrics(server)
    # levels share prompts (bench/levels.py): a prompt an earlier wave sent must not come from the prefix cache
    server.reset_prefix_cache()
    load0 = os.getloadavg()[0]
    idle0 = [group_cpu_s(o.proc.pid) for o in others.values()]
    threads0 = group_thread_cpu_s(server.proc.pid)
    machine0 = machine_cpu_s()
    reqs = run_load(server.url, items, c, a.max_tokens, a.ignore_eos, getattr(a, "temperature", 0.0))
    machine1 = machine_cpu_s()
    threads = cpu_delta(threads0, group_thread_cpu_s(server.proc.pid))  # before the scrape below adds its own
    after = settled_metrics(server)
    idle = sum(group_cpu_s(o.proc.pid) - t for o, t in zip(others.values(), idle0, strict=True)) if others else None
    labels = {o.proc.pid: f"idle {n}" for n, o in others.items()} | {os.getpgid(0): "bench"}
    outside = outside_cpu_s(machine0, machine1, server.proc.pid, labels)
    return {"reqs": reqs, "before": before, "after": after, "load": [load0, os.getloadavg()[0]], "idle_cpu_s": idle,
            "threads_cpu_s": threads, "outside_cpu_s": outside}


def summarize(cfg: BenchConfig, ps: str, c: int, waves: list[dict[str, Any]]) -> dict[str, Any]:
    """A run (one configuration, prompt set and concurrency) from its waves (`measure`; several in interleaved mode:
    their wall times and counter deltas add up)."""
    reqs = [r for w in waves for r in w["reqs"]]
    run: dict[str, Any] = {"config": cfg.name, "prompt_set": ps, "concurrency": c, "num_prompts": len(reqs),
                           "ok": True, "rounds": len(waves)}
    run.update(**stats.throughput_of_rounds([w["reqs"] for w in waves]), **stats.request_latencies(reqs),
               loadavg_1m=[waves[0]["load"][0], waves[-1]["load"][1]])
    if len(waves) > 1:  # interleaved rounds: each one's own tok/s, paired with the baseline's (stats.paired_ratios)
        run["round_tok_s"] = [round(x, 3) for x in stats.round_throughputs([w["reqs"] for w in waves])]
    if any(w["idle_cpu_s"] is not None for w in waves):  # other servers were up (interleaved mode)
        run["idle_servers_cpu_s"] = round(sum(w["idle_cpu_s"] or 0.0 for w in waves), 2)
    run["server_threads_cpu_s"] = _sum_per_name(waves, "threads_cpu_s", 3)  # this server, per process/thread name
    outside = _sum_per_name(waves, "outside_cpu_s", 2)  # every other process while this server ran: its competitors
    run["outside_cpu_s"] = dict(sorted(outside.items(), key=lambda kv: -kv[1]))
    # counter deltas of the run, summed over its waves (one wave: after - before), compared with an empty `before`
    before: dict[str, float] = {}
    after = stats.sum_deltas([(w["before"], w["after"]) for w in waves])
    gen = "vllm:generation_tokens_total"  # the server's own count: a cross-check of the clients' usage records
    run["server_generation_tokens"] = after.get(gen, 0.0) - before.get(gen, 0.0)
    run["spec_decode"] = stats.spec_decode_delta(before, after) if cfg.method else None
    run["adaptive"] = stats.adaptive_delta(before, after) if cfg.method else None
    split = {k: after.get(f"vllm_dflash:{k}_seconds_sum", 0.0) - before.get(f"vllm_dflash:{k}_seconds_sum", 0.0)
             for k in ("draft_forward", "kv_injection", "target_forward")}
    draft_s = split["draft_forward"] + split["kv_injection"]
    run["ours_draft_time_share"] = draft_s / run["wall_s"] if draft_s > 0 and run["wall_s"] > 0 else None
    # every configuration's worker times its target forwards (DFLASH_PROFILE=1, patches/profile_forward.py)
    forwards = (after.get("vllm_dflash:target_forward_seconds_count", 0.0)
                - before.get("vllm_dflash:target_forward_seconds_count", 0.0))
    run["time_split_s"] = ({**split, "wall": run["wall_s"], "target_forwards": int(forwards)}
                           if draft_s > 0 or split["target_forward"] > 0 else None)
    # our gauges at the end of the run (step-cost fit, guard rates): state, not deltas, so the last scrape's values
    last = waves[-1]["after"]
    # (a gauge with labels of its own, e.g. the guard's per arm, by those labels: its plain name sums the arms)
    gauges = {}
    for k, v in last.items():
        name = k[len(PREFIX):] if k.startswith(PREFIX) else ""
        family = name.split("{")[0]
        if family in GAUGES and ("{" in name) == (family in LABELS):
            gauges[name] = v
    if gauges:
        run["dflash_gauges"] = gauges
    run["finish_reasons"] = {f: sum(r["finish_reason"] == f for r in reqs) for f in {r["finish_reason"] for r in reqs}}
    run["requests"] = [{k: r[k] for k in ("id", "prompt_tokens", "completion_tokens", "chunks", "ttft_s", "latency_s")}
                       for r in reqs]
    run["outputs"] = {r["id"]: r["text"] for r in reqs}
    # the server's token ids, for the exactness check only (_finish_run takes them out before the run is stored)
    run["token_ids"] = {r["id"]: {"prompt": r.get("prompt_token_ids"), "output": r.get("token_ids")} for r in reqs}
    return run


def _sum_per_name(waves: list[dict[str, Any]], key: str, ndigits: int) -> dict[str, float]:
    """The per-name CPU seconds of `key` (a dict in each wave) summed over the waves, rounded to `ndigits`."""
    out: dict[str, float] = {}
    for w in waves:
        for k, v in w.get(key, {}).items():
            out[k] = round(out.get(k, 0.0) + v, ndigits)
    return out
