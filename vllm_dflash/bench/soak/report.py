# SPDX-License-Identifier: Apache-2.0
"""The soak test's bookkeeping: a round's figures from its outcomes, the server-log accounting, the pass/fail checks
over the whole JSON result, and the markdown rendering of docs/RELIABILITY.md. Pure functions (no I/O but the
render's file read), so the checks are unit-tested on doctored results (tests/unit/test_soak_checks.py)."""
from __future__ import annotations

import re
from pathlib import Path
import statistics
from collections import Counter
from typing import Any

from vllm_dflash.bench.soak.plan import RETRY_SUFFIX

MEMORY_GROWTH_LIMIT = 0.05
EXPECTED = {"greedy": {"ok", "cut"}, "sampled": {"ok", "cut"}, "disconnect": {"disconnected", "ok", "cut"},
            "timeout": {"timed_out", "ok", "cut"}, "malformed": {"http_4xx"}}
_TAG = re.compile(r"soak-[a-z0-9]+-\d+(?:" + re.escape(RETRY_SUFFIX) + ")?")  # a resent request too


def parse_server_log(text: str) -> dict[str, set[str]]:
    """Request tags the engine received ('Added request') and aborted ('aborted' / 'Aborted request(s)')."""
    added, aborted = set(), set()
    for line in text.splitlines():
        if "Added request" in line:
            added.update(_TAG.findall(line))
        elif "aborted." in line or "Aborted request" in line:
            aborted.update(_TAG.findall(line))
    return {"added": added, "aborted": aborted}


def output_problems(o: dict[str, Any]) -> list[str]:
    """What is wrong with a completed (ok) response: token counts, finish reason, stop strings."""
    probs = []
    if o["finish_reason"] not in ("stop", "length"):
        probs.append(f"finish_reason {o['finish_reason']!r}")
    want = o.get("n", 1)  # n > 1: usage counts every choice's tokens
    if want > 1 and o.get("choices") != want:
        probs.append(f"{o.get('choices')} choices for n={want}")
    n, mx = o["completion_tokens"], o["max_tokens"]
    if n is None:
        probs.append("no usage.completion_tokens")
    elif mx is not None and n > want * mx:
        probs.append(f"{n} tokens > max_tokens {mx}" + (f" x n={want}" if want > 1 else ""))
    elif want == 1 and o["finish_reason"] == "length" and mx is not None and n != mx:
        probs.append(f"finish_reason length with {n} tokens != max_tokens {mx}")
    elif want == 1 and o.get("min_tokens") and n < o["min_tokens"]:
        probs.append(f"{n} tokens < min_tokens {o['min_tokens']}")
    # vLLM checks stop strings only once min_tokens are out: before that they may appear
    for s in o["stop"] if not o.get("min_tokens") else []:
        for t in [o["text"]] + list(o.get("other_texts") or []):
            if s in t:
                probs.append(f"stop string {s!r} in the output")
    return probs


