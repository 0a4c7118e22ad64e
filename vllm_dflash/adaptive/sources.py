# SPDX-License-Identifier: Apache-2.0
"""Which proposal each request verifies, free of vLLM: the candidates an adaptive mode can propose from (the DFlash
block, the prompt-lookup continuation, the two merged), the expected accepted length of each request's proposal per
source, the choice among them, and the proposal's tokens. `AdaptiveController` (adaptive/controller.py) calls these
with its mode ('both', 'dflash', 'ngram' or 'merged') and k_max."""
from __future__ import annotations

import numpy as np

from vllm_dflash.adaptive.acceptance import AcceptanceModel


def merge(lookup: np.ndarray, block: np.ndarray | None, k: int) -> np.ndarray:
    """The merged proposal: lookup: [m] prompt-lookup tokens, block: [>= k] DFlash tokens (None: not drafted).
    -> [k]: lookup[j] in slots j < m, block[j] in slots m <= j < k (without a block: the lookup alone, [min(m, k)])."""
    head = lookup[:k]
    if block is None or len(head) == k:
        return head
    return np.concatenate([head, block[len(head): k]])


def proposal_tokens(src: str, lookup: np.ndarray, block: np.ndarray | None, k_max: int) -> np.ndarray:
    """The full proposal of a source: [k_max] (prompt lookup alone: [m]). Without a block (only possible on a TP
    rank whose own plan differed from the adopted one, which would be a bug; that rank's drafts are dropped) a
    DFlash proposal is empty."""
    if src == "dflash":
        return block if block is not None else np.zeros(0, dtype=np.int64)
    if src == "ngram":
        return lookup
    return merge(lookup, block, k_max)


def gain_table(acceptance: AcceptanceModel, mode: str, k_max: int, req_ids: list[str],
               m: np.ndarray, cross: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """P(i) (drafts 1..i all accepted) of every request's full-length proposal per source, [B, k_max] each, for
    requests with m[r] lookup tokens: a merged proposal is prompt lookup's in its first m slots and the
    block-after-lookup rates ('merged') after them. Only the sources this mode can propose. cross: [B] bool, the
    request's lookup came from other requests' tokens (adaptive/cross_lookup.py): its lookup slots take the rates
    kept for those ('cross'), which accept far less often than a request's own history."""
    names = {"dflash": ("dflash",), "ngram": ("ngram",), "merged": ("ngram", "merged")}.get(
        mode, ("dflash", "ngram", "merged"))
    rates = {s: acceptance.rates_batch(req_ids, s) for s in names}
    if cross is not None and cross.any() and "ngram" in rates:
        rates["ngram"] = np.where(cross[:, None], acceptance.rates_batch(req_ids, "cross"), rates["ngram"])
    if "merged" in rates:
        in_lookup = np.arange(k_max)[None, :] < m[:, None]  # [B, k_max]
        rates["merged"] = np.where(in_lookup, rates["ngram"], rates["merged"])
    return {s: np.cumprod(np.clip(r, 0.0, 1.0), axis=1) for s, r in rates.items()}


def choose(table: dict[str, np.ndarray], m: np.ndarray, mode: str, k_max: int, block: bool = True,
           fresh: np.ndarray | None = None) -> tuple[list[str], np.ndarray]:
    """Per request, the candidate (`candidates`: source and proposal length) with the largest expected accepted
    length Σ P(i) (it depends only on the proposal's length, so the choice precedes the draft forward); the
    first in candidate order on ties, 'none' when none expects any token. table: `gain_table`; fresh: [B] bool,
    False for a request whose draft context has holes (`AdaptiveController.context_dropped`): only candidates
    without DFlash tokens for it. -> (sources, [B, k_max] P(i) of each chosen proposal, zero past its length and
    for 'none')."""
    B, K = len(m), k_max
    cands = candidates(mode, k_max, block)
    free = None  # where some request is stale: (source, length) of the candidates that need no draft forward
    if fresh is not None and block and not fresh.all():
        free_cands, have = candidates(mode, k_max, False), {c[:2] for c in cands}
        free = {c[:2] for c in free_cands}
        cands = cands + [c for c in free_cands if c[:2] not in have]  # stale requests may take the lookup alone
    if not cands:
        return ["none"] * B, np.zeros((B, K))
    slot = np.arange(K)[None, :]
    gains, sums = [], []
    for src, length, valid in cands:
        n = {"k": np.full(B, K), "m": m}[length]
        ok = valid(m)
        if free is not None and (src, length) not in free:
            ok = ok & fresh  # a proposal with DFlash tokens needs the request's whole draft context
        g = np.where((slot < n[:, None]) & ok[:, None], table[src], 0.0)  # [B, K]
        gains.append(g)
        sums.append(np.where(ok, g.sum(axis=1), -1.0))
    sums = np.stack(sums, axis=1)  # [B, candidates]
    best = np.argmax(sums, axis=1)  # the first of equal candidates
    chosen = sums[np.arange(B), best] > 0.0
    names = [c[0] for c in cands]
    sources = [names[b] if c else "none" for b, c in zip(best.tolist(), chosen.tolist())]
    out = np.stack(gains, axis=1)[np.arange(B), best] * chosen[:, None]
    return sources, out


def candidates(mode: str, k_max: int, block: bool = True) -> list[tuple]:
    """(source, proposal length: 'k' = k_max or 'm' = the lookup's, which requests may propose it: m -> [B] bool)
    in preference order. Under 'both' the merge is a candidate of its own only where it differs from both parts
    (0 < m < k_max). block=False: only what needs no draft forward (the lookup's own tokens)."""
    K = k_max
    any_m, always = (lambda m: m > 0), (lambda m: np.ones(len(m), dtype=bool))
    if not block:
        if mode == "dflash":
            return []
        return [("ngram" if mode in ("both", "ngram") else "merged", "m", any_m)]
    if mode == "dflash":
        return [("dflash", "k", always)]
    if mode == "ngram":
        return [("ngram", "m", any_m)]
    if mode == "merged":
        return [("merged", "k", always)]
    return [("dflash", "k", always), ("ngram", "m", any_m), ("merged", "k", lambda m: (m > 0) & (m < K))]
