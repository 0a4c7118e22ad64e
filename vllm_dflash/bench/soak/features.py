# SPDX-License-Identifier: Apache-2.0
"""The served feature check (issue 51): the request features users send, against stock vLLM and our DFlash drafter.

Two `vllm serve` processes of the same target, same dtype and max_model_len: stock vLLM (our plugin not loaded:
VLLM_PLUGINS names every installed vLLM plugin but vllm_dflash, `stock_plugins_env`) without speculation, and the
default DFlash config (`--speculative-config '{"method": "dflash", "model": DRAFT}'`). Each case goes to both:

  greedy, compared token for token (a divergence passes only as a numerical near-tie of the target, shown with the
    stock server's top-2 logprob margin at the first differing token; float32 allows none):
    plain, logprobs + top_logprobs (chat; chosen-token logprobs also compared within LOGPROB_TOL), presence and
    frequency penalties, repetition_penalty, stop strings (taken from the stock plain output, so they fire),
    a json_schema response format (chat), a regex (structured_outputs), max_tokens=1, min_tokens,
    prompt_logprobs, a prompt near max_model_len (prompt + max_tokens == max_model_len)
  sampled n=2: valid (2 choices, finish reasons, token counts)
  over-long prompt (max_model_len + 8 tokens): the same HTTP status as stock (400)
and afterwards our server must still answer /health and serve the plain case again, identically.

`python -m vllm_dflash.bench.soak --features-check` (run.py) or `vllm-dflash soak --features-check`; the e2e test
is tests/e2e/test_soak_features.py (tiny pair). Verdicts are pure functions of the two servers' replies
(`compare_case`), unit-tested in tests/unit/test_soak_features.py.
"""
from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

PLUGIN_NAME = "vllm_dflash"  # our entry point's name in the vllm.general_plugins group (pyproject)
LOGPROB_TOL = {"float32": 1e-3, "bfloat16": 0.25, "float16": 0.1}
CODE_PROMPT = "def parse_args(argv):\n    "
CHAT_PROMPT = "Write a Python function that returns the squares of a list of numbers."
JSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
               "required": ["name", "age"]}


def stock_plugins_env() -> str:
    """VLLM_PLUGINS for stock vLLM: every installed vLLM plugin (any `vllm.*` entry-point group) except ours.
    vLLM splits the value on commas and loads only the names listed; "" (no other plugin) loads none."""
    from importlib.metadata import distributions

    names = {ep.name for d in distributions() for ep in d.entry_points
             if ep.group.startswith("vllm.") and ep.name != PLUGIN_NAME}
    return ",".join(sorted(names))


def _completion(prompt: Any, max_tokens: int, **params: Any) -> dict[str, Any]:
    return {"model": "target", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "return_token_ids": True, **params}


def _chat(content: str, max_tokens: int, **params: Any) -> dict[str, Any]:
    return {"model": "target", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0.0, "return_token_ids": True, **params}


def feature_cases(near_limit_ids: list[int], too_long_ids: list[int], max_tokens: int = 16) -> list[dict[str, Any]]:
    """The cases: name, endpoint (completions | chat), body, check (greedy | sampled | status). The stop case's
    strings are filled in from the stock plain output (`stop_from`)."""
    g = "greedy"
    cases = [
        ("plain", "completions", _completion(CODE_PROMPT, max_tokens), g),
        ("logprobs", "chat", _chat(CHAT_PROMPT, max_tokens, logprobs=True, top_logprobs=3), g),
        ("logprobs_completions", "completions", _completion(CODE_PROMPT, max_tokens, logprobs=3), g),
        ("penalties", "completions", _completion(CODE_PROMPT, max_tokens, presence_penalty=0.8,
                                                 frequency_penalty=0.6), g),
        ("repetition_penalty", "chat", _chat(CHAT_PROMPT, max_tokens, repetition_penalty=1.3), g),
        ("stop", "completions", _completion(CODE_PROMPT, max_tokens, stop=[]), g),
        ("json_schema", "chat", _chat("Describe a person as JSON with a name and an age.", 2 * max_tokens,
                                      response_format={"type": "json_schema",
                                                       "json_schema": {"name": "person", "schema": JSON_SCHEMA}}), g),
        ("regex", "completions", _completion("x = ", max_tokens, structured_outputs={"regex": "[0-9]{2,4}-[a-z]+"}), g),
        ("max_tokens_1", "chat", _chat(CHAT_PROMPT, 1), g),
        ("min_tokens", "completions", _completion(CODE_PROMPT, max_tokens, min_tokens=max_tokens - 4,
                                                  stop=["\n"]), g),
        ("prompt_logprobs", "completions", _completion(CODE_PROMPT, 4, prompt_logprobs=2), g),
        ("near_max_model_len", "completions", _completion(near_limit_ids, 8), g),
        ("n2_sampled", "completions", {"model": "target", "prompt": CODE_PROMPT, "max_tokens": max_tokens,
                                       "temperature": 0.8, "top_p": 0.95, "n": 2, "seed": 7}, "sampled"),
        ("too_long_prompt", "completions", _completion(too_long_ids, 4), "status"),
    ]
    return [{"name": n, "endpoint": e, "body": b, "check": c} for n, e, b, c in cases]