def summarize_round(outcomes: list[dict[str, Any]], alone: dict[str, str], seconds: float) -> dict[str, Any]:
    """Counts, rejected / failed lists, greedy comparison and throughput of one round (outcomes as dicts)."""
    counts = Counter(o["status"] for o in outcomes)
    by_kind: dict[str, dict[str, int]] = {}
    for o in outcomes:
        by_kind.setdefault(o["kind"], Counter())[o["status"]] += 1
    unexpected = [o for o in outcomes if o["status"] not in EXPECTED[o["kind"]]]
    ok = [o for o in outcomes if o["status"] == "ok"]
    invalid = [{"tag": o["tag"], "problems": p} for o in ok if (p := output_problems(o))]
    greedy = [o for o in ok if o["kind"] == "greedy"]
    mismatches = [{"tag": o["tag"], "case": o["case"], "alone": alone.get(o["case"]), "load": o["text"]}
                  for o in greedy if o["text"] != alone.get(o["case"])]
    lat = sorted(o["latency_s"] for o in ok if o["kind"] in ("greedy", "sampled"))
    tokens = sum(o["completion_tokens"] or 0 for o in ok)
    malformed = [o for o in outcomes if o["kind"] == "malformed"]
    return {
        "sent": len(outcomes),
        "completed": counts.get("ok", 0),
        "rejected_4xx": counts.get("http_4xx", 0),
        "failed_5xx": counts.get("http_5xx", 0) + counts.get("stream_error", 0),
        "disconnected": counts.get("disconnected", 0),
        "timed_out": counts.get("timed_out", 0),
        "cut_at_deadline": counts.get("cut", 0),
        "errors": counts.get("error", 0),
        # sent again after a connection failure before any response (client.send); first attempt's error and trace
        "retried": [{"tag": o["tag"], "status": o["status"], **{f"first_{k}": v for k, v in o["retried"].items()}}
                    for o in outcomes if o.get("retried")],
        "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "malformed": {"sent": len(malformed), "rejected_4xx": sum(o["status"] == "http_4xx" for o in malformed),
                      "codes": dict(Counter(str(o["http_code"]) for o in malformed)),
                      "by_case": dict(Counter(f"{o['case']}:{o['http_code']}" for o in malformed))},
        "valid_4xx": [_brief(o) for o in outcomes if o["status"] == "http_4xx" and o["kind"] != "malformed"],
        "unexpected": [_brief(o) for o in unexpected],
        "n2_completed": sum(o.get("n", 1) > 1 for o in ok),
        "invalid_outputs": invalid,
        "greedy": {"compared": len(greedy), "identical": len(greedy) - len(mismatches), "mismatches": mismatches,
                   "cases": sorted({o["case"] for o in greedy})},
        "seconds": round(seconds, 1),
        "output_tokens": tokens,
        "output_tok_s": round(tokens / seconds, 2) if seconds > 0 else None,
        "latency_s": {"p50": round(statistics.median(lat), 2), "p90": round(lat[int(0.9 * (len(lat) - 1))], 2),
                      "max": round(lat[-1], 2)} if lat else None,
    }


def _brief(o: dict[str, Any]) -> dict[str, Any]:
    return {"tag": o["tag"], "kind": o["kind"], "case": o["case"], "status": o["status"], "http_code": o["http_code"],
            "error": o["error"][:200], "connection": o.get("connection", ""), "trace": o.get("trace", [])}


def account(outcomes: list[dict[str, Any]], log: dict[str, set[str]], prefix: str) -> dict[str, Any]:
    """Match a round's client outcomes with what the server log says happened to each request."""
    added = {t for t in log["added"] if t.startswith(prefix + "-")}
    aborted = log["aborted"]
    status = {o["tag"]: o["status"] for o in outcomes}
    client_aborts = {t for t, s in status.items() if s in ("disconnected", "timed_out", "cut")}
    completed = {t for t, s in status.items() if s == "ok"}
    return {
        "added": len(added),
        "aborted": len(added & aborted),
        # a client abort the engine never received (given up while the server was still parsing it) is not lost
        "client_aborts_not_aborted_by_server": sorted((client_aborts & added) - aborted),
        "completed_but_aborted_by_server": sorted(completed & aborted),
        "completed_not_seen_by_engine": sorted(completed - added),
        "added_unaccounted": sorted(added - completed - aborted),
        "malformed_reaching_engine": sorted(t for t in added if status.get(t) == "http_4xx"),
    }


# a client outcome that is a clean failure while the server restarts: an HTTP 5xx, an error event in the stream, or a
# connection error (refused, reset, closed before or during the response); a client timeout is a hang
RESTART_CLEAN = {"ok", "http_5xx", "stream_error"}
_CONNECTION_ERRORS = ("ConnectError", "ReadError", "WriteError", "RemoteProtocolError", "CloseError",
                      "stream ended without [DONE]")


