# SPDX-License-Identifier: Apache-2.0
"""The soak test's bookkeeping: a round's figures from its outcomes, the server-log accounting and the pass/fail
checks over the whole JSON result (the markdown of docs/RELIABILITY.md: render.py). Pure functions, so the checks are
unit-tested on doctored results (tests/unit/test_soak_checks.py)."""
from __future__ import annotations

import re
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


def fastest_tok_s(outcomes: list[dict[str, Any]], min_tokens: int = 4) -> float:
    """Output tokens per second of the fastest answered request (its latency includes the prompt's prefill)."""
    rates = [o["completion_tokens"] / o["latency_s"] for o in outcomes
             if o["status"] == "ok" and (o["completion_tokens"] or 0) >= min_tokens and o["latency_s"] > 0]
    return max(rates, default=0.0)


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
    retried = retried_count(rounds)
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
    if res.get("calibration") is not None or res.get("meta", {}).get("calibration_requests"):
        from vllm_dflash.bench.calibration import calibration_checks

        cal = res.get("calibration") or {"error": "no calibration phase result"}
        checks += [{**c, "name": c["name"].removesuffix(":soak")} for c in calibration_checks("soak", cal)]
    if res.get("mixed") is not None or res.get("meta", {}).get("mixed_per_group"):
        from vllm_dflash.bench.soak.mixed import mixed_checks

        checks += mixed_checks(res.get("mixed") or {"error": "no mixed-source check result"})
    lim = res.get("meta", {}).get("duration_limit_s")
    wall = res.get("meta", {}).get("wall_s")
    checks.append(_check("within_time_bound", lim is not None and wall is not None and wall <= lim,
                         f"wall {wall} s, bound {lim} s"))
    return checks


def retried_count(rounds: list[dict[str, Any]]) -> int:
    """Requests sent again after a connection failure before any response, over the rounds."""
    return sum(len(r.get("retried", [])) for r in rounds)
