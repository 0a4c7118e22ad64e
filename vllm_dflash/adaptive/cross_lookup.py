# SPDX-License-Identifier: Apache-2.0
"""Cross-request lookup (suffix-decoding style): the continuation of the history's suffix in OTHER requests' prompts
and outputs, the prompt-lookup source's fallback when the request's own history has no match.

The index maps every n-gram (n = min_n .. max_n) of the requests seen so far to its most recent occurrence that has
a token after it; a lookup tries n = max_n .. min_n and returns up to k tokens that followed.

Tenants: every document belongs to one tenant (the caller's key: the drafter passes the request's cache_salt and
LoRA adapter, what vLLM's prefix cache keeps apart; integration/drafting/adaptive.py), and each tenant has its own
map, so a lookup only ever finds documents of its own tenant. Shared, a draft's acceptance (tokens per streamed
chunk, the latency) would tell a user whether their continuation matched another user's recent text. The capacity
is shared, as the prefix cache's blocks are.

Cost and memory: each token is indexed once, when first observed (`observe`: the tokens new since the last call),
and unindexed once, when it leaves, so a step costs in proportion to its new tokens (64 live requests x 2k tokens,
over the default capacity: 12 µs of CPU time per request-step, 7 below it; benchmarks/cross_lookup_cost.py, AMD EPYC,
loaded host). Past `capacity` held tokens the index evicts down to 255/256 of it: the documents of requests that left
the batch (`finish`) first, oldest first; then the oldest tokens of the live documents holding the most, trimmed to
one level (a live request is never dropped and re-indexed whole). A map entry leaves with its token (where a later
occurrence of its n-gram took the entry, an older one still held is lost), so the maps hold at most
(max_n - min_n + 1) entries per held token: ~0.4 KB of host memory a token in all.

Its lifetime is the prefix cache's: vLLM's `reset_prefix_cache` (the bench's /reset_prefix_cache before each wave)
empties it too (integration/patches/prefix_cache_reset.py bumps `RESETS`), so repeated prompts never find their own
earlier answers. The patch runs in the engine-core process; the index is used only where the drafter lives there
too (vLLM's `uni` executor: TP = 1 with synchronous scheduling), see `AdaptiveDrafting`.

Measured by replaying served greedy outputs (dev/studies/lookup_replay.py): prompt lookup alone on open-ended chat
1.51 -> 1.60 tokens per forward with this fallback, HumanEval 1.85 -> 2.32."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

import numpy as np

RESETS = [0]  # bumped by each successful prefix-cache reset in this process
# the scheduler's patch (integration/patches/cross_lookup_salt.py) sets this attribute on each new request's
# SamplingParams to the request's cache_salt (None: unsalted); the drafter reads it from the runner's request state
SALT_ATTR = "_vllm_dflash_cache_salt"
ONE_TENANT = ()  # the tenant of a caller that keys nothing (tests, benchmarks)


def note_prefix_cache_reset() -> None:
    RESETS[0] += 1


@dataclass(slots=True)
class _Doc:
    """One request's tokens: absolute positions start .. end - 1 are held (indexed), tokens[p - offset] is position p
    (the positions before start are trimmed; tokens keeps up to as many again before it compacts)."""

    req_id: str
    tenant: Hashable
    tokens: list[int] = field(default_factory=list)
    offset: int = 0
    start: int = 0

    @property
    def end(self) -> int:
        return self.offset + len(self.tokens)


class CrossRequestIndex:
    def __init__(self, capacity: int, min_n: int = 3, max_n: int = 6):
        if capacity <= 0 or not 1 <= min_n <= max_n:
            raise ValueError(f"CrossRequestIndex: capacity {capacity}, n {min_n}..{max_n}")
        self.capacity, self.min_n, self.max_n = capacity, min_n, max_n
        self._epoch = RESETS[0]
        self.clear()

    def clear(self) -> None:
        self.docs: dict[int, _Doc] = {}  # document number -> its document
        self.live: dict[str, int] = {}  # request id -> its document number, requests in the batch
        self.retired: OrderedDict[str, int] = OrderedDict()  # the same for requests that left it, oldest first
        # per tenant: hash((n, *ngram)) -> document number << 32 | end position (a hash collision is checked at lookup)
        self.maps: dict[Hashable, dict[int, int]] = {}
        self.tokens = 0  # held tokens, all documents
        self._next = 0

    def _sync_epoch(self) -> None:
        if self._epoch != RESETS[0]:
            self._epoch = RESETS[0]
            self.clear()

    def observe(self, req_id: str, history: np.ndarray, tenant: Hashable = ONE_TENANT) -> None:
        """history: [L] the request's committed tokens (prompt + output). Indexes the tokens new since the last
        call (every n-gram that now has a token after it) under `tenant`."""
        self._sync_epoch()
        d = self._doc_of(req_id, tenant)
        doc = self.docs[d]
        old, L = doc.end, int(history.shape[0])
        if L <= old:
            return
        if L - old > self.capacity:  # more new tokens than the index holds (a long prompt): only the last ones
            self._trim(d, doc, old - doc.start)
            doc.start = doc.offset = old = L - self.capacity
            doc.tokens = history[old:].tolist()
        else:
            doc.tokens.extend(history[old:].tolist())
        self.tokens += L - old
        self._index(d, doc, max(old - 1, doc.start), L - 1)
        if self.tokens > self.capacity:
            self._evict()

    def finish(self, req_ids: Iterable[str]) -> None:
        """These requests left the batch (finished, aborted, preempted): their documents are dropped first when
        the index is over capacity. One observed again (a preempted request resumes) is live again, if still held."""
        for rid in req_ids:
            d = self.live.pop(rid, None)
            if d is None:
                continue
            if self.docs[d].end > self.docs[d].start:
                self.retired[rid] = d
            else:
                self._drop(d)  # trimmed to nothing

    def lookup(self, history: np.ndarray, k: int, tenant: Hashable = ONE_TENANT) -> np.ndarray:
        """history: [L] -> [<= k] the tokens that followed the most recent occurrence of its longest indexed
        suffix (n = max_n .. min_n), in any indexed request of the same tenant; empty if none."""
        self._sync_epoch()
        where = self.maps.get(tenant)
        if k <= 0 or not where:
            return history[:0]
        tail = history[-self.max_n:].tolist()
        for n in range(min(self.max_n, len(tail)), self.min_n - 1, -1):
            gram = tail[-n:]
            v = where.get(hash((n, *gram)))
            if v is None:
                continue
            doc = self.docs.get(v >> 32)
            if doc is None or doc.tenant != tenant:  # a safeguard: entries leave with their tokens, maps are per tenant
                continue
            e = (v & 0xFFFFFFFF) - doc.offset
            if e >= n - 1 and doc.tokens[e - n + 1: e + 1] == gram:  # no hash collision
                return np.asarray(doc.tokens[e + 1: e + 1 + k], dtype=np.int64)
        return history[:0]

    # ------------------------------------------------------------------ internals
    def _doc_of(self, req_id: str, tenant: Hashable) -> int:
        """The request's live document: its own, a retired one still held (revived), or a new one."""
        d = self.live.get(req_id)
        if d is None:  # left the batch (maybe still held), or new
            d = self.retired.pop(req_id, None)
            if d is not None:
                self.live[req_id] = d
        if d is not None and self.docs[d].tenant != tenant:  # a reused request id: never across tenants
            self._drop(d)
            d = None
        if d is None:
            d, self._next = self._next, self._next + 1
            self.docs[d] = _Doc(req_id, tenant)
            self.live[req_id] = d
        return d

    def _index(self, d: int, doc: _Doc, lo: int, hi: int) -> None:
        """Register the n-grams of doc ending at lo .. hi - 1 (each has a token after it) that start at or after
        doc.start."""
        where, base = self.maps.setdefault(doc.tenant, {}), d << 32
        toks, off, first, a, b = doc.tokens, doc.offset, doc.start, self.min_n, self.max_n
        for end in range(lo, hi):
            i, v = end - off, base | end
            for n in range(a, min(b, end - first + 1) + 1):
                where[hash((n, *toks[i - n + 1: i + 1]))] = v

    def _unindex(self, d: int, doc: _Doc, lo: int, hi: int) -> None:
        """Remove the entries of the n-grams of doc that start at lo .. hi - 1 (where no later occurrence replaced
        them): before those tokens are dropped."""
        where = self.maps.get(doc.tenant)
        if not where or hi <= lo:
            return
        toks, off, base, last = doc.tokens, doc.offset, d << 32, doc.end - 2  # last: the last indexed end
        for g in range(lo, hi):
            i = g - off
            for n in range(self.min_n, self.max_n + 1):
                end = g + n - 1
                if end > last:
                    break
                key = hash((n, *toks[i: i + n]))
                if where.get(key) == base | end:
                    del where[key]

    def _drop(self, d: int) -> None:
        doc = self.docs.pop(d)
        self._unindex(d, doc, doc.start, doc.end)
        self.tokens -= doc.end - doc.start
        for held in (self.live, self.retired):
            if held.get(doc.req_id) == d:
                del held[doc.req_id]
        if not self.maps.get(doc.tenant, True):
            del self.maps[doc.tenant]

    def _trim(self, d: int, doc: _Doc, n: int) -> None:
        """Drop the document's oldest n held tokens."""
        self._unindex(d, doc, doc.start, doc.start + n)
        doc.start += n
        self.tokens -= n
        self._compact(doc)

    @staticmethod
    def _compact(doc: _Doc) -> None:
        """The token list keeps at most as many trimmed tokens as it holds (amortised: trimming stays cheap)."""
        if doc.start - doc.offset > len(doc.tokens) // 2:
            del doc.tokens[: doc.start - doc.offset]
            doc.offset = doc.start

    def _evict(self) -> None:
        """Down to 255/256 of the capacity (evictions in small batches, not at every observation): drop finished
        requests' documents, oldest first; then trim the live documents holding the most, to one level (each token
        leaves once: the cost is that of the tokens evicted)."""
        low = self.capacity - self.capacity // 256
        while self.tokens > low and self.retired:
            self._drop(next(iter(self.retired.values())))
        need = self.tokens - low
        if need <= 0:
            return
        # the level h: trimming every live document above h down to h frees at least `need` tokens
        held = sorted(((self.docs[d].end - self.docs[d].start, d) for d in self.live.values()), reverse=True)
        top = 0
        for k, (h, _) in enumerate(held, 1):
            top += h
            below = held[k][0] if k < len(held) else 0
            if top - k * below >= need:
                level = (top - need) // k
                for h, d in held[:k]:
                    if h > level:
                        self._trim(d, self.docs[d], h - level)
                return