def summarize_restart(load: list[dict[str, Any]], again: list[dict[str, Any]], alone: dict[str, str], stop_s: float,
                      start_s: float, load_s: float, old_log: str, old_log_tracebacks: int) -> dict[str, Any]:
    """The restart phase: what the clients of the interrupted load saw, and the greedy cases again afterwards."""
    def clean(o: dict[str, Any]) -> bool:
        return o["status"] in RESTART_CLEAN or (o["status"] == "error" and o["error"].startswith(_CONNECTION_ERRORS))

    hung = [_brief(o) for o in load if o["status"] in ("cut", "timed_out") or "client timeout" in o["error"]]
    kinds = Counter(o["status"] if o["status"] != "error" else "error:" + o["error"].split(":")[0].split(" <-")[0]
                    for o in load)
    diffs = [o["case"] for o in again if o["status"] != "ok" or o["text"] != alone.get(o["case"])]
    return {"sent": len(load), "outcomes": dict(kinds), "unclean": [_brief(o) for o in load if not clean(o)],
            "hung": hung, "max_latency_s": round(max((o["latency_s"] for o in load), default=0.0), 1),
            "load_seconds": round(load_s, 1), "stop_s": round(stop_s, 1), "start_s": round(start_s, 1),
            "greedy_again": len(again), "greedy_again_differs": diffs, "old_log": old_log,
            "old_log_tracebacks": old_log_tracebacks}


def _check(name: str, ok: bool, detail: str) -> dict[str, Any]:
    return {"name": name, "ok": bool(ok), "detail": detail}


