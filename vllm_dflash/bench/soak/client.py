# SPDX-License-Identifier: Apache-2.0
"""The soak test's clients: up to N concurrent asyncio workers sending `Req`s over httpx (loopback only), and a
sampler of the server process tree's memory.

Every request gets exactly one `Outcome`: ok (200, full response), http_4xx / http_5xx, stream_error (an error
event inside a 200 stream), disconnected / timed_out (what the client meant to do), cut (still in flight at the
round's hard deadline: the client closed the connection), or error (anything else: connection reset, unexpected
client timeout). Each request carries `X-Request-Id: <tag>`, which vLLM uses as
its request id, so the server log (`--enable-log-requests`) can be matched against the client's outcomes.

A request whose connection fails before any byte of a response (reset, refused, closed: httpx's transport errors
other than timeouts) is sent once more, on a new connection, as `<tag>-retry1`, as HTTP clients do for a request
the server never answered (the OpenAI client retries connection errors twice). The outcome is the retry's and keeps
the first attempt's error, connection and transport trace (`retried`); the report lists every retry, and a first
attempt the engine did receive (its tag in the server log) fails the soak's accounting as an unaccounted request.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx

from vllm_dflash.bench.soak.plan import RETRY_SUFFIX, Req


@dataclass
class Outcome:
    tag: str
    kind: str
    case: str
    endpoint: str
    stream: bool
    status: str  # ok | http_4xx | http_5xx | stream_error | disconnected | timed_out | cut | error
    http_code: int | None = None
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int | None = None
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    n: int = 1  # choices asked for; `text` is choice 0's, `other_texts` the rest (index order)
    choices: int = 0  # distinct choice indices in the response
    other_texts: list[str] = field(default_factory=list)
    min_tokens: int | None = None
    chunks: int = 0
    latency_s: float = 0.0
    error: str = ""
    # the HTTP connection: "new" (opened for this request) or "reused" (a pooled keep-alive one), and its last
    # transport events (httpcore trace names, ms since send) for an `error` outcome
    connection: str = ""
    trace: list[str] = field(default_factory=list)
    retried: dict[str, Any] | None = None  # the first attempt (tag, error, connection, trace) when this is a retry
    source: str = ""  # the request's prompt source (plan.Req.source)
    logprobs: Any = None  # choice 0's `logprobs` when the request keeps them (plan.Req.keep_logprobs)


class _Trace:
    """httpcore trace hook: whether the request opened its own connection, and the last few events."""

    def __init__(self) -> None:
        self.t0, self.opened, self.events = time.perf_counter(), False, []

    async def __call__(self, name: str, info: dict[str, Any]) -> None:
        if name.startswith("connection.connect_tcp"):
            self.opened = True
        if name.endswith((".started", ".failed")) or name.startswith("connection."):
            self.events = (self.events + [f"{name}@{1e3 * (time.perf_counter() - self.t0):.0f}ms"])[-8:]


def _describe(e: BaseException) -> str:
    """An exception with its cause chain: httpx's ReadError carries no message, the OSError under it does."""
    parts, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        parts.append(f"{type(e).__name__}: {e}".rstrip(": "))
        e = e.__cause__ or e.__context__
    return " <- ".join(parts)


def _content(choice: dict[str, Any], endpoint: str, stream: bool) -> str:
    if endpoint == "completions":
        return choice.get("text") or ""
    part = choice.get("delta" if stream else "message") or {}
    return part.get("content") or ""