def stop_from(text: str) -> list[str]:
    """Stop strings that occur in `text` (the stock plain output): 3 characters from its middle, so the stop case
    ends there; a default when the output is too short."""
    if len(text) < 6:
        return ["\n\n"]
    mid = len(text) // 2
    return [text[mid:mid + 3]]


def post(url: str, endpoint: str, body: dict[str, Any], timeout: float = 300.0) -> dict[str, Any]:
    """One request -> {status, choices: [{text, token_ids, finish_reason, logprobs}], prompt_token_ids, usage,
    error}. Never raises for an HTTP or connection error (status 0: no response)."""
    path = "/v1/completions" if endpoint == "completions" else "/v1/chat/completions"
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            js = json.loads(r.read())
            status = r.status
    except urllib.error.HTTPError as e:
        return {"status": e.code, "error": e.read().decode(errors="replace")[:300], "choices": []}
    except OSError as e:
        return {"status": 0, "error": f"{type(e).__name__}: {e}"[:300], "choices": []}
    choices = []
    for ch in js.get("choices", []):
        text = ch.get("text") if endpoint == "completions" else (ch.get("message") or {}).get("content")
        lp = ch.get("logprobs")
        if lp and "content" in lp:  # chat: [{token, logprob, top_logprobs}]
            lp = [x["logprob"] for x in lp["content"] or []]
        elif lp:  # completions: {token_logprobs, ...}
            lp = lp.get("token_logprobs")
        choices.append({"index": ch.get("index"), "text": text or "", "token_ids": ch.get("token_ids"),
                        "finish_reason": ch.get("finish_reason"), "logprobs": lp,
                        "prompt_logprobs": len(ch.get("prompt_logprobs") or []) or None})
    return {"status": status, "choices": choices, "usage": js.get("usage") or {},
            "prompt_token_ids": js.get("prompt_token_ids") or (js.get("choices") or [{}])[0].get("prompt_token_ids")}


def sampled_problems(body: dict[str, Any], reply: dict[str, Any]) -> list[str]:
    """What is wrong with an n>1 sampled reply: choice count and indices, finish reasons, token counts."""
    n, mx = body.get("n", 1), body["max_tokens"]
    probs = []
    if reply["status"] != 200:
        return [f"HTTP {reply['status']}: {reply.get('error', '')[:120]}"]
    if sorted(c["index"] for c in reply["choices"]) != list(range(n)):
        probs.append(f"choice indices {[c['index'] for c in reply['choices']]}, want 0..{n - 1}")
    probs += [f"choice {c['index']}: finish_reason {c['finish_reason']!r}" for c in reply["choices"]
              if c["finish_reason"] not in ("stop", "length")]
    used = reply.get("usage", {}).get("completion_tokens")
    if used is None or used > n * mx or used < 1:
        probs.append(f"usage.completion_tokens {used} for n={n}, max_tokens={mx}")
    return probs