def evaluate(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pass/fail check of a soak result."""
    rounds, checks = res.get("rounds", []), []
    checks.append(_check("run_completed", "error" not in res, res.get("error", "no exception")[:300]))
    tot = lambda k: sum(r[k] for r in rounds)  # noqa: E731
    want = res.get("meta", {}).get("rounds", 2)
    checks.append(_check("rounds_ran", len(rounds) == want >= 2 and all(r["sent"] > 0 for r in rounds),
                         f"{len(rounds)} rounds, sent {[r['sent'] for r in rounds]}"))
    checks.append(_check("no_5xx", tot("failed_5xx") == 0, f"{tot('failed_5xx')} responses with 5xx or an error event"))
    v4 = sum(len(r["valid_4xx"]) for r in rounds)
    checks.append(_check("only_malformed_4xx", v4 == 0, f"{v4} valid requests rejected with 4xx"))
    mal = sum(r["malformed"]["sent"] - r["malformed"]["rejected_4xx"] for r in rounds)
    checks.append(_check("malformed_rejected", mal == 0 and sum(r["malformed"]["sent"] for r in rounds) > 0,
                         f"{mal} malformed requests not rejected with 4xx"))
    unexp = sum(len(r["unexpected"]) for r in rounds)
    retried = _retried(rounds)
    checks.append(_check("every_request_answered", unexp == 0 and tot("errors") == 0,
                         f"{unexp} unexpected outcomes, {tot('errors')} client errors / lost responses"
                         + (f"; {retried} sent again after a connection failure before any response (listed per round;"
                            " a first attempt the engine received fails nothing_lost)" if retried else "")))
    inval = sum(len(r["invalid_outputs"]) for r in rounds)
    checks.append(_check("outputs_valid", inval == 0, f"{inval} completed responses with invalid token counts, "
                                                      "finish reasons or stop strings"))
    alone_ok = res.get("alone", {}).get("all_ok", False)
    cmp_, same = sum(r["greedy"]["compared"] for r in rounds), sum(r["greedy"]["identical"] for r in rounds)
    # a divergence passes only as an explained numerical near-tie (bf16; never in float32): unexplained ones fail
    near = sum(r["greedy"].get("near_ties", 0) for r in rounds)
    margins = [d["margin"] for r in rounds for d in r["greedy"].get("divergences", []) if d["near_tie"]]
    checks.append(_check("greedy_identical_under_load", alone_ok and cmp_ > 0 and cmp_ == same + near,
                         f"{same}/{cmp_} greedy outputs under load identical to alone"
                         + (f", {near} at numerical near-ties of the target (top-2 logprob margins "
                            f"{', '.join(f'{m:.3f}' for m in margins)} nats)" if near else "")
                         + (f", {cmp_ - same - near} REAL differences" if cmp_ - same - near else "")))
    feats = res.get("meta", {}).get("features")
    if feats is not None:
        seen = {o_case for r in rounds for o_case in r["greedy"].get("cases", [])}
        checks.append(_check("features_exercised", bool(feats) and set(feats) <= seen,
                             f"greedy cases with request features compared under load: {sorted(set(feats) & seen)}"
                             + (f"; never completed: {sorted(set(feats) - seen)}" if set(feats) - seen else "")))
    too_long = [(k, n) for r in rounds for k, n in r["malformed"]["by_case"].items()
                if k.startswith("too_long_prompt:")]
    codes: Counter = Counter()
    for k, n in too_long:
        codes[k.rsplit(":", 1)[1]] += n
    checks.append(_check("over_long_prompt_400", bool(too_long) and set(codes) == {"400"},
                         f"prompts longer than the context, HTTP status: count {dict(codes)}"))
    rs = res.get("restart")
    if rs is not None or res.get("meta", {}).get("restart"):
        rs = rs or {}
        checks.append(_check("restart_clean", bool(rs) and not rs.get("unclean") and not rs.get("hung")
                             and not rs.get("greedy_again_differs") and rs.get("greedy_again", 0) > 0,
                             f"server stopped under load and started again ({rs.get('stop_s')} s / {rs.get('start_s')} "
                             f"s): {rs.get('sent')} requests, outcomes {rs.get('outcomes')}, {len(rs.get('hung', []))} "
                             f"hung, {len(rs.get('unclean', []))} unclean, max latency {rs.get('max_latency_s')} s; "
                             f"greedy again after the restart: {rs.get('greedy_again', 0)} cases, differing "
                             f"{rs.get('greedy_again_differs')}"))
    if res.get("meta", {}).get("preempt"):
        pre = sum(r.get("metrics", {}).get("preemptions", 0) or 0 for r in rounds)
        checks.append(_check("preemptions_forced", pre > 0, f"{pre} preemptions (vllm:num_preemptions) with a KV "
                                                            f"cache of {res['meta'].get('kv_blocks')} blocks"))
    lost = []
    for r in rounds:
        s = r.get("server_log", {})
        for k in ("client_aborts_not_aborted_by_server", "completed_but_aborted_by_server",
                  "completed_not_seen_by_engine", "added_unaccounted"):
            lost += s.get(k, ["missing server-log accounting"] if not s else [])
    checks.append(_check("nothing_lost", not lost, f"{len(lost)} requests unaccounted for in the server log"
                         + (f": {lost[:5]}" if lost else "")))
    aborts = sum(r.get("server_log", {}).get("aborted", 0) for r in rounds)
    checks.append(_check("aborts_exercised", aborts > 0, f"{aborts} requests aborted by the server after the client "
                                                         "disconnected or timed out"))
    idle = [r.get("after", {}) for r in rounds]
    checks.append(_check("kv_cache_back_to_zero", all(a.get("kv_cache_usage") == 0 for a in idle),
                         f"KV-cache usage after each round: {[a.get('kv_cache_usage') for a in idle]}"))
    checks.append(_check("no_stuck_requests", all(a.get("running") == 0 and a.get("waiting") == 0 for a in idle),
                         f"running/waiting after each round: {[(a.get('running'), a.get('waiting')) for a in idle]}"))
    mem = res.get("memory", {})
    g = mem.get("growth_round2")
    checks.append(_check("memory_stable", g is not None and g < MEMORY_GROWTH_LIMIT,
                         f"RSS growth over the last round: {g if g is None else f'{100 * g:.2f}%'} (limit "
                         f"{100 * MEMORY_GROWTH_LIMIT:.0f}%)"))
    fin = res.get("final", {})
    checks.append(_check("final_answer_correct", bool(fin.get("identical")) or (fin.get("status") == "ok" and
                                                                         fin.get("near_ties", 0) == 1),
                         f"greedy request after the run {'equals' if fin.get('identical') else 'differs from'} its "
                         "alone output"))
    mc = res.get("metrics_consistency", {})
    checks.append(_check("our_metrics_match_vllm", mc.get("ours") is not None and mc.get("ours") == mc.get("vllm"),
                         f"vllm_dflash:accepted_tokens_per_step_count {mc.get('ours')} vs "
                         f"vllm:spec_decode_num_drafts_total {mc.get('vllm')}"))
    suite = res.get("startup_suite")
    if suite is not None:
        bad = [c["name"] for c in suite if not c["ok"]]
        checks.append(_check("bad_configs_rejected", suite and not bad,
                             f"{len(suite) - len(bad)}/{len(suite)} bad configurations exit non-zero naming the "
                             "problem" + (f"; failed: {bad}" if bad else "")))
    errs = res.get("server_log_errors", {})
    other = errs.get("other", ["missing"])
    checks.append(_check("server_log_clean", not other, f"{len(other)} ERROR / Traceback lines in the server log "
                         f"besides {errs.get('logged_4xx_replies')} logged 4xx replies"
                         + (f": {other[:2]}" if other else "")))
    stop = res.get("server_stop", {})
    checks.append(_check("server_stopped", bool(stop.get("group_gone")),
                         f"process group gone after SIGTERM: {stop.get('group_gone')} "
                         f"(exit code {stop.get('exit_code')})"))
    lim = res.get("meta", {}).get("duration_limit_s")
    wall = res.get("meta", {}).get("wall_s")
    checks.append(_check("within_time_bound", lim is not None and wall is not None and wall <= lim,
                         f"wall {wall} s, bound {lim} s"))
    return checks



METHOD = """\
`benchmarks/soak.py` starts a real `vllm serve` on loopback (SmolLM2-135M-Instruct target, our DFlash drafter,
`--enforce-eager`, `OMP_NUM_THREADS=1`, 1 GiB KV cache, `--enable-log-requests`) and drives it with a seeded mix of
real prompts (HumanEval as chat and as raw completion, held-out web-text chats): greedy and sampled (temperature,
top-p, top-k, seeds, n=2), streaming and not, completions and chat, short and long `max_tokens`, stop strings; one
greedy case per request feature (logprobs with top_logprobs, prompt_logprobs, presence / frequency penalties,
repetition_penalty, a json_schema response format, a regex, min_tokens; a LoRA adapter unless `--no-lora`), and sampled
requests with penalties or logprobs; clients
that disconnect mid-stream; requests abandoned by a client timeout; malformed requests (prompt longer than the
context, `max_tokens` negative or above the context, negative temperature, top-p above 1, unknown model, broken JSON
body). The greedy cases (one of them fills the context exactly: prompt + max_tokens = max_model_len) first run
alone, one at a time; then the server is stopped (SIGTERM) while a burst of
requests is in flight and started again on the same port: every client must get an answer or a clean error (a 5xx,
an error event, a refused or reset connection), none may hang, and the greedy cases run again, equal to their alone
outputs; then identical rounds of the mix (2 in quick mode, 3 in full mode) run with many concurrent clients, and every
greedy output under load is compared with its alone output. A round takes new requests for 60 % of its time budget
and cancels what is still in flight at the end of it ("cut": the client closes the connection, the server must
abort). After each round a 1-token probe refreshes vLLM's gauges (they only move on engine steps) and the server
must be idle: no running or waiting request, KV-cache usage 0. The RSS of the server's process tree (API server,
engine core, worker) is sampled every 0.5 s; growth is measured over the last round (from the end of the round
before it), per process too. Every request carries an `X-Request-Id`, which vLLM uses as its request id, so the
server log is matched against the client's view: each request the engine received either completed or was aborted,
and every client disconnect or timeout was aborted by the server. A request whose connection fails before any byte
of a response (CI once saw a connection reset on a request the server never logged, on a loaded machine) is sent
once more on a new connection under its own tag, as HTTP clients do; the tables count these, the JSON keeps each
first attempt's error chain, connection (new or reused) and transport trace, and a first attempt the engine did
receive fails the accounting. Bad configurations (not JSON, missing draft
folder, a draft for another target, block size 6) must make `vllm serve` exit non-zero with a message naming the
problem. vLLM 0.32 has no server-side per-request timeout (only shutdown, keep-alive and engine-step timeouts), so
the timed-out requests are client timeouts; the server aborts them when the connection closes, which the log
accounting checks (vLLM's `vllm:request_success_total{finished_reason="abort"}` does not count client aborts, so
/metrics alone cannot). The `--preempt` mode serves with a KV cache of only one
max_model_len request plus 4 blocks of 32 tokens, so the rounds force preemptions (vllm:num_preemptions must be above
0), and the greedy outputs must still equal their alone outputs. The quick mode runs the bad configurations as
children forked from one process that imported
vLLM's CLI once (each child runs the `vllm` console script's entry point with the case's command line, so exit code
and message are the CLI's); the full mode starts one `vllm serve` process per case."""