async def _stream(client: httpx.AsyncClient, req: Req, headers: dict[str, str], out: Outcome, timeout: float,
                  trace: _Trace) -> None:
    async with client.stream("POST", req.path, json=req.body, headers=headers, timeout=timeout,
                             extensions={"trace": trace}) as r:
        out.http_code = r.status_code
        if r.status_code != 200:
            await r.aread()
            out.status = "http_4xx" if 400 <= r.status_code < 500 else "http_5xx"
            out.error = r.text[:300]
            return
        parts: dict[int, list[str]] = {}
        finished = False
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:].strip()
            if data == "[DONE]":
                finished = True
                break
            ev = json.loads(data)
            if "error" in ev:
                out.status, out.error = "stream_error", json.dumps(ev["error"])[:300]
                return
            out.chunks += 1
            for ch in ev.get("choices") or []:
                parts.setdefault(ch.get("index", 0), []).append(_content(ch, req.endpoint, True))
                if ch.get("index", 0) == 0 or ch.get("finish_reason"):
                    out.finish_reason = ch.get("finish_reason") or out.finish_reason
            if ev.get("usage"):
                out.completion_tokens = ev["usage"].get("completion_tokens")
            if req.kind == "disconnect" and out.chunks >= req.disconnect_after:
                out.status, out.text = "disconnected", "".join(parts.get(0, []))
                return  # leaving the context closes the connection mid-stream
        texts = ["".join(parts[i]) for i in sorted(parts)]
        out.text, out.other_texts, out.choices = (texts[0] if texts else ""), texts[1:], len(parts)
        out.status, out.error = ("ok", "") if finished else ("error", "stream ended without [DONE]")


async def send(client: httpx.AsyncClient, req: Req, tag: str, request_timeout: float) -> Outcome:
    """Send one request and classify what came back; once more if its connection failed before any response."""
    out = await _send_once(client, req, tag, request_timeout)
    if out.status == "error" and out.http_code is None and out.chunks == 0 and out.error.startswith(_NO_RESPONSE):
        first = {"tag": tag, "error": out.error, "connection": out.connection, "trace": out.trace,
                 "latency_s": round(out.latency_s, 3)}
        async with httpx.AsyncClient(base_url=client.base_url, trust_env=False) as fresh:  # a new connection
            out = await _send_once(fresh, req, tag + RETRY_SUFFIX, request_timeout)
        out.retried = first
    return out


# httpx's transport errors that leave no response (timeouts are classified on their own)
_NO_RESPONSE = ("ConnectError", "ReadError", "WriteError", "RemoteProtocolError", "CloseError")


async def _send_once(client: httpx.AsyncClient, req: Req, tag: str, request_timeout: float) -> Outcome:
    body = req.body or {}
    out = Outcome(tag=tag, kind=req.kind, case=req.case, endpoint=req.endpoint, stream=req.stream, status="error",
                  max_tokens=body.get("max_tokens"), stop=list(req.stop), n=body.get("n") or 1,
                  min_tokens=body.get("min_tokens"), source=req.source)
    headers = {"X-Request-Id": tag}
    timeout = req.client_timeout or request_timeout
    t0, trace = time.perf_counter(), _Trace()
    try:
        if req.stream:
            await _stream(client, req, headers, out, timeout, trace)
        else:
            if req.raw is not None:
                r = await client.post(req.path, content=req.raw, timeout=timeout, extensions={"trace": trace},
                                      headers={**headers, "Content-Type": "application/json"})
            else:
                r = await client.post(req.path, json=req.body, headers=headers, timeout=timeout,
                                      extensions={"trace": trace})
            out.http_code = r.status_code
            if r.status_code == 200:
                js = r.json()
                chs = sorted(js["choices"], key=lambda c: c.get("index", 0))
                ch = chs[0]
                out.text, out.finish_reason = _content(ch, req.endpoint, False), ch.get("finish_reason")
                out.other_texts = [_content(c, req.endpoint, False) for c in chs[1:]]
                out.choices = len({c.get("index", 0) for c in chs})
                out.completion_tokens = (js.get("usage") or {}).get("completion_tokens")
                if req.keep_logprobs:
                    out.logprobs = ch.get("logprobs")
                out.status = "ok"
            else:
                out.status = "http_4xx" if 400 <= r.status_code < 500 else "http_5xx"
                out.error = r.text[:300]
    except httpx.TimeoutException as e:
        out.status = "timed_out" if req.kind == "timeout" else "error"
        out.error = f"client timeout after {timeout:.1f}s ({type(e).__name__})"
    except (httpx.HTTPError, json.JSONDecodeError, KeyError, IndexError) as e:
        out.status, out.error = "error", _describe(e)[:300]
    out.latency_s = time.perf_counter() - t0
    out.connection = "new" if trace.opened else "reused"
    if out.status == "error":
        out.trace = trace.events
    return out


