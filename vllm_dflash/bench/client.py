# SPDX-License-Identifier: Apache-2.0
"""Concurrent streaming OpenAI chat clients (asyncio) against one `vllm serve`.

`concurrency` requests are in flight at any time (a semaphore over the prompt list), each streamed
so the time to the first token is observed; token counts come from the server's usage record. `chunks` counts the
streamed chunks that carried text: vLLM streams one chunk per engine step of a request (stream_interval 1), so
completion tokens / chunks estimates tokens per target forward for any configuration, vLLM's n-gram included (an
upper estimate: a step whose tokens decode to no text yet is merged into the next chunk)."""
from __future__ import annotations

import asyncio
import time
from typing import Any


async def _one(client: Any, item: dict[str, Any], max_tokens: int, ignore_eos: bool,
               sem: asyncio.Semaphore, temperature: float = 0.0) -> dict[str, Any]:
    async with sem:
        # the server's own token ids (prompt in the first chunk, each chunk's new tokens): greedy outputs are compared
        # and judged on them, not on a re-encoding of the text (which need not give the tokens the model produced)
        extra = {"return_token_ids": True, **({"ignore_eos": True} if ignore_eos else {})}
        t0 = time.perf_counter()
        t_first: float | None = None
        parts: list[str] = []
        token_ids: list[int] = []
        prompt_ids: list[int] | None = None
        usage = None
        finish = None
        chunks = 0
        stream = await client.chat.completions.create(
            model="target", messages=item["messages"], max_tokens=max_tokens, temperature=temperature, stream=True,
            stream_options={"include_usage": True}, extra_body=extra)
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            if prompt_ids is None and getattr(chunk, "prompt_token_ids", None):
                prompt_ids = list(chunk.prompt_token_ids)
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            token_ids += getattr(choice, "token_ids", None) or []
            text = choice.delta.content if choice.delta else None
            if text:
                if t_first is None:
                    t_first = time.perf_counter()
                parts.append(text)
                chunks += 1
            finish = choice.finish_reason or finish
        t1 = time.perf_counter()
        if usage is None:
            raise RuntimeError(f"bench: no usage record in the stream for prompt {item['id']!r}")
        return {"id": item["id"], "text": "".join(parts), "token_ids": token_ids, "prompt_token_ids": prompt_ids,
                "completion_tokens": int(usage.completion_tokens),
                "prompt_tokens": int(usage.prompt_tokens), "chunks": chunks, "finish_reason": finish, "t_start": t0, "t_end": t1,
                "ttft_s": (t_first - t0) if t_first is not None else None, "latency_s": t1 - t0}


async def _run(base_url: str, items: list[dict[str, Any]], concurrency: int, max_tokens: int,
               ignore_eos: bool, temperature: float = 0.0) -> list[dict[str, Any]]:
    import httpx
    from openai import AsyncOpenAI

    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with AsyncOpenAI(base_url=base_url + "/v1", api_key="none", timeout=3600.0, max_retries=0,
                           http_client=httpx.AsyncClient(limits=limits, timeout=3600.0)) as client:
        sem = asyncio.Semaphore(concurrency)
        return list(await asyncio.gather(*(_one(client, it, max_tokens, ignore_eos, sem, temperature) for it in items)))


def run_load(base_url: str, items: list[dict[str, Any]], concurrency: int, max_tokens: int,
             ignore_eos: bool = False, temperature: float = 0.0) -> list[dict[str, Any]]:
    """Send every item (a dict with `id` and chat `messages`), `concurrency` at a time, at `temperature` (0: greedy;
    vLLM's defaults for everything else); per request:
    id, text, the server's output and prompt token ids, completion/prompt tokens, finish reason, start/end times,
    TTFT and latency (seconds)."""
    if concurrency < 1:
        raise ValueError(f"bench: concurrency {concurrency} < 1")
    return asyncio.run(_run(base_url, items, concurrency, max_tokens, ignore_eos, temperature))
