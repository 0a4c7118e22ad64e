# SPDX-License-Identifier: Apache-2.0
"""Soak test: `vllm serve` with our DFlash drafter under load, faults and bad input; figures as JSON, exit 1 on
any failed check.

    python benchmarks/soak.py --quick                  # ~5 min (CI: tests/e2e/test_soak.py)
    python benchmarks/soak.py                          # the full soak: 64 clients, 3 rounds, 20 min
    python benchmarks/soak.py --render benchmarks/results/soak-full.json benchmarks/results/soak-quick.json \
        --notes dev/soak_notes.md --md docs/RELIABILITY.md   # the report from the JSON results
    python -m vllm_dflash.bench.soak --quick           # the same outside a checkout (results under ./bench-results/)

Target: SmolLM2-135M-Instruct (prepared from the bundled GGUF); draft: the source checkout's trained draft
(models/SmolLM2-135M-Instruct-DFlash-b8, see vllm_dflash.drafts) if present, else the untrained draft the demo
builds. Loopback only; bounded by --duration (each round takes new requests for 60 % of its share of the time left,
then cancels what is still in flight at the end of its share; a watchdog stops the server past the bound plus
--grace) and by the request counts.

Output: --out / --log, by default under ./bench-results/ (benchmarks/soak.py keeps the checkout's places:
benchmarks/results/soak-{quick,full}.json and runs/soak/soak-{quick,full}-serve.log).

Order: the bad-configuration start-up suite (startup.py) runs while the server starts; the
greedy cases (plain and one per request feature, plan.FEATURES) run alone (one at a time); a restart: the server is
stopped (SIGTERM) while a burst of requests is in flight and started again on the same port (every client must get
an answer or a clean error, none may hang; the greedy cases run again and must equal their alone outputs; --no-restart
skips it); --rounds (2 quick, 3 full) identical seeded rounds of the mix (plan.py) with
`--concurrency` clients; after each round the server must be idle (no running / waiting requests, KV cache at
0 %), and its process-tree RSS is recorded; a final greedy request must equal its alone output; the server log
(--enable-log-requests) must account for every request the engine received.

--preempt: a KV cache of only --kv-blocks blocks (default: max_model_len's worth plus PREEMPT_SPARE_BLOCKS), so the
rounds force preemptions; the run must count some (vllm:num_preemptions). LoRA (on unless --no-lora): the server runs
with --enable-lora and a tiny adapter (lora.py); one greedy case goes through it, and every other case (prompt_logprobs
included) runs on a LoRA-enabled engine. --features-check: instead of the soak, the served feature check against
stock vLLM (features.py). --calibration: instead of the soak, the calibration check of sampled output (calibrate.py:
our default config and stock vLLM served in turn, --calibration-requests chat requests at temperature 1.0, c8 unless
--concurrency, |z| of the top-1 / top-5 sets below 3.5); --calibration-requests N with the soak (quick or full): the
same phase against the soak's server after the rounds (off by default: it adds N x max_tokens tokens of time).
--mixed-check: instead of the soak, the served mixed-source check of sampled output (mixed.py: stock vLLM and our
server with a forced plan of proposal sources, a chi-square per source; --mixed-control adds the mismatched-q server
it must catch); --mixed-per-group N with the soak: the same check after the soak's server stopped (its own servers,
outside the soak's time bound).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from vllm_dflash.bench.soak import report as soak_report
from vllm_dflash.bench.soak.client import RssSampler, rss_by_process
from vllm_dflash.bench.soak.phases import explain_greedy, idle_state, log, restart_phase, run_drive, watchdog
from vllm_dflash.bench.soak.phases import metric_delta  # noqa: F401 (re-exported)
from vllm_dflash.bench.soak.plan import (FULL, QUICK, Req, Sizes, build_round, feature_cases, fit_timeouts,
                                         greedy_cases, load_prompts, near_limit_case, too_long_text)
from vllm_dflash.bench.soak.render import render_markdown
from vllm_dflash.bench.soak.verdict import report_check
from vllm_dflash.utils import HelpFormatter

OUT_DEFAULT = "bench-results/soak-{mode}.json"  # under the current directory; {mode}: quick | full
LOG_DEFAULT = "bench-results/soak-{mode}-serve.log"
MIN_ROUND_S = 90.0  # a round's budget even when the start-up ate the time bound (the bound check then fails)
TAKE_SHARE = 0.6  # share of a round's budget during which new requests are taken
KV_BLOCK_SIZE = 32  # --preempt: the small KV cache's block size (vLLM's CPU attention: a multiple of 32)
PREEMPT_SPARE_BLOCKS = 4  # --preempt: blocks beyond one max_model_len request (its draft look-ahead included)


def resolve_models(a: argparse.Namespace) -> tuple[Path, Path, bool]:
    """-> (target, draft, draft untrained?): --target/--draft when given, else the demo's target and draft (the
    trained draft if present, else the demo's untrained one)."""
    from vllm_dflash.drafts import checkout_draft_dir, ensure_draft
    from vllm_dflash.target import default_target_dir, is_prepared, prepare_target

    if a.target:
        return Path(a.target), Path(a.draft), False
    target = default_target_dir() if is_prepared(default_target_dir()) else prepare_target()
    draft, untrained = ensure_draft(checkout_draft_dir(), target)
    return target, draft, untrained


