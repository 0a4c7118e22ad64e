# SPDX-License-Identifier: Apache-2.0
"""Evaluate a draft through vLLM (offline LLM, in this process): τ and per-position acceptance from vLLM's
spec-decode counters, tokens per target forward (generated tokens / request-steps), histogram from our
accepted-per-step metric, speedup = output tokens/s with our drafter over the same engine settings without
speculation. The baselines (no speculation, vLLM's n-gram) are stock vLLM: each runs in a child process with the
plugin not loaded (VLLM_PLUGINS excludes it, serve/server.py: stock_env). Every run uses the same prompts, greedy,
one at a time (concurrency 1) unless `concurrency` says otherwise."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from vllm_dflash.eval.report import EvalReport
from vllm_dflash.serve import tau as taus

KEPT_METRICS = ("vllm:spec_decode", "vllm:generation_tokens", "vllm:request_success")


def _run(llm_kwargs: dict, prompts: list[list[int]], max_new_tokens: int, concurrency: int) -> tuple[float, int, dict]:
    import gc

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(**llm_kwargs)
    sp = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
    llm.generate([TokensPrompt(prompt_token_ids=prompts[0][:16])], SamplingParams(max_tokens=4), use_tqdm=False)
    t0, n = time.perf_counter(), 0
    for i in range(0, len(prompts), concurrency):
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts[i: i + concurrency]], sp, use_tqdm=False)
        n += sum(len(o.outputs[0].token_ids) for o in outs)
    dt = time.perf_counter() - t0
    metrics: dict[str, Any] = {}
    for m in llm.get_metrics():
        if not m.name.startswith(KEPT_METRICS):
            continue
        if hasattr(m, "values"):
            metrics[m.name] = list(m.values)
        else:  # a counter per label set (e.g. request_success per finish reason): summed
            metrics[m.name] = metrics.get(m.name, 0.0) + float(getattr(m, "value", 0.0) or 0.0)
    del llm
    gc.collect()
    return dt, n, metrics


def _run_stock(llm_kwargs: dict, prompts: list[list[int]], max_new_tokens: int, concurrency: int,
               runner=subprocess.run) -> tuple[float, int, dict]:
    """`_run` in a child process running stock vLLM: vllm_dflash is not loaded there (stock_env), whatever this
    process registered. The child's output goes to this process's stderr (stdout stays for `eval --json`)."""
    from vllm_dflash.serve.server import stock_env

    with tempfile.TemporaryDirectory(prefix="dflash-eval-stock-") as d:
        job, out = Path(d) / "job.json", Path(d) / "out.json"
        job.write_text(json.dumps({"llm_kwargs": llm_kwargs, "prompts": prompts, "max_new_tokens": max_new_tokens,
                                   "concurrency": concurrency}))
        env = {**os.environ, **stock_env()}
        proc = runner([sys.executable, "-m", "vllm_dflash.eval.vllm_engine", str(job), str(out)], env=env,
                      stdout=sys.stderr.fileno())
        if proc.returncode != 0 or not out.exists():
            what = (llm_kwargs.get("speculative_config") or {}).get("method", "no speculation")
            raise RuntimeError(f"eval: the stock vLLM baseline ({what}) failed with exit code {proc.returncode}; "
                               "its log is above")
        dt, n, metrics = json.loads(out.read_text())
    return dt, n, metrics


def _acceptance(metrics: dict) -> tuple[float, list[float], float]:
    """vLLM's spec-decode counters of one run -> (τ, per-position acceptance, drafts); τ 0.0 when nothing was drafted."""
    sd = taus.spec_decode(metrics)
    return sd["tau"] or 0.0, sd["per_position_rate"], sd["drafts"]


def _tokens_per_forward(metrics: dict, request_steps: float) -> float | None:
    """Tokens per target forward of a DFlash run: vLLM's generated tokens / request-steps. request_steps: our
    counter (adaptive drafting counts them); 0 -> fixed block, where every request-step after the one that finishes
    the prompt verifies one block, so request-steps = drafts + finished requests."""
    if not request_steps:
        request_steps = taus.counter(metrics, taus.DRAFTS) + taus.counter(metrics, "vllm:request_success")
    return taus.tokens_per_forward(taus.counter(metrics, taus.GENERATED), request_steps)


