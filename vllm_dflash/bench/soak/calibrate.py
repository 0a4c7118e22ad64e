# SPDX-License-Identifier: Apache-2.0
"""The calibration check of sampled output on live servers (issue 61): `vllm-dflash soak --calibration`, and the
calibration phase of a soak run (`--calibration-requests`).

Requests: chat, temperature 1.0 with every other sampling knob at its neutral value (top_p 1, top_k 0, min_p 0, no
penalties), `logprobs` with TOP_LOGPROBS alternatives per emitted token, token ids as token names, `ignore_eos`
(every request runs max_tokens), non-streaming, through the soak's client (client.py) at a fixed concurrency. Half
are open questions (the held-out `open-chat` set), half copy-heavy ("repeat this text / code exactly", from the
same chats and from HumanEval), so prompt-lookup and DFlash proposals meet in one step and long accepted runs are
scored. Each emitted token is scored against the logprobs the server returned with it (vllm_dflash.bench.calibration:
vLLM 0.32's raw logprobs, which at temperature 1.0 without top-k / top-p are the distribution sampled from).

`--calibration` serves each configuration in turn (one server at a time), on the soak's target and draft:
  ours   our default config, `--speculative-config '{"method": "dflash", "model": DRAFT}'`
  stock  stock vLLM without speculation, our plugin not loaded (serve/server.py: stock_env)
  fixed  our drafter with the paper's fixed block (`num_speculative_tokens` block - 1, `adaptive: false`): every
         step verifies a block, so more of the emitted tokens come through the verifier
and passes when every configuration's |z| stays below Z_LIMIT for the top-1 and top-5 sets and no emitted token
had probability 0.
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

from vllm_dflash.bench.calibration import (
    TOP_K,
    TOP_LOGPROBS,
    Z_LIMIT,
    Calibration,
    calibration_checks,
    positions_from_choice,
    tokens_for,
)
from vllm_dflash.bench.soak.plan import Req

CONFIGS = ("ours", "stock", "fixed")
COPY_TEXT = "Repeat the following text exactly, word for word, and write nothing else:\n\n{text}"
COPY_CODE = "Repeat this code exactly, and write nothing else:\n\n```python\n{text}```"
OPEN, COPY = "open-chat", "copy"
# vllm serve flags for requests at a temperature other than 1.0: logprobs after temperature (and the neutral top-k /
# top-p) are again the distribution sampled from; the sampled tokens do not change
LOGPROBS_MODE_ARGS = ["--logprobs-mode", "processed_logprobs"]
NEUTRAL = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "presence_penalty": 0.0,
           "frequency_penalty": 0.0, "repetition_penalty": 1.0}


def calibration_prompts(n: int, seed: int = 0, max_chars: int = 700) -> list[dict[str, Any]]:
    """n chat prompts, seeded: open-chat questions and copy-heavy prompts alternating (open-chat texts of at least
    120 characters and HumanEval signatures under a "repeat exactly" instruction); each text at most max_chars.
    Prompts repeat when n exceeds the sets (they are sampled anew each time)."""
    from vllm_dflash.data.prompts import HUMANEVAL_INSTRUCTION, get_prompts, humaneval_prompts

    rng = random.Random(seed)
    chats = [p for p in get_prompts("open-chat") if len(p["messages"][0]["content"]) <= max_chars]
    texts = [p["messages"][0]["content"] for p in chats if len(p["messages"][0]["content"]) >= 120]
    code = [p["messages"][0]["content"][len(HUMANEVAL_INSTRUCTION):] for p in humaneval_prompts()]
    copies = [COPY_TEXT.format(text=t) for t in texts] + [COPY_CODE.format(text=c) for c in code if len(c) <= max_chars]
    rng.shuffle(chats)
    rng.shuffle(copies)
    out = []
    for i in range(n):
        if i % 2 == 0:
            content, source = chats[(i // 2) % len(chats)]["messages"][0]["content"], OPEN
        else:
            content, source = copies[(i // 2) % len(copies)], COPY
        out.append({"id": f"cal-{i:05d}", "source": source, "messages": [{"role": "user", "content": content}]})
    return out


def calibration_requests(prompts: list[dict[str, Any]], max_tokens: int, ignore_eos: bool = True,
                         temperature: float = 1.0) -> list[Req]:
    """The chat requests (module doc). A temperature other than 1.0 needs a server whose logprobs are taken after
    temperature (LOGPROBS_MODE_ARGS): vLLM's default raw logprobs are those at temperature 1.0."""
    body = {"model": "target", "max_tokens": max_tokens, "stream": False, **NEUTRAL, "temperature": temperature,
            "logprobs": True, "top_logprobs": TOP_LOGPROBS, "return_tokens_as_token_ids": True,
            "ignore_eos": ignore_eos}
    return [Req("sampled", "chat", False, {**body, "messages": p["messages"]}, case=f"cal-{p['source']}",
                source=p["source"], keep_logprobs=True) for p in prompts]