async def drive(url: str, reqs: list[Req], tag_prefix: str, concurrency: int, request_timeout: float,
                deadline: float | None = None, hard_deadline: float | None = None,
                on_done: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Send `reqs` with `concurrency` workers; take no new request after `deadline` and cancel what is still in
    flight at `hard_deadline` (time.time() values; outcome `cut`). Returns the outcomes in request order; requests
    never taken are left out (they are always a tail of `reqs`)."""
    results: dict[int, Outcome] = {}
    inflight: dict[int, float] = {}
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(reqs)):
        queue.put_nowait(i)
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, limits=limits, trust_env=False) as client:
        async def worker() -> None:
            while deadline is None or time.time() < deadline:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                inflight[i] = time.perf_counter()
                results[i] = await send(client, reqs[i], f"{tag_prefix}-{i:05d}", request_timeout)
                del inflight[i]
                if on_done is not None:
                    on_done(results[i])

        workers = [asyncio.create_task(worker()) for _ in range(max(1, concurrency))]
        _, pending = await asyncio.wait(workers, timeout=None if hard_deadline is None
                                        else max(0.0, hard_deadline - time.time()))
        for t in pending:
            t.cancel()  # closes the requests' connections: the server must abort them
        await asyncio.gather(*pending, return_exceptions=True)
        for i, t0 in inflight.items():
            r = reqs[i]
            results[i] = Outcome(tag=f"{tag_prefix}-{i:05d}", kind=r.kind, case=r.case, endpoint=r.endpoint,
                                 stream=r.stream, status="cut", max_tokens=(r.body or {}).get("max_tokens"),
                                 stop=list(r.stop), latency_s=time.perf_counter() - t0, error="round deadline")
            if on_done is not None:
                on_done(results[i])
    return [results[i] for i in sorted(results)]


def tree_rss(pid: int) -> int:
    """Resident set size (bytes) of a process and all its descendants (psutil; /proc fallback)."""
    try:
        import psutil
    except ImportError:
        return _proc_tree_rss(pid)
    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def rss_by_process(pid: int) -> dict[str, int]:
    """RSS (bytes) per process of the server tree, labelled by role: vLLM's API server (the root), its engine core
    (a child), the worker (a grandchild), multiprocessing helpers (resource_tracker); psutil only."""
    import psutil

    out: dict[str, int] = {}
    try:
        root = psutil.Process(pid)
        procs = [(root, 0)] + [(c, 1 + (c.ppid() != pid)) for c in root.children(recursive=True)]
    except psutil.Error:
        return out
    for p, depth in procs:
        try:
            cmd = " ".join(p.cmdline())
            role = ("resource_tracker" if "resource_tracker" in cmd else
                    ("api_server", "engine_core", "worker")[min(depth, 2)])
            out[f"{role}:{p.pid}"] = p.memory_info().rss
        except psutil.Error:
            pass
    return out


def _proc_tree_rss(pid: int) -> int:
    import os

    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            for line in open(f"/proc/{p}/status"):
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


class RssSampler:
    """Samples tree_rss(pid) every `interval` s in a thread; keeps the peak and named checkpoints."""

    def __init__(self, pid: int, interval: float = 0.5):
        self.pid, self.interval = pid, interval
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> int:
        v = tree_rss(self.pid)
        self.peak = max(self.peak, v)
        self.samples += 1
        return v

    def start(self) -> "RssSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
