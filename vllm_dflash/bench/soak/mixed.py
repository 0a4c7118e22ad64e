# SPDX-License-Identifier: Apache-2.0
"""The served mixed-source check of sampled output (issue 61): `vllm-dflash soak --mixed-check`, and a phase of a
soak run (`--mixed-per-group N`). The served form of tests/vllm/test_vllm_sampling_mixed.py.

Two `vllm serve` processes of the same target, one at a time: stock vLLM without speculation (our plugin not
loaded: serve/server.py stock_env), and our default config (adaptive drafting) whose engine runs a forced plan
(mixed_plan.py, through a sitecustomize on its PYTHONPATH): each request gets one proposal source by its request id
(`X-Request-Id: dflashmix-<group>-<i>`, groups by i % 6): a DFlash block, merged, its own prompt lookup, a
cross-request lookup, none -- all sampled -- and greedy requests, interleaved so that sampled DFlash rows (whose q
goes to the verifier) share steps with sampled lookup rows. Requests: /v1/completions, one main prompt whose
continuations repeat its tokens (own lookups find proposals) and, for the cross group, another prompt sharing its
tail (its cross lookups find the main prompt's continuations: proposals from another context, which a verifier
that accepted everything would let through), `seed` per request, `ignore_eos`, top-p 1, no top-k.

Per temperature and group, the first max_tokens tokens of our server's requests are compared with stock's (other
seeds; the main prompt's sampled groups pooled, the cross prompt's alone) by a two-sample chi-square
(vllm_dflash/bench/chi2.py); p <= P_MIN fails. The forced plan counts, per group, the proposals verified in a step
whose q went to the verifier: a drafting group with none would test nothing, and fails. With `control`, a third
server runs the forced plan with a mismatched q (mixed_plan.MISMATCHED_Q): every drafting group must then show
p < P_MIN (the check's power at this size); where it does not, `control_size_factor` estimates how many times larger
the groups would have to be. Greedy requests must equal stock's token for token in float32."""
from __future__ import annotations

import asyncio
import collections
import os
import time
from pathlib import Path
from typing import Any

from vllm_dflash.bench.chi2 import MIN_COUNT, chi2_two_sample_pvalue, size_to_reject
from vllm_dflash.bench.soak.mixed_plan import DRAFTING, GROUPS, ID_PREFIX, write_sitecustomize

P_MIN = 1e-3  # ours must stay above it per group; the negative control must fall below it
MIN_BINS = 4  # the target's outcomes seen at least MIN_COUNT times: fewer is too peaked to test
DEFAULT_PER_GROUP = 200
DEFAULT_TEMPERATURES = (0.7, 1.0)
DEFAULT_MAX_TOKENS = 3
DEFAULT_CONCURRENCY = 48
SERVER_SEEDS = {"stock": 0, "ours": 1_000_000, "control": 2_000_000}  # each server samples with its own seeds
# SmolLM2-135M-Instruct: a string of random bits, continued (each next bit is uncertain, for the target and the
# draft, and the string repeats its n-grams, so own lookups propose); the cross prompt ends like it after other text,
# and its continuations differ
TEXT_PROMPTS = (
    "Coin flips as bits (1 = heads): 1001011010110010100110101101001010011",
    "A random binary string: 0111001010011",
)


def mixed_requests(prompts: tuple[Any, Any], per_group: int, max_tokens: int, temperature: float, seed: int,
                   offset: int = 0) -> list[tuple[str, dict[str, Any]]]:
    """(request id, /v1/completions body) per request, groups interleaved (GROUPS[i % 6]); ids from `offset`."""
    out = []
    for i in range(per_group * len(GROUPS)):
        g = GROUPS[i % len(GROUPS)]
        body = {"model": "target", "prompt": prompts[1] if g == "cross" else prompts[0], "max_tokens": max_tokens,
                "temperature": 0.0 if g == "greedy" else temperature, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                "seed": seed + offset + i, "ignore_eos": True, "return_token_ids": True}
        out.append((f"{ID_PREFIX}-{g}-{offset + i}", body))
    return out