def evaluate_vllm(*, target: str | None, draft: str | Path, prompts: str, limit: int | None = None,
                  max_new_tokens: int = 256, block_size: int | None = None, diffusion_steps: int | None = None,
                  baseline: bool = True, concurrency: int = 1, ngram_k: int = 0) -> EvalReport:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from transformers import AutoTokenizer

    import vllm_dflash
    from vllm_dflash.config import DFlashConfig
    from vllm_dflash.data.prompts import get_prompts, render
    from vllm_dflash.serve.metrics import MetricsSink, ensure_metrics_dir, merged, read_snapshots
    from vllm_dflash.target import resolve_target
    from vllm_dflash.utils import default_dtype

    vllm_dflash.register()
    tpath = resolve_target(target)
    tok = AutoTokenizer.from_pretrained(str(tpath))
    ids = [render(tok, it) for it in get_prompts(prompts, limit)]
    cfg = DFlashConfig.from_pretrained(draft)
    B = block_size or cfg.block_size
    spec = {"method": "dflash", "model": str(draft), "num_speculative_tokens": B - 1, "adaptive": False}  # the draft alone
    if cfg.hint_ngram is not None:  # a hinted draft reads the host history for its lookup: synchronous scheduling
        spec["overlap"] = False
    if diffusion_steps:
        spec["diffusion_steps"] = diffusion_steps
    common = dict(model=str(tpath), dtype=default_dtype(), enforce_eager=True, max_model_len=2048,
                  kv_cache_memory_bytes=512 << 20, max_num_seqs=max(concurrency, 1), disable_log_stats=False)
    ensure_metrics_dir()
    dt, n, m = _run({**common, "speculative_config": spec}, ids, max_new_tokens, concurrency)
    tau, per_pos, drafts = _acceptance(m)
    MetricsSink.get().flush(force=True)  # in-process engine: this process's drafter and scheduler share the sink
    ours = merged(read_snapshots())
    hists = ours["hists"]
    hist = hists["accepted_tokens_per_step"]["counts"][:B]
    draft_s = hists["draft_forward_seconds"]["sum"] + hists["kv_injection_seconds"]["sum"]
    report = EvalReport(
        engine="vllm", target=str(tpath), draft=str(draft), prompts=prompts, num_prompts=len(ids), block_size=B,
        diffusion_steps=diffusion_steps or cfg.diffusion_steps, max_new_tokens=max_new_tokens, concurrency=concurrency,
        acceptance_length=tau, tokens_per_forward=_tokens_per_forward(m, ours["counters"].get("request_steps", 0.0)),
        per_position_acceptance=per_pos, histogram=hist, num_steps=int(drafts), output_tokens=n, tokens_per_s=n / dt,
        draft_time_share=draft_s / dt)
    if baseline:
        bdt, bn, _ = _run_stock(common, ids, max_new_tokens, concurrency)
        report.baseline_tokens_per_s = bn / bdt
        report.speedup = report.tokens_per_s / report.baseline_tokens_per_s
    if ngram_k:  # the no-training baseline on the same prompts: stock vLLM's prompt lookup with ngram_k tokens
        ngram = {"method": "ngram", "num_speculative_tokens": ngram_k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
        ndt, nn, nm = _run_stock({**common, "speculative_config": ngram}, ids, max_new_tokens, concurrency)
        ntau, nper_pos, _ = _acceptance(nm)
        # every request-step yields 1 + its accepted drafts, so request-steps = generated - accepted (steps without a
        # proposal included; tokens accepted past max_tokens and dropped make it a slight overestimate)
        gen, acc = taus.counter(nm, taus.GENERATED), taus.counter(nm, taus.ACCEPTED)
        report.ngram = {"num_speculative_tokens": ngram_k, "acceptance_length": ntau,
                        "tokens_per_forward": taus.tokens_per_forward(gen, gen - acc),
                        "per_position_acceptance": nper_pos, "output_tokens": nn, "tokens_per_s": nn / ndt,
                        "speedup": nn / ndt / report.baseline_tokens_per_s if baseline else None}
    return report


if __name__ == "__main__":  # _run_stock's child: python -m vllm_dflash.eval.vllm_engine JOB.json OUT.json
    _job = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(_run(_job["llm_kwargs"], _job["prompts"], _job["max_new_tokens"],
                                                 _job["concurrency"])))
