# SPDX-License-Identifier: Apache-2.0
"""The main job: SmolLM2-135M-Instruct served by `vllm serve` with our DFlash drafter vs without
speculation, real HumanEval chat prompts through the OpenAI client; prints τ and the speedup."""
from __future__ import annotations

import os
import time
from pathlib import Path

from vllm_dflash.utils import get_logger

logger = get_logger(__name__)




def _drive(server, prompts: list[list[dict]], max_tokens: int) -> tuple[list[str], list[tuple], int, float]:
    """One request at a time -> texts, (prompt ids, output ids) as the server produced them, tokens, seconds."""
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="none")
    client.chat.completions.create(model="target", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)  # warm-up
    texts, ids, n_tokens, t0 = [], [], 0, time.perf_counter()
    for messages in prompts:
        r = client.chat.completions.create(model="target", messages=messages, max_tokens=max_tokens, temperature=0.0,
                                           extra_body={"return_token_ids": True})
        texts.append(r.choices[0].message.content)
        ids.append((getattr(r, "prompt_token_ids", None), getattr(r.choices[0], "token_ids", None)))
        n_tokens += r.usage.completion_tokens
    return texts, ids, n_tokens, time.perf_counter() - t0


def demo_configs(draft_dir: Path, block_size: int) -> list[tuple[str, dict | None]]:
    """Side by side: no speculation, vLLM's prompt lookup (its best measured k), and our drafter as a user gets it
    with no extra keys (adaptive: DFlash, prompt lookup or both per request-step)."""
    return [("no speculation", None),
            ("vLLM n-gram (k=4)", {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                                   "prompt_lookup_min": 2}),
            ("vllm_dflash", {"method": "dflash", "model": str(draft_dir), "num_speculative_tokens": block_size - 1})]


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
             dtype: str | None = None, eager: bool = False, cpu_bind: str | None = None) -> int:
    from transformers import AutoTokenizer

    from vllm_dflash.config import DFlashConfig
    from vllm_dflash.data.prompts import humaneval_prompts
    from vllm_dflash.drafts import resolve_draft_arg
    from vllm_dflash.exactness import explain, server_ids, summarize, verdict_line
    from vllm_dflash.serve import tau
    from vllm_dflash.serve.server import Server
    from vllm_dflash.target import prepare_target
    from vllm_dflash.utils import cpu_kind, default_dtype

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
    results: dict[str, dict] = {}
    for name, sc in demo_configs(draft_dir, cfg.block_size):
        how = "eager" if eager else "torch.compile: the first start compiles, about 1-2 min on 2 cores"
        print(f"starting vllm serve ({name}; {dtype}, {how}) ...", flush=True)
        t0 = time.perf_counter()
        with Server(str(target), speculative_config=sc, dtype=dtype, enforce_eager=eager, env=env).start(
                timeout=900 if eager else 1500) as srv:
            start_s = time.perf_counter() - t0
            before = srv.metrics()
            texts, ids, n, dt = _drive(srv, prompts, max_tokens)
            after = srv.metrics()
            sd = tau.spec_decode(after, before)  # one request at a time: an engine step is a request-step
            r = {"texts": texts, "ids": ids, "tokens": n, "seconds": dt, "tok_s": n / dt, "start_s": start_s,
                 "tau": sd["tau"] if sc else None, "per_forward": sd["tokens_per_engine_step"]}
            if sc is not None:  # explain each differing output on this server (the target's top-2 margin there)
                base = results["no speculation"]
                divs = [d for it, a, b, ia, ib in zip(items, base["texts"], texts, base["ids"], ids)
                        if (d := explain(srv.url, tok, it, a, b, dtype, ids=server_ids(*ia, ib[1])))]
                r["exact"] = summarize(len(texts), divs, dtype)
        results[name] = r
    print(f"\nSmolLM2-135M-Instruct, {len(prompts)} HumanEval chat prompts, greedy, max_tokens {max_tokens}, "
          f"concurrency 1, {dtype}, {'eager' if eager else 'torch.compile (vLLM default)'}; CPU: {cpu_kind()}; "
          f"layout: {layout}")
    print(f"draft: {draft_dir}{'  (UNTRAINED)' if untrained else ''}")
    base = results["no speculation"]
    print(f"  {'configuration':22s} {'tok/s':>7s} {'speedup':>8s} {'tokens/forward':>15s} {'τ (per draft)':>14s}  start-up")
    for name, r in results.items():
        tau = "–" if r["tau"] is None else f"{r['tau']:.2f}"
        pf = "–" if r["per_forward"] is None else f"{r['per_forward']:.2f}"
        print(f"  {name:22s} {r['tok_s']:7.1f} {r['tok_s'] / base['tok_s']:7.2f}x {pf:>15s} {tau:>14s}  "
              f"{r['start_s']:.0f} s")
    failed = False
    for name, r in results.items():
        if "exact" in r:
            print(f"  {name}: {verdict_line(r['exact'])}")
            failed |= not r["exact"]["passed"]
    print("tokens/forward: generated tokens per target forward (engine step); τ: vLLM's mean acceptance length, "
          "counted only on steps that proposed drafts.")
    return 1 if failed else 0
