# SPDX-License-Identifier: Apache-2.0
"""The main job: SmolLM2-135M-Instruct served by `vllm serve` with our DFlash drafter against stock vLLM (the plugin
not loaded) without speculation and with its n-gram prompt lookup, real HumanEval chat prompts through the OpenAI
client; prints tok/s, the speedup over stock vLLM, τ and how long the demo took.

Start-up dominates on a small CPU (every server compiles its model with torch.compile, vLLM's default), so the three
servers start at once when the memory allows (each paused with SIGSTOP once ready, so it takes no CPU while another
is measured), and the demo prints each server's start-up phase as its log shows it."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from vllm_dflash.utils import get_logger

logger = get_logger(__name__)

BASELINE = "stock vLLM, no speculation"
OURS = "ours"  # our drafter with no extra keys: the default (adaptive drafting), as the bench names it
# memory one demo server takes at most (API server, engine core, worker with the 1 GiB KV space), for parallel starts
SERVER_GIB = 3.0


def _drive(server, prompts: list[list[dict]], max_tokens: int) -> tuple[list[str], list[tuple], int, float]:
    """One request at a time -> texts, (prompt ids, output ids) as the server produced them, tokens, seconds."""
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="none")
    client.chat.completions.create(model="target", messages=[{"role": "user", "content": "Hi"}],
                                   max_tokens=4)  # warm-up
    texts, ids, n_tokens, t0 = [], [], 0, time.perf_counter()
    for messages in prompts:
        r = client.chat.completions.create(model="target", messages=messages, max_tokens=max_tokens, temperature=0.0,
                                           extra_body={"return_token_ids": True})
        texts.append(r.choices[0].message.content)
        ids.append((getattr(r, "prompt_token_ids", None), getattr(r.choices[0], "token_ids", None)))
        n_tokens += r.usage.completion_tokens
    return texts, ids, n_tokens, time.perf_counter() - t0


def demo_configs(draft_dir: Path, block_size: int) -> list[tuple[str, dict | None, dict[str, str]]]:
    """Side by side -> (name, speculative config, extra server env): stock vLLM without speculation and with its
    prompt lookup (its best measured k), the plugin not loaded in either (stock_env), and our drafter as a user gets
    it with no extra keys (adaptive: DFlash, prompt lookup or both per request-step). The first is the baseline."""
    from vllm_dflash.serve.server import stock_env

    return [(BASELINE, None, stock_env()),
            ("stock vLLM n-gram (k=4)", {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                                         "prompt_lookup_min": 2}, stock_env()),
            (OURS, {"method": "dflash", "model": str(draft_dir), "num_speculative_tokens": block_size - 1}, {})]


def start_in_parallel(n_servers: int, meminfo: str | None = None) -> bool:
    """Whether n demo servers fit in the available memory at once (MemAvailable of /proc/meminfo >= n x
    SERVER_GIB); False where it cannot be read."""
    try:
        text = meminfo if meminfo is not None else Path("/proc/meminfo").read_text()
        kib = next(int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return False
    return kib / 2**20 >= n_servers * SERVER_GIB


def _fmt_s(seconds: float) -> str:
    m, sec = divmod(round(seconds), 60)
    return f"{m} min {sec:02d} s" if m else f"{sec} s"


def wait_started(servers: dict, timeout: float, pause_ready: bool, out=None) -> dict[str, float]:
    """Wait until every launched server answers /health, printing each one's start-up phase as its log shows it
    (serve/server.py: START_PHASES) with the time since launch; on a terminal one status line also ticks every
    second. pause_ready: SIGSTOP each server once ready (parallel starts). -> seconds each took to start. A server
    that exits or a timeout stops them all and raises."""
    from vllm_dflash.serve.server import StartWatcher

    out = out or sys.stdout
    tty = out.isatty()
    t0 = time.perf_counter()
    watchers = {n: StartWatcher(srv.log_path) for n, srv in servers.items()}
    phase = {n: ("", t0) for n in servers}
    started: dict[str, float] = {}
    try:
        while len(started) < len(servers):
            now = time.perf_counter()
            if now - t0 > timeout:
                raise TimeoutError(f"demo: vllm serve not healthy after {timeout:.0f}s; logs: "
                                   + ", ".join(str(s.log_path) for s in servers.values()))
            for n, srv in servers.items():
                if n in started:
                    continue
                ph = watchers[n].poll()
                if srv.ready():
                    ph, started[n] = "ready", now - t0
                    if pause_ready:
                        srv.pause()
                if ph != phase[n][0]:
                    phase[n] = (ph, now)
                    note = ("; the compiled graph came from vLLM's compile cache" if ph == "warming up"
                            and watchers[n].cached else "")
                    out.write(("\r\x1b[K" if tty else "") + f"  [{now - t0:4.0f} s] {n}: {ph}{note}\n")
            if tty and len(started) < len(servers):
                ticker = " | ".join(f"{n}: {ph} {now - since:.0f} s" for n, (ph, since) in phase.items()
                                    if n not in started)
                out.write(f"\r  [{now - t0:4.0f} s] {ticker}"[:160] + "\x1b[K")
            out.flush()
            if len(started) < len(servers):
                time.sleep(1.0)
    except BaseException:
        for srv in servers.values():
            srv.stop()
        raise
    return started


def demo_layout(cpu_bind: str | None, environ=None) -> tuple[dict[str, str | None], str]:
    """The servers' OpenMP layout -> (env for every server, a description). Default: every core bound to the model
    worker (VLLM_CPU_OMP_THREADS_BIND=0-N, OMP_NUM_THREADS = cores), the bench's measured layout; a layout already in
    the environment wins; 'auto': vLLM's default."""
    environ = os.environ if environ is None else environ
    if cpu_bind is None and environ.get("VLLM_CPU_OMP_THREADS_BIND"):
        return {}, f"VLLM_CPU_OMP_THREADS_BIND={environ['VLLM_CPU_OMP_THREADS_BIND']} (from the environment)"
    if cpu_bind == "auto":
        return {}, "vLLM's default (--cpu-bind auto)"
    if cpu_bind is None:
        cpu_bind = f"0-{(os.cpu_count() or 1) - 1}"
    cores = 0
    for part in cpu_bind.split(","):
        lo, _, hi = part.partition("-")
        if not lo.strip().isdigit() or (hi and not hi.strip().isdigit()):
            raise ValueError(f"--cpu-bind {cpu_bind!r}: expected core ranges like 0-1 or 0,2, or 'auto'")
        cores += int(hi) - int(lo) + 1 if hi else 1
    return ({"VLLM_CPU_OMP_THREADS_BIND": cpu_bind, "OMP_NUM_THREADS": str(cores)},
            f"VLLM_CPU_OMP_THREADS_BIND={cpu_bind}, OMP_NUM_THREADS={cores}")