def compare_case(case: dict[str, Any], stock: dict[str, Any], ours: dict[str, Any], dtype: str,
                 margin: float | None = None) -> dict[str, Any]:
    """The verdict of one case from both replies. margin: the stock server's top-2 logprob margin at the first
    differing token of a greedy divergence (None: not judged), from `judge`."""
    from vllm_dflash.exactness import first_difference, is_near_tie

    out: dict[str, Any] = {"name": case["name"], "check": case["check"], "stock_status": stock["status"],
                           "ours_status": ours["status"]}
    if case["check"] == "status":
        out.update(ok=stock["status"] == ours["status"] and 400 <= ours["status"] < 500,
                   detail=f"stock {stock['status']}, ours {ours['status']}")
        return out
    if case["check"] == "sampled":
        probs = sampled_problems(case["body"], ours)
        out.update(ok=not probs, detail="; ".join(probs) or f"{len(ours['choices'])} valid choices")
        return out
    if stock["status"] != 200 or ours["status"] != 200:
        out.update(ok=False, detail=f"stock {stock['status']}, ours {ours['status']}: "
                   f"{(ours.get('error') or stock.get('error') or '')[:200]}")
        return out
    a, b = stock["choices"][0], ours["choices"][0]
    ia, ib = a["token_ids"] or [], b["token_ids"] or []
    i = first_difference(ia, ib) if ia and ib else (None if a["text"] == b["text"] else 0)
    same = i is None and a["text"] == b["text"] and a["finish_reason"] == b["finish_reason"]
    out.update(tokens=len(ib), finish_reason=b["finish_reason"])
    if not same:
        near = is_near_tie(margin, dtype)
        out.update(ok=near, first_difference=i, margin=margin, near_tie=near,
                   detail=f"differs at token {i} (stock {a['text'][:60]!r} / ours {b['text'][:60]!r}); top-2 "
                          f"margin {margin if margin is None else round(margin, 4)} nats"
                          + (": a near-tie" if near else ": a REAL difference"))
        return out
    detail = f"identical, {len(ib)} tokens, finish {b['finish_reason']}"
    if a["logprobs"] or b["logprobs"]:
        la, lb = a["logprobs"] or [], b["logprobs"] or []
        diff = max((abs(x - y) for x, y in zip(la, lb)), default=None)
        ok_lp = len(la) == len(lb) == len(ib) and diff is not None and diff <= LOGPROB_TOL.get(dtype, 0.25)
        out.update(logprob_max_abs_diff=diff)
        detail += f"; chosen-token logprobs max |diff| {diff if diff is None else f'{diff:.2e}'}"
        if not ok_lp:
            out.update(ok=False, detail=detail + f" (tolerance {LOGPROB_TOL.get(dtype, 0.25)}, counts {len(la)} / "
                                                 f"{len(lb)} / {len(ib)} tokens)")
            return out
    if case["body"].get("prompt_logprobs"):
        ok_p = a["prompt_logprobs"] == b["prompt_logprobs"] and b["prompt_logprobs"]
        detail += f"; prompt_logprobs for {b['prompt_logprobs']} prompt positions"
        if not ok_p:
            out.update(ok=False, detail=detail + f" (stock {a['prompt_logprobs']})")
            return out
    if case["body"].get("min_tokens") and b["finish_reason"] == "stop" and len(ib) < case["body"]["min_tokens"]:
        out.update(ok=False, detail=detail + f"; stopped before min_tokens {case['body']['min_tokens']}")
        return out
    out.update(ok=True, detail=detail)
    return out


def judge(stock_url: str, case: dict[str, Any], stock: dict[str, Any], ours: dict[str, Any]) -> float | None:
    """The stock server's top-2 logprob margin at the first token where the two greedy outputs differ (None when
    they do not differ, or a token is not among the top few). The margin is the unpenalised, unconstrained one."""
    from vllm_dflash.exactness import first_difference, top_tokens

    if stock["status"] != 200 or ours["status"] != 200:
        return None
    ia, ib = stock["choices"][0]["token_ids"] or [], ours["choices"][0]["token_ids"] or []
    prompt = stock.get("prompt_token_ids")
    i = first_difference(ia, ib)
    if i is None or not prompt or i >= min(len(ia), len(ib)):
        return None
    try:
        best = top_tokens(stock_url, list(prompt) + ia[:i])
    except (OSError, KeyError, IndexError, ValueError):
        return None
    lp = dict(best)
    if ia[i] not in lp or ib[i] not in lp:
        return None
    return best[0][1] - min(lp[ia[i]], lp[ib[i]])