def score(outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    """The calibration of completed outcomes (dicts with `logprobs`, `source`): overall and per prompt source."""
    by_source: dict[str, Calibration] = {}
    for o in outcomes:
        if o["status"] == "ok" and o.get("logprobs"):
            cal = by_source.setdefault(o["source"], Calibration())
            cal.add_all(positions_from_choice({"logprobs": o["logprobs"]}))
    total = Calibration()
    for cal in by_source.values():
        total.merge(cal)
    out = total.to_dict()
    out["by_source"] = {s: {k: v for k, v in c.to_dict().items() if k != "tallies"}
                        for s, c in sorted(by_source.items())}
    # where a deviation of the size seen would reach Z_LIMIT (tokens_for): how far this run's size is from it
    out["tokens_for_z_limit"] = {f"top{k}": tokens_for(out[f"z_top{k}"], out["tokens"]) for k in TOP_K}
    return out


def run_phase(srv: Any, n: int, max_tokens: int, concurrency: int, seed: int = 0, request_timeout: float = 600.0,
              ignore_eos: bool = True, desc: str = "calibration", temperature: float = 1.0) -> dict[str, Any]:
    """n calibration requests against a running Server, `concurrency` at a time; -> score(...) plus the request
    counts, time, output tok/s and the spec-decode counters over the phase (accepted drafts: how many of the scored
    tokens the verifier accepted)."""
    from vllm_dflash.bench.soak.phases import run_drive
    from vllm_dflash.serve.tau import spec_decode

    reqs = calibration_requests(calibration_prompts(n, seed), max_tokens, ignore_eos, temperature)
    before = srv.metrics()
    outs, secs = run_drive(srv.url, reqs, "soak-cal", concurrency, request_timeout, None, desc)
    time.sleep(1.0)  # the last steps' counters reach /metrics
    res = score(outs)
    sd = spec_decode(srv.metrics(), before)
    gen = sd["generated_tokens"]
    res.update(requests=len(reqs), completed=sum(o["status"] == "ok" for o in outs),
               failed=[{"tag": o["tag"], "status": o["status"], "error": o["error"][:200]}
                       for o in outs if o["status"] != "ok"][:10],
               concurrency=concurrency, max_tokens=max_tokens, ignore_eos=ignore_eos, temperature=temperature,
               seconds=round(secs, 1),
               output_tok_s=round(res["tokens"] / secs, 1) if secs > 0 else None,
               drafts=int(sd["drafts"]), accepted_tokens=int(sd["accepted"]),
               accepted_share=round(sd["accepted"] / gen, 4) if gen > 0 else None,
               tau=None if sd["tau"] is None else round(sd["tau"], 3))
    return res


def config_server(name: str, target: Path, draft: Path, dtype: str, max_model_len: int, log_path: Path,
                  env: dict[str, str] | None = None, extra_args: list[str] | None = None) -> Any:
    """The Server of one configuration (CONFIGS) on the soak's target and draft."""
    from vllm_dflash.serve.server import Server, stock_env

    env = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    extra_args = list(extra_args or [])
    if name == "stock":
        return Server(str(target), max_model_len=max_model_len, dtype=dtype, log_path=str(log_path),
                      env={**env, **stock_env()}, extra_args=extra_args)
    spec: dict[str, Any] = {"method": "dflash", "model": str(draft)}
    if name == "fixed":
        block = json.loads((draft / "config.json").read_text())["block_size"]
        spec.update(num_speculative_tokens=block - 1, adaptive=False)
    elif name != "ours":
        raise ValueError(f"calibration: unknown configuration {name!r}. Fix: use one of {', '.join(CONFIGS)}")
    return Server(str(target), speculative_config=spec, max_model_len=max_model_len, dtype=dtype,
                  log_path=str(log_path), env=env, extra_args=extra_args)


def run_calibration_check(target: Path, draft: Path, configs: list[str], dtype: str, n: int, max_tokens: int,
                          concurrency: int, log_dir: Path, max_model_len: int = 2048, seed: int = 0,
                          ignore_eos: bool = True, env: dict[str, str] | None = None, temperature: float = 1.0,
                          start_timeout: float = 600.0) -> dict[str, Any]:
    """Each configuration's server in turn (start, calibration phase, stop). -> the result (meta, configs, checks,
    passed); a configuration that fails to start or run is recorded with its error. env: extra server environment
    (a fault injected for a negative control goes here too)."""
    import os
    import platform

    from vllm_dflash.utils import cpu_kind

    t0 = time.time()
    log_dir.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"meta": {
        "mode": "calibration", "target": str(target), "draft": str(draft), "dtype": dtype, "configs": configs,
        "requests": n, "max_tokens": max_tokens, "concurrency": concurrency, "seed": seed, "ignore_eos": ignore_eos,
        "temperature": temperature, "logprobs_mode": "raw_logprobs" if temperature == 1.0 else "processed_logprobs",
        "top_logprobs": TOP_LOGPROBS, "z_limit": Z_LIMIT, "max_model_len": max_model_len, "enforce_eager": True,
        "env": env or {}, "cpu": cpu_kind(), "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "started": time.strftime("%Y-%m-%d %H:%M:%S"), "loadavg_start": os.getloadavg()[0]}, "configs": {}}
    for name in configs:
        log = log_dir / f"calibration-{dtype}-{name}-serve.log"
        srv = config_server(name, target, draft, dtype, max_model_len, log, env,
                            None if temperature == 1.0 else LOGPROBS_MODE_ARGS)
        entry: dict[str, Any] = {"log": srv.log_path}
        try:
            ts = time.perf_counter()
            srv.start(timeout=start_timeout)
            entry["server_start_s"] = round(time.perf_counter() - ts, 1)
            entry["plugin_loaded"] = "[vllm_dflash." in Path(srv.log_path).read_text(errors="replace")
            entry.update(run_phase(srv, n, max_tokens, concurrency, seed, ignore_eos=ignore_eos,
                                   desc=f"calibration: {name}", temperature=temperature))
        except Exception as e:  # noqa: BLE001 - recorded, fails this configuration's checks; the others still run
            entry["error"] = f"{type(e).__name__}: {e}"[:500]
        finally:
            srv.stop()
        res["configs"][name] = entry
    res["meta"].update(wall_s=round(time.time() - t0, 1), loadavg_end=os.getloadavg()[0])
    res["checks"] = evaluate_calibration(res)
    res["passed"] = all(c["ok"] for c in res["checks"])
    return res


def evaluate_calibration(res: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for name, c in res["configs"].items():
        out += calibration_checks(name, c)
        if name == "stock" and "plugin_loaded" in c:
            out.append({"name": "stock_without_plugin", "ok": c["plugin_loaded"] is False,
                        "detail": f"vllm_dflash in the stock server's log: {c['plugin_loaded']}"})
    return out


def render_calibration(results: list[dict[str, Any]]) -> str:
    """A markdown table, one row per configuration of each `--calibration` result (docs/RELIABILITY.md)."""
    lines = ["| run | configuration | tokens (requests x max_tokens, c) | z top-1 | z top-5 | open-chat / copy: "
             "z top-1 | blind to ties: z top-1 / top-5 | accepted drafts / tokens | tok/s | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        m = res["meta"]
        run = f"{m['dtype']}, {m['cpu']} ({m['started'][:16]})"
        for name, c in res["configs"].items():
            if "error" in c:
                lines.append(f"| {run} | {name} | – | – | – | – | – | – | – | **FAIL**: {c['error'][:120]} |")
                continue
            ok = all(ch["ok"] for ch in calibration_checks(name, c))
            src = " / ".join(_z(c["by_source"].get(s, {}).get("z_top1")) for s in (OPEN, COPY))
            blind = " / ".join(_z(c.get(f"z_top{k}_tie_blind")) for k in TOP_K)
            share = "–" if c.get("accepted_share") is None else f"{100 * c['accepted_share']:.1f} %"
            lines.append(f"| {run} | {name} | {c['tokens']:,} ({c['requests']} x {c['max_tokens']}, c"
                         f"{c['concurrency']}) | {_z(c['z_top1'])} | {_z(c['z_top5'])} | {src} | {blind} | {share} | "
                         f"{c['output_tok_s']} | {'ok' if ok else '**FAIL**'} |")
    return "\n".join(lines)


def _z(z: float | None) -> str:
    return "n/a" if z is None else f"{z:+.2f}"
