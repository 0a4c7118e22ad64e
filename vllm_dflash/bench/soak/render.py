# SPDX-License-Identifier: Apache-2.0
"""docs/RELIABILITY.md from the soak's JSON results (`python benchmarks/soak.py --render ...`, the exact command is on
the document's third line): the method, the notes, one results column per run, every run's checks, the served
feature checks, the malformed requests and the start-up suite."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from vllm_dflash.bench.soak.mixed import mixed_row
from vllm_dflash.bench.soak.report import retried_count

METHOD = """\
`benchmarks/soak.py` starts a real `vllm serve` on loopback (SmolLM2-135M-Instruct target, our DFlash drafter,
`--enforce-eager`, `OMP_NUM_THREADS=1`, 1 GiB KV cache, `--enable-log-requests`) and drives it with a seeded mix of
real prompts (HumanEval as chat and as raw completion, held-out web-text chats): greedy and sampled (temperature,
top-p, top-k, seeds, n=2), streaming and not, completions and chat, short and long `max_tokens`, stop strings; one
greedy case per request feature (logprobs with top_logprobs, prompt_logprobs, presence / frequency penalties,
repetition_penalty, a json_schema response format, a regex, min_tokens; a LoRA adapter unless `--no-lora`), and sampled
requests with penalties or logprobs; clients
that disconnect mid-stream; requests abandoned by a client timeout (a run that records `timeout_cap_s` caps it at a
twentieth of the time their 1,024 tokens take at the fastest rate measured alone, so a fast model cannot finish them
first); malformed requests (prompt longer than the
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


CALIBRATION_METHOD = """\
Chat requests at temperature 1.0 (top-p 1, no top-k, no penalties) with the top-20 logprobs of every emitted token,
half open questions (held-out ShareGPT), half "repeat this text / code exactly"; each configuration served alone
(`--enforce-eager`, `OMP_NUM_THREADS=1`). At each position, I = [emitted token among the k most likely] and E = their
probability by the returned logprobs (vLLM's raw logprobs: at temperature 1.0 the sampling distribution; ties at the
k-th value all count); z = sum(I - E) / sqrt(sum E(1 - E)) is N(0, 1) for a server that samples what its logprobs
say, and |z| above 3.5 fails (vllm_dflash/bench/calibration.py; with little information, sum E(1 - E) below 200, the
check takes the tail from the exact distribution of the misses). "Blind to ties" (a diagnostic): the same sets
scored as a statistic that ignores ties would, I = [emitted logprob at least the k-th largest] but E = exactly k
tokens' probability; bfloat16 logits tie often, which that statistic reads as a skew towards the likely tokens.
"Accepted drafts" is the share of the scored tokens the verifier accepted from drafts."""


MIXED_METHOD = """\
Two servers of the same target, one at a time: stock vLLM without speculation (our plugin not loaded) and our default
config (adaptive drafting), whose engine runs a forced plan (`vllm_dflash/bench/soak/mixed_plan.py`, a sitecustomize
on its PYTHONPATH): each request gets one proposal source by its `X-Request-Id` (DFlash block, merged, own prompt
lookup, cross-request lookup, none), all sampled, interleaved with greedy requests, so sampled DFlash rows (whose q
goes to the verifier) share steps with sampled lookup rows. /v1/completions, a seed per request, top-p 1, no top-k,
EOS ignored; one prompt whose continuations repeat its tokens, and for the cross group another prompt that ends like
it. Per temperature and source, the outcomes (the first max_tokens tokens) are compared with stock's by a two-sample
chi-square (outcomes seen fewer than 10 times pooled); p at most 1e-3 fails. "Verified with q": proposals of the
source verified in a step whose q went to the verifier (none: the source would test nothing, a failure). The
negative control serves the same plan with a mismatched q (uniform at lookup slots, sharpened at DFlash slots): each
drafting source must show p below 1e-3 there. Every server runs with a step budget (`--max-num-batched-tokens`) that
holds each request's prefill whole: stock vLLM 0.32 on CPU ends its engine on a seeded request whose prefill is
chunked."""


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


def _calibration_row(cal: dict[str, Any] | None) -> str:
    if not cal:
        return "not run"
    if "error" in cal:
        return f"FAILED: {cal['error'][:80]}"
    z = lambda v: "n/a" if v is None else f"{v:+.2f}"  # noqa: E731
    return f"{cal['tokens']:,}, {z(cal['z_top1'])} / {z(cal['z_top5'])} (c{cal['concurrency']}, T 1.0)"


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
        "sent again after a connection failure before any response": str(retried_count(rounds)),
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
        "calibration of sampled output: tokens, z top-1 / top-5": _calibration_row(res.get("calibration")),
        "mixed-source distribution check (own servers)": mixed_row(res.get("mixed")),
        "server start / whole run": f"{meta.get('server_start_s')} s / {meta.get('wall_s')} s "
                                    f"(bound {meta['duration_limit_s']:.0f} s)",
        "checks passed": f"{sum(c['ok'] for c in res['checks'])}/{len(res['checks'])}",
    }


def render_markdown(results: list[dict[str, Any]], paths: list[str], notes: str = "", notes_path: str = "") -> str:
    """docs/RELIABILITY.md from soak JSON results (one column per run), served feature checks (features.py, a
    section each) and calibration checks (calibrate.py, one table), plus human-written `notes` (markdown)."""
    from vllm_dflash.bench.soak.calibrate import render_calibration
    from vllm_dflash.bench.soak.features import render_features
    from vllm_dflash.bench.soak.mixed import render_mixed

    checks = [r for r in results if r.get("meta", {}).get("mode") == "features"]
    calibrations = [r for r in results if r.get("meta", {}).get("mode") == "calibration"]
    mixed = [r for r in results if r.get("meta", {}).get("mode") == "mixed"]
    results = [r for r in results if r.get("meta", {}).get("mode") not in ("features", "calibration", "mixed")]
    names = [f"{r['meta']['mode']}, {r['meta'].get('rounds', 2)} rounds"
             + (", preempt" if r["meta"].get("preempt") else "")
             + (f", {r['meta']['dtype']}" if r["meta"].get("dtype") else "")
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
    if calibrations:
        out += ["## Calibration of sampled output (`vllm-dflash soak --calibration`)", "", CALIBRATION_METHOD, "",
                render_calibration(calibrations), ""]
    if mixed:
        out += ["## Mixed proposal sources, sampled: stock vLLM vs DFlash (`vllm-dflash soak --mixed-check`)", "",
                MIXED_METHOD, "", render_mixed(mixed), ""]
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