def run_cases(url: str, cases: list[dict[str, Any]], stop: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Every case against one server, in order; `stop` fills the stop case (None: from this server's plain
    output)."""
    replies: dict[str, dict[str, Any]] = {}
    for c in cases:
        if c["name"] == "stop":
            c["body"]["stop"] = stop if stop is not None else stop_from(replies["plain"]["choices"][0]["text"]
                                                                       if replies["plain"]["choices"] else "")
        replies[c["name"]] = post(url, c["endpoint"], c["body"])
    return replies


def _health(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def _prompt_ids(tokenizer_dir: Path, max_model_len: int) -> tuple[list[int], list[int]]:
    """Token ids of real text (HumanEval): max_model_len - 8 of them (near the limit with max_tokens 8) and
    max_model_len + 8 (too long)."""
    from tokenizers import Tokenizer

    from vllm_dflash.bench.soak.plan import too_long_text

    ids = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).encode(
        too_long_text(8 * max_model_len), add_special_tokens=False).ids
    if len(ids) < max_model_len + 8:
        raise ValueError(f"features check: only {len(ids)} tokens of text for max_model_len {max_model_len}")
    return ids[:max_model_len - 8], ids[:max_model_len + 8]


def run_features_check(target: Path, draft: Path, dtype: str = "float32", max_model_len: int = 2048,
                       log_dir: Path = Path("bench-results"), start_timeout: float = 600.0,
                       extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Start stock vLLM and our DFlash server side by side, run every case against both, compare. -> the result
    (cases, checks, passed)."""
    from vllm_dflash.serve.server import Server
    from vllm_dflash.utils import cpu_kind

    t0 = time.time()
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {"OMP_NUM_THREADS": "1", **(extra_env or {})}
    stock_env = stock_plugins_env()
    common = dict(max_model_len=max_model_len, dtype=dtype)
    stock = Server(str(target), log_path=str(log_dir / "features-stock-serve.log"),
                   env={**env, "VLLM_PLUGINS": stock_env}, **common)
    ours = Server(str(target), speculative_config={"method": "dflash", "model": str(draft)},
                  log_path=str(log_dir / "features-dflash-serve.log"), env=env, **common)
    res: dict[str, Any] = {"meta": {"mode": "features", "target": str(target), "draft": str(draft), "dtype": dtype,
                                    "max_model_len": max_model_len, "cpu": cpu_kind(), "stock_vllm_plugins": stock_env,
                                    "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                                    "logs": [stock.log_path, ours.log_path]}}
    errors: dict[str, BaseException] = {}

    def _start(name: str, srv: Server) -> None:
        try:
            srv.start(timeout=start_timeout)
        except BaseException as e:  # noqa: BLE001 - reported below with the server's log
            errors[name] = e

    near_ids, long_ids = _prompt_ids(target, max_model_len)
    threads = [threading.Thread(target=_start, args=(n, s)) for n, s in (("stock", stock), ("dflash", ours))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise RuntimeError("; ".join(f"{n}: {type(e).__name__}: {e}" for n, e in errors.items()))
        res["meta"]["plugin_loaded"] = {n: "[vllm_dflash." in Path(s.log_path).read_text(errors="replace")
                                        for n, s in (("stock", stock), ("dflash", ours))}
        cases = feature_cases(near_ids, long_ids)
        stock_replies = run_cases(stock.url, cases)
        ours_replies = run_cases(ours.url, cases, stop=next(c["body"]["stop"] for c in cases if c["name"] == "stop"))
        verdicts = []
        for c in cases:
            s, o = stock_replies[c["name"]], ours_replies[c["name"]]
            margin = judge(stock.url, c, s, o) if c["check"] == "greedy" else None
            verdicts.append({**compare_case(c, s, o, dtype, margin), "stock": _brief(s), "ours": _brief(o),
                             "body": _short_body(c["body"])})
        res["cases"] = verdicts
        health = _health(ours.url)
        again = post(ours.url, "completions", cases[0]["body"])
        res["after"] = {"health": health, "plain_again": _brief(again),
                        "plain_again_identical": again["status"] == 200 and again["choices"][0]["token_ids"]
                        == ours_replies["plain"]["choices"][0]["token_ids"],
                        "engine_alive": ours.proc.poll() is None}
    except Exception as e:  # noqa: BLE001 - recorded as a failed check; the JSON is still written
        import traceback

        res["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-2000:]}"
    finally:
        # what a server logs after its SIGTERM is vLLM's own shutdown (it may log EngineDeadError): not counted
        serving = {}
        for n, srv in (("stock", stock), ("dflash", ours)):
            serving[n] = Path(srv.log_path).stat().st_size if Path(srv.log_path).exists() else 0
            srv.stop()
    res["server_log_errors"] = {}
    for n, srv in (("stock", stock), ("dflash", ours)):
        text = Path(srv.log_path).read_bytes()[:serving[n]].decode(errors="replace") if serving[n] else ""
        res["server_log_errors"][n] = [ln[:300] for ln in text.splitlines() if "Traceback (most recent" in ln
                                       or (" ERROR " in ln and "code=4" not in ln)][:20]
    res["meta"]["wall_s"] = round(time.time() - t0, 1)
    res["checks"] = evaluate_features(res)
    res["passed"] = all(c["ok"] for c in res["checks"])
    return res


def _short_body(body: dict[str, Any]) -> dict[str, Any]:
    p = body.get("prompt")
    return {**body, "prompt": (f"<{len(p)} token ids>" if isinstance(p, list) else p[:80])} if p is not None else body


def _brief(r: dict[str, Any]) -> dict[str, Any]:
    ch = r["choices"][0] if r.get("choices") else {}
    return {"status": r["status"], "text": (ch.get("text") or "")[:200], "tokens": len(ch.get("token_ids") or []),
            "finish_reason": ch.get("finish_reason"), "choices": len(r.get("choices", [])),
            "error": r.get("error", "")[:200]}


def evaluate_features(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The feature check's pass/fail checks: it ran, the stock server really ran without our plugin and ours with
    it, every case passed, the server is healthy afterwards, and no unexpected ERROR in either log."""
    def check(name: str, ok: bool, detail: str) -> dict[str, Any]:
        return {"name": name, "ok": bool(ok), "detail": detail}

    cases = res.get("cases", [])
    loaded = res.get("meta", {}).get("plugin_loaded", {})
    after = res.get("after", {})
    errs = res.get("server_log_errors", {})
    out = [check("run_completed", "error" not in res, res.get("error", "no exception")[:300]),
           check("stock_without_plugin", loaded.get("stock") is False and loaded.get("dflash") is True,
                 f"vllm_dflash in the server logs: {loaded}")]
    out += [check(f"case:{c['name']}", c["ok"], c["detail"]) for c in cases]
    out.append(check("cases_ran", len(cases) >= 14, f"{len(cases)} cases"))
    out.append(check("healthy_afterwards", after.get("health") == 200 and after.get("plain_again_identical")
                     and after.get("engine_alive"),
                     f"/health {after.get('health')}, plain case again identical: "
                     f"{after.get('plain_again_identical')}, server process alive: {after.get('engine_alive')}"))
    bad = [ln for lines in errs.values() for ln in lines]
    out.append(check("server_logs_clean", not bad, f"{len(bad)} ERROR / Traceback lines while serving, besides 4xx "
                     "replies"
                     + (f": {bad[:2]}" if bad else "")))
    return out


def render_features(res: dict[str, Any]) -> str:
    """A markdown table of one feature check's cases (docs/RELIABILITY.md)."""
    m = res["meta"]
    lines = [f"Target `{Path(m['target']).name}`, draft `{Path(m['draft']).name}`, {m['dtype']}, max_model_len "
             f"{m['max_model_len']}, {m['cpu']}; {m['started']}, {m.get('wall_s')} s; "
             f"{'PASSED' if res['passed'] else 'FAILED'}.", "", "| case | stock | DFlash | verdict |",
             "|---|---|---|---|"]
    for c in res.get("cases", []):
        lines.append(f"| {c['name']} | {c['stock_status']} | {c['ours_status']} | "
                     f"{'ok' if c['ok'] else '**FAIL**'}: {c['detail'].replace('|', '/')} |")
    lines += ["", "| check | result | detail |", "|---|---|---|"]
    lines += [f"| {c['name']} | {'ok' if c['ok'] else '**FAIL**'} | {c['detail'].replace('|', '/')} |"
              for c in res["checks"] if not c["name"].startswith("case:")]
    return "\n".join(lines)