def _mib(b: Any) -> str:
    return f"{b / 2 ** 20:,.0f} MiB" if isinstance(b, (int, float)) else "n/a"


def _by_role(by_pid: dict[str, int] | None) -> str:
    if not by_pid:
        return "n/a"
    roles: Counter = Counter()
    for label, rss in by_pid.items():
        roles[label.split(":")[0]] += rss
    return " / ".join(_mib(roles.get(k, 0)) for k in ("api_server", "engine_core", "worker"))


def _sum(res: dict[str, Any], key: str) -> int:
    return sum(r[key] for r in res.get("rounds", []))


def _retried(rounds: list[dict[str, Any]]) -> int:
    """Requests sent again after a connection failure before any response, over the rounds."""
    return sum(len(r.get("retried", [])) for r in rounds)


def _by_kind(rounds: list[dict[str, Any]]) -> str:
    tot: dict[str, Counter] = {}
    for r in rounds:
        for kind, c in r.get("by_kind", {}).items():
            tot.setdefault(kind, Counter()).update(c)
    return "; ".join(f"{k}: " + ", ".join(f"{s} {n}" for s, n in sorted(c.items())) for k, c in sorted(tot.items()))


def _restart_row(rs: dict[str, Any] | None) -> str:
    if not rs:
        return "not run"
    return (f"{', '.join(f'{k} {n}' for k, n in sorted(rs['outcomes'].items()))} / {len(rs['hung'])} / "
            f"{len(rs['greedy_again_differs'])} of {rs['greedy_again']} (stop {rs['stop_s']} s"
            + (", SIGKILL needed" if rs.get("sigkill_needed") else "") + f", start {rs['start_s']} s)")