async def _send_all(url: str, reqs: list[tuple[str, dict[str, Any]]], concurrency: int,
                    timeout: float) -> list[dict[str, Any]]:
    """Each request, `concurrency` at a time in order -> {"tokens": [...]} or {"error": ...} per request. A request
    whose connection failed before any response (a pooled keep-alive connection the server closed) is sent once
    more on a new connection, as the soak's client does (client.py), with "-retry" after its id: {"retried": True}."""
    import httpx

    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def post(c: httpx.AsyncClient, rid: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            r = await c.post("/v1/completions", json=body, headers={"X-Request-Id": rid})
            if r.status_code != 200:
                return {"error": f"HTTP {r.status_code}: {r.text[:200]}"}
            return {"tokens": list(r.json()["choices"][0]["token_ids"])}
        except httpx.TransportError as e:
            return {"error": f"{type(e).__name__}: {e}"[:200], "transport": not isinstance(e, httpx.TimeoutException)}
        except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as e:
            return {"error": f"{type(e).__name__}: {e}"[:200]}

    async with httpx.AsyncClient(base_url=url, limits=limits, trust_env=False, timeout=timeout) as c:
        async def one(rid: str, body: dict[str, Any]) -> dict[str, Any]:
            async with sem:
                out = await post(c, rid, body)
                if out.pop("transport", False):
                    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=timeout) as fresh:
                        out = {**await post(fresh, f"{rid}-retry", body), "retried": True}
                        out.pop("transport", None)
                return out

        return await asyncio.gather(*(one(rid, body) for rid, body in reqs))


def step_budget(prompts: tuple[Any, Any], max_tokens: int, concurrency: int) -> int:
    """--max-num-batched-tokens of both servers: a step that holds every request's prefill whole (stock vLLM 0.32 on
    CPU dies on a seeded request whose prefill is chunked: "CPU Generator does not use offset"; ours patches it,
    patches/generator_rewind.py). A text prompt counts its characters (at least its tokens)."""
    return max(2048, concurrency * (max(len(p) for p in prompts) + max_tokens + 16))


def _read_probe(path: Path) -> dict[str, Any] | None:
    import json

    time.sleep(1.0)  # the engine writes its counters after each drafting step: the last one lands
    return json.loads(path.read_text()) if path.exists() else None