def run_soak(a: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from vllm_dflash.exactness import near_tie_nats
    from vllm_dflash.serve.server import Server
    from vllm_dflash.utils import cpu_kind

    t0 = time.time()
    sizes: Sizes = QUICK if a.quick else FULL
    target, draft, untrained = resolve_models(a)
    log(f"target {target}; draft {draft}{' (UNTRAINED)' if untrained else ''}")
    rng = random.Random(a.seed)
    prompts = load_prompts(sizes.max_prompt_chars)
    long_text = too_long_text(6 * a.max_model_len)
    lora_dir = None
    if a.lora:
        import tempfile

        from vllm_dflash.bench.soak.lora import LORA_NAME, make_lora

        lora_dir = make_lora(target, Path(tempfile.mkdtemp(prefix="soak-lora-")))
    cases = greedy_cases(prompts, sizes, rng, near_limit_case(target / "tokenizer.json", long_text, a.max_model_len))
    cases += feature_cases(prompts, sizes, rng, LORA_NAME if lora_dir else None)
    round_reqs = build_round(prompts, cases, sizes, a.seed + 1, long_text,
                             pressure=a.concurrency if a.preempt else 0)
    first = cases[1]  # an ordinary greedy case: the final check and the idle probe
    probe_body = {k: v for k, v in first.body.items() if k not in ("stream_options", "stop")}
    probe = Req("greedy", first.endpoint, False, {**probe_body, "max_tokens": 1, "stream": False})
    block = json.loads((draft / "config.json").read_text())["block_size"]
    res: dict[str, Any] = {"meta": {
        "mode": "quick" if a.quick else "full", "seed": a.seed, "concurrency": a.concurrency, "rounds": a.rounds,
        "duration_limit_s": a.duration, "startup_mode": a.startup_mode, "max_model_len": a.max_model_len,
        "target": str(target), "draft": str(draft), "draft_untrained": untrained,
        "num_speculative_tokens": block - 1, "sizes": asdict(sizes), "server_env": a.server_env,
        "preempt": a.preempt, "kv_blocks": a.kv_blocks, "restart": a.restart, "lora": a.lora,
        "calibration_requests": a.calibration_requests, "mixed_per_group": a.mixed_per_group,
        "features": sorted(c.case for c in cases if c.case.startswith("f-")),
        "dtype": a.dtype, "near_tie_nats": near_tie_nats(a.dtype), "cpu": cpu_kind(),
        "prompts_available": len(prompts), "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                                       "python": platform.python_version()},
        "started": time.strftime("%Y-%m-%d %H:%M:%S"), "log": str(a.log), "loadavg_start": os.getloadavg()[0]}}

    suite_thread, suite_out = None, {}
    if not a.skip_startup_suite:
        from vllm_dflash.bench.soak.startup import run_startup_suite

        suite_thread = threading.Thread(target=lambda: suite_out.update(
            r=run_startup_suite(target, draft, a.startup_mode, a.startup_parallel)))
        suite_thread.start()
        log("start-up suite of bad configurations running in the background")

    Path(a.log).parent.mkdir(parents=True, exist_ok=True)
    spec = {"method": "dflash", "model": str(draft), "num_speculative_tokens": block - 1}
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    by_case = {c.case: c for c in cases}
    srv = Server(str(target), speculative_config=spec, max_model_len=a.max_model_len, log_path=str(a.log), dtype=a.dtype,
                 extra_args=["--enable-log-requests"] + server_args(a, lora_dir),
                 env={"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **dict(kv.split("=", 1) for kv in a.server_env)})
    log("starting vllm serve ...")
    ts = time.perf_counter()
    srv.start(timeout=600)
    res["meta"]["server_start_s"] = round(time.perf_counter() - ts, 1)
    log(f"server up at {srv.url} in {res['meta']['server_start_s']} s (pid {srv.proc.pid})")
    stop_watch = threading.Event()
    threading.Thread(target=watchdog, args=(srv, a.duration + a.grace, t0, stop_watch), daemon=True).start()
    sampler = RssSampler(srv.proc.pid).start()
    try:
        res["memory"] = {"start_bytes": sampler.sample(), "start_by_process": rss_by_process(srv.proc.pid)}
        alone, secs = run_drive(srv.url, cases, "soak-alone", 1, a.request_timeout, None, "alone (sequential)")
        res["alone"] = {"cases": len(cases), "seconds": round(secs, 1),
                        "all_ok": all(o["status"] == "ok" for o in alone),
                        "statuses": {o["case"]: o["status"] for o in alone},
                        "outputs": {o["case"]: o["text"] for o in alone}}
        # a timeout request must still be running when its client gives up, however fast the model is
        tok_s = soak_report.fastest_tok_s(alone)
        round_reqs, cap = fit_timeouts(round_reqs, tok_s)
        res["meta"].update(alone_fastest_tok_s=round(tok_s, 1), timeout_cap_s=cap)
        if suite_thread is not None:
            suite_thread.join()
            res["startup_suite"] = suite_out.get("r", [])
            log(f"start-up suite: {sum(c['ok'] for c in res['startup_suite'])}/{len(res['startup_suite'])} ok")
        if a.restart:
            load = [r for r in round_reqs if r.kind in ("greedy", "sampled")][:2 * a.concurrency]
            res["restart"] = restart_phase(srv, sampler, a, load, cases, res["alone"]["outputs"])
            res["memory"].update(start_bytes=sampler.sample(), start_by_process=rss_by_process(srv.proc.pid))
        # each round: new requests for TAKE_SHARE of its budget, then in-flight ones drain until the budget ends
        round_budget = max(MIN_ROUND_S, (t0 + a.duration - (45.0 if a.quick else 90.0) - time.time()) / a.rounds)
        res["meta"]["round_budget_s"] = round(round_budget, 1)
        res["rounds"], sent = [], len(round_reqs)
        for r in range(1, a.rounds + 1):
            reqs = round_reqs[:sent]
            before = srv.metrics()
            start = time.time()
            outs, secs = run_drive(srv.url, reqs, f"soak-r{r}", a.concurrency, a.request_timeout,
                                   start + TAKE_SHARE * round_budget, f"round {r}/{a.rounds} ({a.concurrency} clients)",
                                   hard_deadline=start + round_budget)
            sent = len(outs)
            summ = soak_report.summarize_round(outs, res["alone"]["outputs"], secs)
            summ["greedy"].update(explain_greedy(srv.url, tokenizer, by_case, summ["greedy"]["mismatches"], a.dtype))
            summ.update(index=r, planned=len(round_reqs), after=idle_state(srv, sampler, probe, f"soak-probe{r}-0"))
            summ["metrics"] = metric_delta(before, srv.metrics())
            if a.keep_outcomes:
                summ["outcomes"] = outs
            res["rounds"].append(summ)
            res.setdefault("_outcomes", []).append(outs)
            log(f"round {r}: sent {summ['sent']}, completed {summ['completed']}, 4xx {summ['rejected_4xx']}, "
                f"5xx {summ['failed_5xx']}, unexpected {len(summ['unexpected'])}, "
                f"greedy {summ['greedy']['identical']}/{summ['greedy']['compared']}, "
                f"{summ['output_tok_s']} tok/s, RSS {summ['after']['rss_bytes'] / 2**20:.0f} MiB")
            for u in summ["unexpected"]:
                log(f"  unexpected: {u}")
        if a.calibration_requests:
            from vllm_dflash.bench.soak.calibrate import run_phase

            res["calibration"] = run_phase(srv, a.calibration_requests, a.calibration_max_tokens, a.concurrency,
                                           a.seed, a.request_timeout, desc=f"calibration ({a.concurrency} clients)")
            log(f"calibration: {res['calibration']['tokens']} tokens, z top-1 {res['calibration']['z_top1']}, "
                f"top-5 {res['calibration']['z_top5']}")
        final, _ = run_drive(srv.url, [first], "soak-final", 1, a.request_timeout, None, "final check")
        same = final[0]["text"] == res["alone"]["outputs"][first.case]
        res["final"] = {"case": first.case, "status": final[0]["status"], "text": final[0]["text"],
                        "identical": final[0]["status"] == "ok" and same}
        if final[0]["status"] == "ok" and not same:
            res["final"].update(explain_greedy(srv.url, tokenizer, by_case, [{
                "tag": "soak-final", "case": first.case, "alone": res["alone"]["outputs"][first.case],
                "load": final[0]["text"]}], a.dtype))
        time.sleep(2.0)  # longer than our metrics' flush interval: the snapshots must have caught up
        m = srv.metrics()
        res["metrics_consistency"] = {"ours": m.get("vllm_dflash:accepted_tokens_per_step_count"),
                                      "vllm": m.get("vllm:spec_decode_num_drafts_total")}
        after = [r["after"]["rss_bytes"] for r in res["rounds"]]
        growth = [(b - a_) / a_ for a_, b in zip(after, after[1:])]
        res["memory"].update(peak_bytes=sampler.peak, after_round_bytes=after, samples=sampler.samples,
                             growth_per_round=growth, growth_round2=growth[-1] if growth else None)
    except Exception as e:  # noqa: BLE001 - recorded, fails the run_completed check; the JSON is still written
        res["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
        log(f"the soak stopped early: {type(e).__name__}: {e}")
    finally:
        sampler.stop()
        pid = srv.proc.pid
        stop_offset = Path(a.log).stat().st_size  # what the server logs after this is its shutdown
        srv.stop()
        stop_watch.set()
        try:
            os.killpg(pid, 0)
            gone = False
        except ProcessLookupError:
            gone = True
        res["server_stop"] = {"exit_code": srv.proc.returncode, "group_gone": gone}
        if suite_thread is not None and suite_thread.is_alive():
            suite_thread.join()
            res["startup_suite"] = suite_out.get("r", [])
    raw = Path(a.log).read_bytes()
    text, shutdown = raw[:stop_offset].decode(errors="replace"), raw[stop_offset:].decode(errors="replace")
    parsed = soak_report.parse_server_log(text)
    for r, outs in zip(res.get("rounds", []), res.pop("_outcomes", [])):
        r["server_log"] = soak_report.account(outs, parsed, f"soak-r{r['index']}")
    errs = [ln for ln in text.splitlines() if " ERROR " in ln or "Traceback (most recent" in ln]
    client = [ln for ln in errs if re.search(r"code=4\d\d\)", ln)]  # vLLM logs some 4xx replies at ERROR
    res["server_log_errors"] = {"logged_4xx_replies": len(client),
                                "other": [ln[:300] for ln in errs if ln not in client],
                                # vLLM's own shutdown (SIGTERM, mode abort) may log EngineDeadError: reported only
                                "during_shutdown": sum(" ERROR " in ln for ln in shutdown.splitlines())}
    res["meta"]["wall_s"] = round(time.time() - t0, 1)
    res["meta"]["loadavg_end"] = os.getloadavg()[0]
    if a.mixed_per_group:
        from vllm_dflash.bench.soak.mixed import run_phase as mixed_phase

        log(f"mixed-source check: {a.mixed_per_group} requests per source, its own servers")
        res["mixed"] = mixed_phase(a, target, draft, Path(a.log).parent)
    res["checks"] = soak_report.evaluate(res)
    res["passed"] = all(c["ok"] for c in res["checks"])
    return res


def server_args(a: argparse.Namespace, lora_dir: Path | None) -> list[str]:
    """vllm serve flags of the soak's options: the small KV cache (--preempt) and the LoRA adapter (on unless --no-lora)."""
    out = []
    if a.kv_blocks:
        out += ["--block-size", str(KV_BLOCK_SIZE), "--num-gpu-blocks-override", str(a.kv_blocks)]
    if lora_dir is not None:
        from vllm_dflash.bench.soak.lora import LORA_NAME

        out += ["--enable-lora", "--max-lora-rank", "8", "--lora-modules", f"{LORA_NAME}={lora_dir}"]
    return out


def features_main(a: argparse.Namespace) -> int:
    """--features-check: the served feature check against stock vLLM (features.py); JSON to --out."""
    from vllm_dflash.bench.soak.features import render_features, run_features_check

    target, draft, _ = resolve_models(a)
    res = run_features_check(target, draft, a.dtype, a.max_model_len, Path(a.log).parent)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(render_features(res))
    print(f"features check: {'PASSED' if res['passed'] else 'FAILED'} in {res['meta']['wall_s']} s; JSON: {a.out}")
    return 0 if res["passed"] else 1


def calibration_main(a: argparse.Namespace) -> int:
    """--calibration: the calibration check of sampled output (calibrate.py); JSON to --out."""
    from vllm_dflash.bench.soak.calibrate import render_calibration, run_calibration_check

    target, draft, _ = resolve_models(a)
    env = dict(kv.split("=", 1) for kv in a.server_env)
    res = run_calibration_check(target, draft, a.calibration_configs.split(","), a.dtype, a.calibration_requests,
                                a.calibration_max_tokens, a.concurrency or 8, Path(a.log).parent, a.max_model_len,
                                a.seed, env=env, temperature=a.calibration_temperature)
    return report_check(res, a.out, "calibration check", render_calibration([res]))


def build_parser(out_default: str = OUT_DEFAULT, log_default: str = LOG_DEFAULT,
                 prog: str | None = None) -> argparse.ArgumentParser:
    """The soak's command line, every option's help with its default. out_default / log_default: where the JSON and
    the server log go unless --out / --log say otherwise ({mode} is quick or full; relative paths are under the
    current directory); prog: the usage line's name (`vllm-dflash soak` from the CLI)."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--quick", action="store_true", help="the CI size: ~5 minutes on 2 cores")
    p.add_argument("--duration", type=float, default=None, help="time bound in s (default: 300 quick, 1200 full)")
    p.add_argument("--concurrency", type=int, default=None, help="concurrent clients (default: 16 quick, 64 full)")
    p.add_argument("--seed", type=int, default=0, help="seed of the request mix (plan.py)")
    p.add_argument("--rounds", type=int, default=None,
                   help="identical rounds (default 2 quick, 3 full; memory growth: the last round vs the one before)")
    p.add_argument("--max-model-len", type=int, default=2048, help="vLLM's max_model_len of the server")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="model dtype (default float32: greedy outputs under load must then equal their alone outputs "
                        "token for token; with bfloat16 a divergence passes only at a numerical near-tie of the "
                        "target, shown with its top-2 logprob margin)")
    p.add_argument("--request-timeout", type=float, default=None, help="client timeout of a valid request (s) "
                   "(default: 150 quick, 600 full)")
    p.add_argument("--grace", type=float, default=120.0,
                   help="watchdog: seconds past --duration before the server is stopped")
    p.add_argument("--startup-mode", choices=["fork", "exec"], default=None,
                   help="bad configurations: forked from one vLLM import (quick default) or one process each (full)")
    p.add_argument("--startup-parallel", type=int, default=1, help="exec mode: bad configurations started at a time")
    p.add_argument("--skip-startup-suite", action="store_true", help="skip the bad-configuration start-up suite")
    p.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment variable for the server (repeatable), e.g. MALLOC_MMAP_THRESHOLD_=1048576")
    p.add_argument("--keep-outcomes", action="store_true", help="store every request's outcome in the JSON")
    p.add_argument("--preempt", action="store_true",
                   help="a KV cache small enough to force preemptions (--kv-blocks); the run must count some")
    p.add_argument("--kv-blocks", type=int, default=None,
                   help=f"KV-cache blocks of {KV_BLOCK_SIZE} tokens (default: none, vLLM's size; with --preempt: "
                        f"max_model_len / {KV_BLOCK_SIZE} + {PREEMPT_SPARE_BLOCKS})")
    p.add_argument("--no-restart", dest="restart", action="store_false",
                   help="skip the server restart under load")
    p.add_argument("--no-lora", dest="lora", action="store_false",
                   help="serve without --enable-lora (default: a tiny LoRA adapter made on the spot, lora.py, with "
                        "one greedy case through it)")
    p.add_argument("--features-check", action="store_true",
                   help="run the served feature check against stock vLLM instead of the soak (features.py)")
    p.add_argument("--calibration", action="store_true",
                   help="run the calibration check of sampled output instead of the soak (calibrate.py; JSON "
                        "default: calibration-{dtype}.json beside the soak's)")
    p.add_argument("--calibration-configs", default="ours,stock",
                   help="--calibration: configurations served in turn (ours, stock, fixed)")
    p.add_argument("--calibration-requests", type=int, default=None,
                   help="calibration requests (default 256 with --calibration; with the soak: 0, no calibration "
                        "phase)")
    p.add_argument("--calibration-max-tokens", type=int, default=100,
                   help="tokens per calibration request (EOS ignored)")
    p.add_argument("--calibration-temperature", type=float, default=1.0,
                   help="--calibration: sampling temperature (other than 1.0: the servers return logprobs after "
                        "temperature, --logprobs-mode processed_logprobs)")
    from vllm_dflash.bench.soak.mixed import add_arguments as add_mixed_arguments

    add_mixed_arguments(p)
    p.add_argument("--target", default=None, help="target folder (default: the demo's, SmolLM2-135M-Instruct)")
    p.add_argument("--draft", default=None, help="with --target: its draft folder")
    both = "{quick,full}"
    p.add_argument("--out", default=None, help=f"JSON result (default {out_default.replace('{mode}', both)})")
    p.add_argument("--log", default=None, help=f"server log (default {log_default.replace('{mode}', both)})")
    p.add_argument("--render", nargs="+", default=None, metavar="JSON", help="render these results as markdown")
    p.add_argument("--md", default=None, help="with --render: write the markdown here (else stdout)")
    p.add_argument("--notes", default=None, help="with --render: a markdown file of findings to include")
    return p


def main(argv: list[str] | None = None, out_default: str = OUT_DEFAULT, log_default: str = LOG_DEFAULT,
         prog: str | None = None) -> int:
    """The soak run from its command line (`build_parser`)."""
    p = build_parser(out_default, log_default, prog)
    a = p.parse_args(argv)
    if bool(a.target) != bool(a.draft):
        p.error("--target and --draft go together (a target folder and its DFlash draft folder)")
    from vllm_dflash.bench.soak.mixed import DEFAULT_PER_GROUP, check_arguments, mixed_main

    check_arguments(p, a)
    if a.render:
        md = render_markdown([json.loads(Path(f).read_text()) for f in a.render], a.render,
                             Path(a.notes).read_text() if a.notes else "", a.notes or "")
        if a.md:
            Path(a.md).write_text(md)
            log(f"wrote {a.md}")
        else:
            print(md)
        return 0
    if a.calibration:
        a.calibration_requests = 256 if a.calibration_requests is None else a.calibration_requests
        a.out = Path(a.out or str(Path(out_default.replace("{mode}", "x")).with_name(f"calibration-{a.dtype}.json")))
        a.log = Path(a.log or log_default.replace("{mode}", "calibration"))
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        return calibration_main(a)
    a.calibration_requests = a.calibration_requests or 0
    if a.mixed_check:
        a.mixed_per_group = a.mixed_per_group or DEFAULT_PER_GROUP
        a.out = Path(a.out or str(Path(out_default.replace("{mode}", "x")).with_name(f"mixed-check-{a.dtype}.json")))
        a.log = Path(a.log or log_default.replace("{mode}", "mixed"))
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        return mixed_main(a, *resolve_models(a)[:2])
    a.mixed_per_group = a.mixed_per_group or 0
    mode = "features" if a.features_check else "quick" if a.quick else "full"
    if a.features_check:
        a.out = Path(a.out or out_default.replace("{mode}", mode))
        a.log = Path(a.log or log_default.replace("{mode}", mode))
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        return features_main(a)
    if a.preempt and not a.kv_blocks:
        a.kv_blocks = -(-a.max_model_len // KV_BLOCK_SIZE) + PREEMPT_SPARE_BLOCKS
    a.duration = a.duration or (300.0 if a.quick else 1200.0)
    a.concurrency = a.concurrency or (16 if a.quick else 64)
    a.rounds = a.rounds or (2 if a.quick else 3)  # full: 3 rounds fill the 20 min and show RSS settling
    a.startup_mode = a.startup_mode or ("fork" if a.quick else "exec")
    a.request_timeout = a.request_timeout or (150.0 if a.quick else 600.0)
    a.out = Path(a.out or out_default.replace("{mode}", mode))
    a.log = Path(a.log or log_default.replace("{mode}", mode))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: the server is stopped
    res = run_soak(a)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1))
    for c in res["checks"]:
        print(f"  [{'ok' if c['ok'] else 'FAIL'}] {c['name']}: {c['detail']}")
    print(f"soak ({mode}): {'PASSED' if res['passed'] else 'FAILED'} in {res['meta']['wall_s']} s; JSON: {a.out}")
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