def run_demo(draft: str | Path | None = None, num_prompts: int = 4, max_tokens: int = 128, mode: str = "serve",
             dtype: str | None = None, eager: bool = False, cpu_bind: str | None = None,
             parallel: bool | None = None) -> int:
    """parallel: start the servers at once (None: when the memory allows, `start_in_parallel`)."""
    import tempfile

    from transformers import AutoTokenizer

    from vllm_dflash.config import DFlashConfig
    from vllm_dflash.data.prompts import humaneval_prompts
    from vllm_dflash.drafts import resolve_draft_arg
    from vllm_dflash.exactness import verdict_line
    from vllm_dflash.serve.server import Server
    from vllm_dflash.target import prepare_target
    from vllm_dflash.utils import cpu_kind, default_dtype

    t_demo = time.perf_counter()
    target = prepare_target()
    draft_dir, untrained = resolve_draft_arg(draft, target)
    if untrained:
        logger.warning("using an UNTRAINED draft (%s); expect τ ≈ 1 and a slowdown. Train one with "
                       "`vllm-dflash train` (see README).", draft_dir)
    items = humaneval_prompts(num_prompts)
    if mode == "reference":
        from vllm_dflash.eval.reference import evaluate_reference
        from vllm_dflash.eval.report import format_report

        report = evaluate_reference(target=str(target), draft=draft_dir, prompts="humaneval", limit=num_prompts,
                                    max_new_tokens=max_tokens)
        print(format_report(report))
        return 0

    dtype = dtype or default_dtype()
    env, layout = demo_layout(cpu_bind)
    tok = AutoTokenizer.from_pretrained(str(target))
    cfg = DFlashConfig.from_pretrained(draft_dir)
    prompts = [it["messages"] for it in items]
    configs = demo_configs(draft_dir, cfg.block_size)
    parallel = start_in_parallel(len(configs)) if parallel is None else parallel
    log_dir = Path(tempfile.mkdtemp(prefix="vllm-dflash-demo-"))
    servers = {name: Server(str(target), speculative_config=sc, dtype=dtype, enforce_eager=eager, env={**env, **extra},
                            log_path=str(log_dir / f"server{i}.log"))
               for i, (name, sc, extra) in enumerate(configs)}
    how = "eager" if eager else "torch.compile, vLLM's default: a first start compiles, later ones load vLLM's cache"
    print(f"starting {len(servers)} `vllm serve` ({dtype}, {how}) "
          + ("at once (each paused once ready)" if parallel else "one after another") + f"; logs in {log_dir}",
          flush=True)
    timeout = 900 if eager else 1500
    results: dict[str, dict] = {}
    try:
        if parallel:
            for srv in servers.values():
                srv.launch()
            start_s = wait_started(servers, timeout * len(servers), pause_ready=True)
        else:
            start_s = {}
        for name, sc, _ in configs:
            srv = servers[name]
            if parallel:
                srv.resume()
            else:
                start_s.update(wait_started({name: srv.launch()}, timeout, pause_ready=False))
            results[name] = _measure(srv, sc, items, prompts, max_tokens, tok, dtype, results.get(BASELINE))
            results[name]["start_s"] = start_s[name]
            srv.stop()
    finally:
        for srv in servers.values():
            srv.stop()
    elapsed = time.perf_counter() - t_demo
    print(f"\nSmolLM2-135M-Instruct, {len(prompts)} HumanEval chat prompts, greedy, max_tokens {max_tokens}, "
          f"concurrency 1, {dtype}, {'eager' if eager else 'torch.compile (vLLM default)'}; CPU: {cpu_kind()}; "
          f"layout: {layout}")
    print(f"draft: {draft_dir}{'  (UNTRAINED)' if untrained else ''}")
    base = results[BASELINE]
    print(f"  {'configuration':26s} {'tok/s':>7s} {'speedup':>8s} {'tokens/forward':>15s} {'τ (per draft)':>14s}"
          "  start-up")
    for name, r in results.items():
        tau = "–" if r["tau"] is None else f"{r['tau']:.2f}"
        pf = "–" if r["per_forward"] is None else f"{r['per_forward']:.2f}"
        print(f"  {name:26s} {r['tok_s']:7.1f} {r['tok_s'] / base['tok_s']:7.2f}x {pf:>15s} {tau:>14s}  "
              f"{r['start_s']:.0f} s")
    failed = False
    for name, r in results.items():
        if "exact" in r:
            print(f"  {name}: {verdict_line(r['exact'])}")
            failed |= not r["exact"]["passed"]
    print(f"speedup: output tok/s over {BASELINE} (vllm_dflash not loaded in the stock servers); tokens/forward: "
          "generated tokens per target forward (engine step); τ: vLLM's mean acceptance length, counted only on "
          "steps that proposed drafts.")
    print(f"{OURS} (vllm_dflash, default config) vs {BASELINE}: {results[OURS]['tok_s'] / base['tok_s']:.2f}x; "
          f"the demo took {_fmt_s(elapsed)} (server starts {'at once' if parallel else 'one after another'}: "
          f"{_fmt_s(max(start_s.values()) if parallel else sum(start_s.values()))})")
    return 1 if failed else 0