def _serve(name: str, target: Path, draft: Path, dtype: str, max_model_len: int, log_dir: Path, work: Path,
           env: dict[str, str] | None, prompts: tuple[Any, Any], per_group: int, max_tokens: int,
           temperatures: list[float], concurrency: int, start_timeout: float) -> dict[str, Any]:
    """One server (stock | ours | control): start, each temperature's requests, stop. -> its entry: outcomes
    (per temperature, per request: tokens or None), the forced plan's counters per temperature, timings."""
    from vllm_dflash.serve.server import Server, stock_env

    env = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    probe = work / f"probe-{name}.json"
    if name != "stock":
        site = write_sitecustomize(work / name, probe, control=name == "control").parent
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH"),
                                                        os.environ.get("PYTHONPATH")) if p)
    # as the calibration check serves them (calibrate.config_server): stock without the plugin, ours by default
    spec = None if name == "stock" else {"method": "dflash", "model": str(draft)}
    budget = step_budget(prompts, max_tokens, concurrency)
    srv = Server(str(target), speculative_config=spec, max_model_len=max_model_len, dtype=dtype,
                 log_path=str(log_dir / f"mixed-{dtype}-{name}-serve.log"),
                 env={**env, **stock_env()} if name == "stock" else env,
                 extra_args=["--max-num-batched-tokens", str(budget)])
    entry: dict[str, Any] = {"log": srv.log_path, "outcomes": {}, "probe": {}, "seconds": {}}
    try:
        ts = time.perf_counter()
        srv.start(timeout=start_timeout)
        entry["server_start_s"] = round(time.perf_counter() - ts, 1)
        entry["plugin_loaded"] = "[vllm_dflash." in Path(srv.log_path).read_text(errors="replace")
        _log(f"{name}: server up in {entry['server_start_s']} s")
        n = per_group * len(GROUPS)
        for k, T in enumerate(temperatures):
            reqs = mixed_requests(prompts, per_group, max_tokens, T, SERVER_SEEDS[name], offset=k * n)
            ts = time.perf_counter()
            outs = asyncio.run(_send_all(srv.url, reqs, concurrency, 600.0))
            entry["seconds"][str(T)] = round(time.perf_counter() - ts, 1)
            entry["outcomes"][str(T)] = [o.get("tokens") for o in outs]
            entry.setdefault("errors", []).extend(o["error"] for o in outs if "error" in o)
            entry["retried"] = entry.get("retried", 0) + sum(o.get("retried", False) for o in outs)
            entry["probe"][str(T)] = _read_probe(probe) if name != "stock" else None
            _log(f"{name}: T {T}: {len(reqs)} requests in {entry['seconds'][str(T)]} s")
    except Exception as e:  # noqa: BLE001 - recorded, fails this server's check; the others still run
        entry["error"] = f"{type(e).__name__}: {e}"[:500]
    finally:
        srv.stop()
    entry["failed"] = len(entry.get("errors", []))
    entry["errors"] = entry.get("errors", [])[:5]
    return entry


