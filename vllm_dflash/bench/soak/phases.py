# SPDX-License-Identifier: Apache-2.0
"""The soak's phases against a running server (run.py strings them together): a batch of requests driven with a
progress bar, the wait for an idle server after a round, a round's counters from /metrics, greedy differences
explained, the restart under load, and the watchdog that bounds the whole run."""
from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from vllm_dflash.bench.soak import report as soak_report
from vllm_dflash.bench.soak.client import Outcome, RssSampler, drive, rss_by_process
from vllm_dflash.bench.soak.plan import Req
from vllm_dflash.serve.tau import counter, label_values, series, spec_decode

SETTLE_TIMEOUT_S = 60.0
RESTART_AFTER_S = 4.0  # the restart: seconds of load before the server is stopped
RESTART_STOP_TIMEOUT_S = 30.0  # the restart: SIGTERM, then SIGKILL for what is left of the group after this long
QUICK_STOP_TIMEOUT_S = 10.0  # quick mode: where vLLM 0.32 ignores SIGTERM under load, a longer wait changes nothing


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_drive(url: str, reqs: list[Req], prefix: str, concurrency: int, request_timeout: float, deadline: float | None,
              desc: str, hard_deadline: float | None = None) -> tuple[list[dict[str, Any]], float]:
    from tqdm import tqdm

    bar = tqdm(total=len(reqs), desc=desc, unit="req", file=sys.stderr, dynamic_ncols=True)

    def done(o: Outcome) -> None:
        bar.update(1)
        bar.set_postfix_str(f"{o.kind}:{o.status}", refresh=False)

    t0 = time.perf_counter()
    try:
        outs = asyncio.run(drive(url, reqs, prefix, concurrency, request_timeout, deadline, hard_deadline, done))
    finally:
        bar.close()
    return [asdict(o) for o in outs], time.perf_counter() - t0


def idle_state(srv, sampler: RssSampler, probe: Req, tag: str) -> dict[str, Any]:
    """Wait for the server to be idle: a 1-token probe refreshes vLLM's gauges (they update on engine steps
    only), then running / waiting / KV-cache usage are polled until all are 0 (or SETTLE_TIMEOUT_S)."""
    import httpx

    from vllm_dflash.bench.soak.client import send

    time.sleep(1.0)
    t0 = time.perf_counter()

    async def _probe() -> Outcome:
        async with httpx.AsyncClient(base_url=srv.url, trust_env=False) as c:
            return await send(c, probe, tag, 120.0)

    p = asyncio.run(_probe())
    m: dict[str, float] = {}
    while time.perf_counter() - t0 < SETTLE_TIMEOUT_S:
        m = srv.metrics()
        if (m.get("vllm:num_requests_running", 1) == 0 and m.get("vllm:num_requests_waiting", 1) == 0
                and m.get("vllm:kv_cache_usage_perc", 1) == 0):
            break
        time.sleep(0.5)
    time.sleep(1.0)
    return {"settle_s": round(time.perf_counter() - t0, 1), "probe": p.status,
            "running": m.get("vllm:num_requests_running"), "waiting": m.get("vllm:num_requests_waiting"),
            "kv_cache_usage": m.get("vllm:kv_cache_usage_perc"), "rss_bytes": sampler.sample(),
            "rss_by_process": rss_by_process(srv.proc.pid)}


def metric_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """One round's counters (after minus before); drafts and τ from the one τ helper (vllm_dflash.serve.tau)."""
    d = lambda name: counter(after, name) - counter(before, name)  # noqa: E731
    ok = "vllm:request_success_total"
    reasons = {r: int(v - before.get(series(ok, finished_reason=r), 0.0))
               for r, v in label_values(after, ok, "finished_reason").items()}
    sd = spec_decode(after, before)
    return {"finished_by_reason": reasons, "preemptions": int(d("vllm:num_preemptions")),
            "prompt_tokens": int(d("vllm:prompt_tokens")), "generation_tokens": int(d("vllm:generation_tokens")),
            "drafts": int(sd["drafts"]), "tau": round(sd["tau"], 3) if sd["tau"] is not None else None}


def explain_greedy(url: str, tokenizer: Any, cases: dict[str, Req], mismatches: list[dict[str, Any]],
                   dtype: str) -> dict[str, Any]:
    """Each greedy output that differs from its alone output: first differing token and the target's top-2 logprob
    margin there (vllm_dflash.exactness). -> near-tie / real counts and the divergences."""
    from vllm_dflash.exactness import count_kinds, explain

    divs = []
    for mm in mismatches:
        body = cases[mm["case"]].body
        item = {"messages": body["messages"]} if "messages" in body else {"prompt": body["prompt"]}
        d = explain(url, tokenizer, item, mm["alone"] or "", mm["load"] or "", dtype)
        if d is not None:
            divs.append({"tag": mm["tag"], "case": mm["case"], **asdict(d)})
    return {**count_kinds(divs), "divergences": divs}


def restart_phase(srv, sampler: RssSampler, a: argparse.Namespace, load: list[Req], cases: list[Req],
                  alone: dict[str, str]) -> dict[str, Any]:
    """Stop the server (SIGTERM to its process group) while `load` is in flight, start it again on the same port,
    then run the greedy `cases` again, one at a time. The old server log is kept as <log>.before-restart."""
    holder: dict[str, Any] = {}
    drive_thread = threading.Thread(target=lambda: holder.update(r=run_drive(
        srv.url, load, "soak-restart", a.concurrency, a.request_timeout, None, "restart: load")))
    drive_thread.start()
    time.sleep(RESTART_AFTER_S)
    t0 = time.perf_counter()
    stop_timeout = QUICK_STOP_TIMEOUT_S if a.quick else RESTART_STOP_TIMEOUT_S
    srv.stop(timeout=stop_timeout)
    stop_s = time.perf_counter() - t0
    before = Path(str(a.log) + ".before-restart")
    Path(a.log).replace(before)
    log(f"restart: server stopped in {stop_s:.1f} s under load; starting it again")
    t1 = time.perf_counter()
    srv.start(timeout=600)
    start_s = time.perf_counter() - t1
    sampler.pid = srv.proc.pid
    drive_thread.join()
    outs, secs = holder["r"]
    again, _ = run_drive(srv.url, cases, "soak-restarted", 1, a.request_timeout, None, "restart: greedy again")
    text = before.read_text(errors="replace")
    log(f"restart: server up again in {start_s:.1f} s (pid {srv.proc.pid})")
    out = soak_report.summarize_restart(outs, again, alone, stop_s, start_s, secs, str(before),
                                        sum("Traceback (most recent" in ln for ln in text.splitlines()))
    # vLLM 0.32's SIGTERM: the engine is stopped at once (mode abort), then uvicorn waits for open connections, which
    # requests in flight keep open: the group then exits only on Server.stop's SIGKILL (reported, docs/RELIABILITY.md)
    out["sigkill_needed"] = stop_s >= stop_timeout - 0.5
    return out


def watchdog(srv, bound_s: float, t0: float, stop: threading.Event) -> None:
    """Stops the server (and so the run) if the whole soak overruns its bound by more than a grace period."""
    if not stop.wait(max(0.0, t0 + bound_s - time.time())):
        log(f"watchdog: the soak overran its bound of {bound_s:.0f} s; stopping the server")
        srv.stop()