def _own_f32_gemm() -> bool:
    """Does a DFlash server on this machine run float32 linear layers on our GEMM (DFLASH_CPU_GEMM_F32)?"""
    from vllm_dflash import settings
    from vllm_dflash.integration.patches.cpu_gemv import runs_own_f32_gemm

    got = settings.raw_env("cpu_gemm_f32")  # (variable, value) or None: the default
    return runs_own_f32_gemm(got[1] if got else settings.PROCESS_FIELDS["cpu_gemm_f32"].default)


def _measure(srv, sc: dict | None, items: list[dict], prompts: list[list[dict]], max_tokens: int, tok, dtype: str,
             base: dict | None) -> dict:
    """Drive one started server with the prompts, one at a time; a speculative configuration's outputs are explained
    against the baseline's on this server (the target's top-2 margin where they differ)."""
    from vllm_dflash.exactness import explain, server_ids, summarize
    from vllm_dflash.serve import tau

    before = srv.metrics()
    texts, ids, n, dt = _drive(srv, prompts, max_tokens)
    sd = tau.spec_decode(srv.metrics(), before)  # one request at a time: an engine step is a request-step
    r = {"texts": texts, "ids": ids, "tokens": n, "seconds": dt, "tok_s": n / dt,
         "tau": sd["tau"] if sc else None, "per_forward": sd["tokens_per_engine_step"]}
    if sc is not None and base is not None:
        # float32 DFlash on our AVX2 GEMM against stock oneDNN: different summation orders (exactness.F32_KERNELS_NATS)
        kernels_differ = sc.get("method") == "dflash" and dtype == "float32" and _own_f32_gemm()
        divs = [d for it, a, b, ia, ib in zip(items, base["texts"], texts, base["ids"], ids, strict=True)
                if (d := explain(srv.url, tok, it, a, b, dtype, ids=server_ids(*ia, ib[1]),
                                 kernels_differ=kernels_differ))]
        r["exact"] = summarize(len(texts), divs, dtype, kernels_differ)
    return r
