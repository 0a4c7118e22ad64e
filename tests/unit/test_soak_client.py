# SPDX-License-Identifier: Apache-2.0
"""The soak client (vllm_dflash/bench/soak/client.py) reports a transport failure with what a diagnosis needs: the
exception chain (httpx's ReadError has no message of its own) and whether the request rode a new or a reused
keep-alive connection. A local asyncio server answers the first request on a connection and resets the connection
(RST, SO_LINGER 0) on the second, the way a server that drops an idle keep-alive connection does (no vLLM). Such a
request is sent once more on a new connection, under its own tag, keeping the first attempt's diagnosis."""
import asyncio
from dataclasses import asdict
import socket
import struct

import httpx

from vllm_dflash.bench.soak import report as soak_report
from vllm_dflash.bench.soak.client import RETRY_SUFFIX, send
from vllm_dflash.bench.soak.plan import Req

_OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
_BODY = b'{"choices": [{"text": "hi", "finish_reason": "length"}], "usage": {"completion_tokens": 1}}'


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, resets: list[int]) -> None:
    served = 0
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        n = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
        await reader.readexactly(n)
        if served == 1 and resets:  # the second request on this connection: reset it (as many times as listed)
            resets.pop()
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return
        writer.write(_OK % (len(_BODY), _BODY))
        await writer.drain()
        served += 1


def _two_requests(resets: int):
    async def run():
        server = await asyncio.start_server(lambda r, w: _serve(r, w, [1] * resets), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        req = Req(kind="greedy", endpoint="completions", stream=False,
                  body={"model": "target", "prompt": "x", "max_tokens": 1})
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False) as client:
            first = await send(client, req, "soak-r1-00000", 10.0)
            second = await send(client, req, "soak-r1-00001", 10.0)
        server.close()
        await server.wait_closed()
        return first, second

    return asyncio.run(run())


def test_a_reset_before_any_response_is_sent_again_with_its_diagnosis():
    first, second = _two_requests(resets=1)
    assert first.status == "ok" and first.connection == "new" and first.retried is None
    # the second request rode the first's pooled keep-alive connection, which the server reset: sent again on a new one
    assert second.status == "ok" and second.tag == "soak-r1-00001" + RETRY_SUFFIX and second.connection == "new"
    r = second.retried
    assert r["tag"] == "soak-r1-00001" and r["connection"] == "reused"
    assert "ConnectionResetError" in r["error"], r["error"]  # the OSError under httpx's message-less ReadError
    assert any(e.startswith("http11.receive_response_headers") for e in r["trace"]), r["trace"]


def test_a_reset_retry_is_reported_and_its_tag_parsed():
    _, second = _two_requests(resets=1)
    o = {**asdict(second), "text": "hi", "finish_reason": "length", "completion_tokens": 1, "max_tokens": 1}
    summary = soak_report.summarize_round([o], {}, 1.0)
    assert summary["errors"] == 0 and [x["first_tag"] for x in summary["retried"]] == ["soak-r1-00001"]
    log = soak_report.parse_server_log(f"INFO Added request cmpl-{second.tag}-0-ab12cd34.")
    assert log["added"] == {second.tag}  # the retry's own tag, not the first attempt's
    # a first attempt the engine did receive is a request it never answered: the accounting flags it
    log = soak_report.parse_server_log(f"INFO Added request cmpl-soak-r1-00001-0-ab12.\n"
                                       f"INFO Added request cmpl-{second.tag}-0-cd34.")
    assert soak_report.account([o], log, "soak-r1")["added_unaccounted"] == ["soak-r1-00001"]