def _rows(res: dict[str, Any]) -> dict[str, str]:
    meta, rounds, mem = res["meta"], res.get("rounds", []), res.get("memory", {})
    mal = sum(r["malformed"]["sent"] for r in rounds)
    gc = sum(r["greedy"]["compared"] for r in rounds)
    gi = sum(r["greedy"]["identical"] for r in rounds)
    aborted = sum(r.get("server_log", {}).get("aborted", 0) for r in rounds)
    suite = res.get("startup_suite") or []
    tau = [r["metrics"].get("tau") for r in rounds]
    g = mem.get("growth_round2")
    errs = res.get("server_log_errors", {})
    return {
        "draft": ("UNTRAINED " if meta["draft_untrained"] else "") + Path(meta["draft"]).name
                 + f", {meta['num_speculative_tokens']} draft tokens/step",
        "clients, rounds, requests per round": f"{meta['concurrency']}, {len(rounds)}, "
                                               f"{' / '.join(str(r['sent']) for r in rounds)}",
        "requests sent": str(_sum(res, "sent")),
        "completed (200, full response)": str(_sum(res, "completed")),
        "rejected with 4xx (malformed sent)": f"{_sum(res, 'rejected_4xx')} ({mal})",
        "4xx on valid requests": str(sum(len(r["valid_4xx"]) for r in rounds)),
        "failed with 5xx or an error event": str(_sum(res, "failed_5xx")),
        "client errors / lost responses": str(_sum(res, "errors")),
        "sent again after a connection failure before any response": str(_retried(rounds)),
        "disconnected mid-stream / client timeouts / cut at a round's deadline":
            f"{_sum(res, 'disconnected')} / {_sum(res, 'timed_out')} / "
            f"{sum(r.get('cut_at_deadline', 0) for r in rounds)}",
        "aborted by the server (log)": str(aborted),
        "greedy under load identical to alone": f"{gi}/{gc}",
        "KV-cache usage after each round": ", ".join(f"{r['after']['kv_cache_usage']:.0%}" for r in rounds),
        "running / waiting after each round": ", ".join(f"{r['after']['running']:.0f} / {r['after']['waiting']:.0f}"
                                                        for r in rounds),
        "RSS start / peak": f"{_mib(mem.get('start_bytes'))} / {_mib(mem.get('peak_bytes'))}",
        "RSS after each round": " / ".join(_mib(b) for b in mem.get("after_round_bytes", [])),
        "RSS growth over the last round": f"{100 * g:+.2f}%" if g is not None else "n/a",
        "RSS after each round: API server / engine core / worker": " ; ".join(
            _by_role(r["after"].get("rss_by_process")) for r in rounds),
        "ERROR lines in the server log: serving (+ 4xx replies vLLM logs at ERROR) / shutdown": (
            f"{len(errs.get('other', []))} (+ {errs.get('logged_4xx_replies', 0)}) / "
            f"{errs.get('during_shutdown', 'n/a')}"),
        "final greedy request equals alone": "yes" if res.get("final", {}).get("identical") else "NO",
        "bad configurations rejected": f"{sum(c['ok'] for c in suite)}/{len(suite)} ({meta.get('startup_mode')})"
                                       if suite else "skipped",
        "output tok/s under load (rounds)": " / ".join(str(r["output_tok_s"]) for r in rounds),
        "latency p50 / p90 of completed requests": " ; ".join(
            f"{r['latency_s']['p50']} / {r['latency_s']['p90']} s" for r in rounds if r.get("latency_s")),
        "τ under load (rounds)": " / ".join(str(t) for t in tau),
        "preemptions (rounds)": " / ".join(str(r["metrics"].get("preemptions")) for r in rounds)
                                + (f" (KV cache {meta.get('kv_blocks')} blocks)" if meta.get("kv_blocks") else ""),
        "request features mixed in (greedy cases)": ", ".join(f.removeprefix("f-") for f in meta.get("features", []))
                                                    or "none",
        "n=2 sampled requests completed": str(sum(r.get("n2_completed", 0) for r in rounds)),
        "outcomes by request kind (all rounds)": _by_kind(rounds),
        "restart under load: outcomes / hung / greedy again differing": _restart_row(res.get("restart")),
        "server start / whole run": f"{meta.get('server_start_s')} s / {meta.get('wall_s')} s "
                                    f"(bound {meta['duration_limit_s']:.0f} s)",
        "checks passed": f"{sum(c['ok'] for c in res['checks'])}/{len(res['checks'])}",
    }