def _log(msg: str) -> None:
    import sys

    print(f"[mixed {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _by_group(outcomes: list[list[int] | None]) -> dict[str, collections.Counter]:
    out = {g: collections.Counter() for g in GROUPS}
    for i, toks in enumerate(outcomes):
        if toks is not None:
            out[GROUPS[i % len(GROUPS)]][tuple(toks)] += 1
    return out


def _pvalue(a: collections.Counter, b: collections.Counter) -> float | None:
    return chi2_two_sample_pvalue(a, b) if a and b else None


def evaluate_temperature(stock: list, ours: list, control: list | None, with_q: dict[str, int],
                         cross_lookups: int) -> dict[str, Any]:
    """One temperature's verdicts from the three servers' outcomes (request order; None: failed) and the forced
    plan's counters over it (ours)."""
    b, o = _by_group(stock), _by_group(ours)
    c = _by_group(control) if control is not None else None
    main = sum((b[g] for g in GROUPS if g not in ("greedy", "cross")), collections.Counter())
    groups: dict[str, dict[str, Any]] = {}
    for g in GROUPS[:-1]:
        target = b["cross"] if g == "cross" else main
        p = _pvalue(target, o[g])
        e: dict[str, Any] = {"n": sum(o[g].values()), "p": p, "passed": p is not None and p > P_MIN}
        if g in DRAFTING:
            e["with_q"] = with_q.get(g, 0)
        if c is not None:
            pc = _pvalue(target, c[g])
            e.update(control_p=pc, caught=pc is not None and pc < P_MIN)
            if g in DRAFTING and not e["caught"] and pc is not None:
                e["control_size_factor"] = size_to_reject(target, c[g], P_MIN)
        groups[g] = e
    greedy = [(s, x) for i, (s, x) in enumerate(zip(stock, ours, strict=True)) if GROUPS[i % len(GROUPS)] == "greedy"]
    bins = lambda cnt: sum(v >= MIN_COUNT for v in cnt.values())  # noqa: E731
    return {"groups": groups, "target_bins": {"main": bins(main), "cross": bins(b["cross"])},
            "cross_lookups": cross_lookups,
            "greedy_identical": [sum(s == x and s is not None for s, x in greedy), len(greedy)]}


def run_mixed_check(target: Path, draft: Path, dtype: str, per_group: int, max_tokens: int,
                    temperatures: list[float], concurrency: int, control: bool, log_dir: Path,
                    env: dict[str, str] | None = None, prompts: tuple[Any, Any] = TEXT_PROMPTS,
                    max_model_len: int = 2048, start_timeout: float = 600.0) -> dict[str, Any]:
    """Stock, ours and (control) the mismatched-q server in turn; -> the result (meta, servers, temperatures,
    checks, passed), JSON-able. prompts: (main, cross), each a text or a list of token ids. env: extra server
    environment (PYTHONPATH is kept behind the forced plan's folder)."""
    import platform
    import tempfile

    from vllm_dflash.utils import cpu_kind

    t0 = time.time()
    log_dir.mkdir(parents=True, exist_ok=True)
    names = ["stock", "ours"] + (["control"] if control else [])
    res: dict[str, Any] = {"meta": {
        "mode": "mixed", "target": str(target), "draft": str(draft), "dtype": dtype, "per_group": per_group,
        "groups": list(GROUPS), "max_tokens": max_tokens, "temperatures": list(temperatures),
        "concurrency": concurrency, "control": control, "p_min": P_MIN, "prompts": [str(p)[:200] for p in prompts],
        "max_model_len": max_model_len, "enforce_eager": True,
        "max_num_batched_tokens": step_budget(prompts, max_tokens, concurrency), "env": env or {}, "cpu": cpu_kind(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "started": time.strftime("%Y-%m-%d %H:%M:%S"), "loadavg_start": os.getloadavg()[0]}, "servers": {}}
    with tempfile.TemporaryDirectory(prefix="dflash-mixed-") as work:
        for name in names:
            res["servers"][name] = _serve(name, target, draft, dtype, max_model_len, log_dir, Path(work), env,
                                          prompts, per_group, max_tokens, list(temperatures), concurrency,
                                          start_timeout)
    res["temperatures"] = {}
    srv = res["servers"]
    for T in map(str, temperatures):
        if any(T not in s["outcomes"] for s in srv.values()):
            continue
        probes = srv["ours"]["probe"]
        now, before = probes.get(T) or {}, _previous(probes, T) or {}
        with_q = {g: now.get("with_q", {}).get(g, 0) - before.get("with_q", {}).get(g, 0) for g in DRAFTING}
        res["temperatures"][T] = evaluate_temperature(
            srv["stock"]["outcomes"][T], srv["ours"]["outcomes"][T],
            srv["control"]["outcomes"][T] if control else None, with_q,
            now.get("cross", 0) - before.get("cross", 0))
        res["temperatures"][T]["probe_found"] = bool(now)
    for s in srv.values():
        s.pop("outcomes")
    res["meta"].update(wall_s=round(time.time() - t0, 1), loadavg_end=os.getloadavg()[0])
    res["checks"] = mixed_checks(res)
    res["passed"] = all(c["ok"] for c in res["checks"])
    return res


def _previous(probes: dict[str, Any], T: str) -> dict[str, Any] | None:
    keys = list(probes)
    i = keys.index(T)
    return probes[keys[i - 1]] if i > 0 else None


def _check(name: str, ok: bool, detail: str) -> dict[str, Any]:
    return {"name": name, "ok": bool(ok), "detail": detail}


def _p(p: float | None) -> str:
    return "n/a" if p is None else f"{p:.2g}"


def mixed_checks(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The verdicts of a run_mixed_check result (module doc)."""
    if "error" in res:
        return [_check("mixed_ran", False, res["error"][:300])]
    out = []
    for name, s in res["servers"].items():
        out.append(_check(f"mixed_requests_ok:{name}", "error" not in s and s["failed"] == 0,
                          s.get("error") or f"{s['failed']} failed requests"
                          + (f": {s['errors'][:2]}" if s["failed"] else "")
                          + f"; {s.get('retried', 0)} sent again after a connection failure before any response"))
    if "stock" in res["servers"] and "plugin_loaded" in res["servers"]["stock"]:
        out.append(_check("mixed_stock_without_plugin", res["servers"]["stock"]["plugin_loaded"] is False,
                          f"vllm_dflash in the stock server's log: {res['servers']['stock']['plugin_loaded']}"))
    for T, r in res["temperatures"].items():
        gs = r["groups"]
        bins = r["target_bins"]
        out.append(_check(f"mixed_informative:T{T}", min(bins.values()) >= MIN_BINS,
                          f"the target's outcomes seen {MIN_COUNT}+ times: main prompt {bins['main']}, cross prompt "
                          f"{bins['cross']} (fewer than {MIN_BINS}: too peaked or too sparse to test)"))
        out.append(_check(f"mixed_same_distribution:T{T}", all(e["passed"] for e in gs.values()),
                          "p per source: " + ", ".join(f"{g} {_p(e['p'])}" for g, e in gs.items())
                          + f" (fails at <= {P_MIN:g})"))
        missing = [g for g in DRAFTING if gs[g].get("with_q", 0) <= 0]
        out.append(_check(f"mixed_verified_with_q:T{T}", r.get("probe_found") and not missing,
                          ("no counters from the forced plan: it did not run" if not r.get("probe_found") else
                           "proposals verified beside a hand-off of q: "
                           + ", ".join(f"{g} {gs[g].get('with_q', 0)}" for g in DRAFTING)
                           + (f"; none for {missing}: would test nothing" if missing else ""))))
        out.append(_check(f"mixed_cross_lookups:T{T}", r["cross_lookups"] > 0,
                          f"{r['cross_lookups']} cross-request lookups planned for the cross group"))
        same, n = r["greedy_identical"]
        if res["meta"]["dtype"] == "float32":
            out.append(_check(f"mixed_greedy_identical:T{T}", same == n, f"{same}/{n} greedy requests equal stock's"))
        if res["meta"]["control"]:
            missed = {g: gs[g].get("control_size_factor") for g in DRAFTING if not gs[g]["caught"]}
            out.append(_check(f"mixed_control_caught:T{T}", not missed,
                              "negative control (mismatched q), p per source: "
                              + ", ".join(f"{g} {_p(gs[g]['control_p'])}" for g in DRAFTING)
                              + (f"; missed {sorted(missed)}: " + _larger(missed) if missed else "")))
    return out


def _larger(missed: dict[str, float | None]) -> str:
    seen = [v for v in missed.values() if v is not None]
    if len(seen) < len(missed):
        return "no difference from stock beyond chance for " + ", ".join(g for g, v in missed.items() if v is None)
    return f"groups ~{max(seen):.1f}x larger would catch it"


def render_mixed(results: list[dict[str, Any]]) -> str:
    """A markdown table, one row per temperature and source of each `--mixed-check` result (docs/RELIABILITY.md)."""
    lines = ["| run | T | source | requests | p (ours vs stock) | verified with q | p (mismatched q) | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for res in results:
        m = res["meta"]
        run = f"{m['dtype']}, {m['cpu']}, {m['per_group']}/source x {m['max_tokens']} tokens ({m['started'][:16]})"
        for T, r in res.get("temperatures", {}).items():
            for g, e in r["groups"].items():
                drafting = g in DRAFTING
                ok = e["passed"] and (not drafting or e["with_q"] > 0) and (not drafting or e.get("caught", True))
                lines.append(f"| {run} | {T} | {g} | {e['n']} | {_p(e['p'])} | {e.get('with_q', '–')} | "
                             f"{_p(e.get('control_p')) if m['control'] else 'not run'} | "
                             f"{'ok' if ok else '**FAIL**'} |")
        bad = [c["name"] for c in res["checks"] if not c["ok"]]
        lines.append(f"| {run} | all | | | | | | {'ok' if not bad else '**FAIL**: ' + ', '.join(bad)} "
                     f"({res['meta']['wall_s']:.0f} s) |")
    return "\n".join(lines)


def mixed_row(res: dict[str, Any] | None) -> str:
    """The soak table's row of a mixed phase."""
    if not res:
        return "not run"
    if "error" in res or not res.get("temperatures"):
        return "FAILED: " + (res.get("error") or "no result")[:80]
    ps = " / ".join(_p(min(e["p"] or 0 for e in r["groups"].values())) for r in res["temperatures"].values())
    ctl = ("caught" if all(c["ok"] for c in res["checks"] if c["name"].startswith("mixed_control"))
           else "MISSED") if res["meta"]["control"] else "not run"
    return (f"{res['meta']['per_group']}/source, T {' / '.join(res['temperatures'])}: min p {ps}; mismatched q "
            f"{ctl}; {'ok' if res['passed'] else 'FAIL'}")


def add_arguments(p) -> None:
    """The soak's flags of the mixed-source check (run.py's parser)."""
    p.add_argument("--mixed-check", action="store_true",
                   help="run the served mixed-source check of sampled output instead of the soak (mixed.py; JSON "
                        "default: mixed-check-{dtype}.json beside the soak's)")
    p.add_argument("--mixed-per-group", type=int, default=None, metavar="N",
                   help=f"requests per proposal source and temperature (default {DEFAULT_PER_GROUP} with "
                        "--mixed-check: ~8 min on 2 cores, ~13 with --mixed-control; with the soak: 0, no mixed "
                        "phase)")
    p.add_argument("--mixed-control", action="store_true",
                   help="the mixed check also serves the negative control (a mismatched q), which it must catch")
    p.add_argument("--mixed-temperatures", default=",".join(map(str, DEFAULT_TEMPERATURES)),
                   help="the mixed check's sampling temperatures (comma list)")
    p.add_argument("--mixed-max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help="the mixed check's tokens per request (its outcome: these tokens)")


def check_arguments(p, a) -> None:
    """Refuse bad mixed-check values (p.error names the flag); a.mixed_temperatures becomes a list of floats."""
    if a.mixed_per_group is not None and not 1 <= a.mixed_per_group <= 10_000:
        p.error(f"--mixed-per-group {a.mixed_per_group}: requests per source must be 1..10000")
    try:
        temps = [float(t) for t in a.mixed_temperatures.split(",")]
    except ValueError:
        p.error(f"--mixed-temperatures {a.mixed_temperatures!r}: not a comma list of numbers, e.g. 0.7,1.0")
    if not temps or any(not 0.0 < t <= 2.0 for t in temps) or len(set(temps)) < len(temps):
        p.error(f"--mixed-temperatures {a.mixed_temperatures!r}: distinct temperatures in (0, 2] (greedy requests "
                "are a group of their own)")
    a.mixed_temperatures = temps
    if not 2 <= a.mixed_max_tokens <= 64:
        p.error(f"--mixed-max-tokens {a.mixed_max_tokens}: 2..64 (the first token is sampled before any proposal)")
    if a.mixed_control and not (a.mixed_check or a.mixed_per_group):
        p.error("--mixed-control goes with --mixed-check or --mixed-per-group N")


def run_phase(a, target: Path, draft: Path, log_dir: Path) -> dict[str, Any]:
    """The mixed check from the soak's command line (`--mixed-check`, or a soak's `--mixed-per-group`)."""
    env = dict(kv.split("=", 1) for kv in a.server_env)
    return run_mixed_check(target, draft, a.dtype, a.mixed_per_group, a.mixed_max_tokens, a.mixed_temperatures,
                           a.concurrency or DEFAULT_CONCURRENCY, a.mixed_control, log_dir, env,
                           max_model_len=a.max_model_len)


def mixed_main(a, target: Path, draft: Path) -> int:
    """--mixed-check: the check alone; JSON to a.out."""
    from vllm_dflash.bench.soak.verdict import report_check

    res = run_phase(a, target, draft, Path(a.log).parent)
    return report_check(res, a.out, "mixed check", render_mixed([res]))
