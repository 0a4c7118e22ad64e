# SPDX-License-Identifier: Apache-2.0
"""`TokenHistory`: each request's committed token ids, mirrored by the drafter from the tokens the target verifies.

Under overlap (async) scheduling vLLM's host copy of a request's tokens (`input_batch.token_ids_cpu`) lags: tokens
sampled on the device are not written back to the host. Prompt lookup needs the full history, so the drafter keeps
its own: the prompt (always on the host) on first sight, then, every step, the query tokens the target accepted
(written at their positions) and the token it just sampled. Where the query tensors live in host memory (CPU) this
costs a copy of a few ints per request; on a GPU it would need a device-to-host read per step.

Committed tokens never change, so a write at a known position is idempotent (re-prefill after preemption rewrites
the same values). A request whose history has a hole (its state was dropped, then its query started past the end)
is marked incomplete and gets no prompt-lookup proposal until it leaves."""
from __future__ import annotations

import numpy as np


class TokenHistory:
    def __init__(self):
        self._buf: dict[str, np.ndarray] = {}
        self._len: dict[str, int] = {}
        self._broken: set[str] = set()

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._buf

    def start(self, req_id: str, prompt: np.ndarray) -> None:
        """First sight of a request: its prompt token ids [P]."""
        buf = np.empty(max(2 * len(prompt), 64), dtype=np.int64)
        buf[: len(prompt)] = prompt
        self._buf[req_id], self._len[req_id] = buf, len(prompt)
        self._broken.discard(req_id)

    def commit(self, req_id: str, first_pos: int, tokens: np.ndarray, sampled: int) -> np.ndarray | None:
        """tokens: [n] accepted query tokens at positions first_pos .. first_pos+n-1; sampled: the token the target
        just sampled (position first_pos+n). -> the history [first_pos+n+1] (a view), or None if incomplete."""
        buf, length = self._buf[req_id], self._len[req_id]
        end = first_pos + len(tokens)
        if first_pos > length:  # a hole: tokens between were never seen
            self._broken.add(req_id)
        if end + 1 > len(buf):
            grown = np.empty(max(2 * len(buf), end + 64), dtype=np.int64)
            grown[:length] = buf[:length]
            buf = self._buf[req_id] = grown
        buf[first_pos:end] = tokens
        buf[end] = sampled
        self._len[req_id] = end + 1
        return None if req_id in self._broken else buf[: end + 1]

    def drop(self, req_ids) -> None:
        for rid in req_ids:
            self._buf.pop(rid, None)
            self._len.pop(rid, None)
            self._broken.discard(rid)