def render_markdown(results: list[dict[str, Any]], paths: list[str], notes: str = "", notes_path: str = "") -> str:
    """docs/RELIABILITY.md from soak JSON results (one column per run) and served feature checks (features.py, a
    section each), plus human-written `notes` (markdown)."""
    from vllm_dflash.bench.soak.features import render_features

    checks = [r for r in results if r.get("meta", {}).get("mode") == "features"]
    results = [r for r in results if r.get("meta", {}).get("mode") != "features"]
    names = [f"{r['meta']['mode']}, {r['meta'].get('rounds', 2)} rounds"
             + (", preempt" if r["meta"].get("preempt") else "") + (f", {r['meta']['dtype']}" if r["meta"].get("dtype") else "")
             + "".join(f", {e}" for e in r["meta"].get("server_env", [])) + f" ({r['meta']['started'][:16]})"
             for r in results]
    rows = [_rows(r) for r in results]
    out = ["# Reliability: serving under load, faults and bad input", "",
           "Generated by `python benchmarks/soak.py --render " + " ".join(paths)
           + (f" --notes {notes_path}" if notes_path else "") + " --md docs/RELIABILITY.md` from "
           "the JSON the soak writes (the findings section comes from the notes file and holds no figures); do not "
           "edit the figures by hand. Re-run: `python benchmarks/soak.py --quick` "
           "(~5 min, CI: tests/e2e/test_soak.py) or `python benchmarks/soak.py` (full, ~20 min).", "",
           "## Method", "", METHOD, ""] + ([notes.strip(), ""] if notes else []) + [
           "## Results", "", "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for key in rows[0]:
        out.append(f"| {key} | " + " | ".join(r.get(key, "") for r in rows) + " |")
    out += ["", "Machine: " + "; ".join(
        f"{r['meta']['mode']}: {r['meta'].get('cpu') or str(r['meta']['machine']['cpus']) + ' CPUs'}, "
        f"{r['meta']['machine']['platform']}, load average "
        f"(1 min) {r['meta'].get('loadavg_start', 0):.1f} at the start and "
        f"{r['meta'].get('loadavg_end', 0):.1f} at the end" for r in results)
        + ". Throughput and latency here come from a machine shared with other jobs and from an untrained draft when "
          "the table says so: they are not benchmarks (the serving benchmark is); the counts and checks are the point.",
        ""]
    for name, res in zip(names, results):
        out += [f"## Checks: {name}", "", "| check | result | detail |", "|---|---|---|"]
        out += [f"| {c['name']} | {'ok' if c['ok'] else '**FAIL**'} | {c['detail']} |" for c in res["checks"]]
        out.append("")
    for fc in checks:
        out += ["## Served feature check: stock vLLM vs DFlash (`vllm-dflash soak --features-check`)", "",
                render_features(fc), ""]
    res = results[0]
    out += ["## Malformed requests (" + names[0] + ", both rounds)", "", "| request | HTTP status: count |",
            "|---|---|"]
    by_case: dict[str, Counter] = {}
    for r in res.get("rounds", []):
        for k, n in r["malformed"]["by_case"].items():
            case, code = k.rsplit(":", 1)
            by_case.setdefault(case, Counter())[code] += n
    out += [f"| {case} | " + ", ".join(f"{code}: {n}" for code, n in sorted(c.items())) + " |"
            for case, c in sorted(by_case.items())]
    out += ["", "## Start-up suite (" + names[0] + f", mode {res['meta'].get('startup_mode')})", "",
            "| bad configuration | exit code | message |", "|---|---|---|"]
    for c in res.get("startup_suite") or []:
        msg = c["message"].replace("|", "\\|")
        out.append(f"| {c['name']} | {c['exit_code']} | `{msg}` |")
    out.append("")
    return "\n".join(out)
