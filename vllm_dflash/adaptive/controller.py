# SPDX-License-Identifier: Apache-2.0
"""`AdaptiveController`: per step, per request, which proposal (DFlash block or prompt lookup) and how many of its
tokens the target verifies (0 = no speculation for that request).

Inputs per step: every request's committed token history (prompt + output, newest last) and the DFlash block
drafted for it (or None when the step skipped the draft forward). The controller
  1. scores the previous proposal of each request against its history (accepted = common prefix), updating the
     acceptance model of the source that proposed it;
  2. times the step (wall clock between calls) and feeds the step-cost model with the number of query tokens the
     target was fed (decode-only steps);
  3. builds the prompt-lookup proposal, picks per request the source with the larger expected accepted length,
     and plans the lengths with `plan_lengths`.
Every decision is counted in the metrics (sources, lengths, accepted tokens per source, cost-model fit).
Host-side by design (numpy on token lists). `step` serves synchronous scheduling, where the history is committed
when the drafter runs; `step_overlap` serves overlap scheduling, where the scheduler plans the lengths
(adaptive/lengths.py) and this controller only picks each request's source."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from vllm_dflash.adaptive.ngram import prompt_lookup
from vllm_dflash.adaptive.policy import (AcceptanceModel, SpeculationGuard, StepCostModel, batch_bucket,
                                         cumulative_acceptance, plan_lengths, publish_plan)

MODES = ("both", "dflash", "ngram")


@dataclass
class _Pending:
    start: int  # len(history) when proposed: the drafts predict history[start:start + len(tokens)]
    tokens: np.ndarray
    source: str


class AdaptiveController:
    def __init__(self, k_max: int, mode: str = "both", ngram_min: int = 2, ngram_max: int = 4,
                 probe_every: int = 8, metrics=None, clock=time.perf_counter):
        if mode not in MODES:
            raise ValueError(f"adaptive mode {mode!r}: expected one of {MODES}")
        self.k_max, self.mode = k_max, mode
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        self.probe_every = probe_every
        self.acceptance = AcceptanceModel(k_max)
        self.cost = StepCostModel()
        self.guards: dict[int, SpeculationGuard] = {}  # per batch-size bucket (1, 2-3, 4-7, ...)
        self._bucket = 0  # batch-size bucket of the current step
        self._decided_bucket = -1  # bucket whose guard chose the arm of the previous step
        self.metrics = metrics
        self.clock = clock
        self._pending: dict[str, _Pending] = {}
        self._last_t: float | None = None
        self._steps = 0
        self._since_dflash_chosen = 0

    @property
    def guard(self) -> SpeculationGuard:
        """The guard of the current batch-size bucket."""
        g = self.guards.get(self._bucket)
        if g is None:
            g = self.guards[self._bucket] = SpeculationGuard()
        return g

    # ------------------------------------------------------------------ per step
    def want_dflash(self, num_reqs: int | None = None) -> bool:
        """Run the DFlash draft forward this step? Yes while some request picks it, and every `probe_every`
        steps otherwise (its acceptance estimate must stay fresh). Always for mode 'dflash', never for 'ngram'.
        Never while the guard of this batch size holds 'off'."""
        if num_reqs is not None:
            self._bucket = batch_bucket(num_reqs)
        if self.guard.arm == "off":
            return False
        if self.mode != "both":
            return self.mode == "dflash"
        return self._since_dflash_chosen == 0 or self._steps % self.probe_every == 0

    def step(self, req_ids: list[str], histories: list[np.ndarray], dflash: np.ndarray | None,
             query_tokens: int, decode_only: bool, extra_tokens: int = 0) -> list[list[int]]:
        """-> draft token ids per request (variable length, possibly empty).

        dflash: [B, k_max] DFlash drafts (None: not run this step). query_tokens: tokens the target was fed in the
        step just verified; decode_only: that step had no prefill chunk (its time is a clean cost sample)."""
        now = self.clock()
        dt = None
        if self._last_t is not None and decode_only and query_tokens > 0:
            dt = now - self._last_t
            if dt < 10 * self.cost(query_tokens) + 0.05:  # an idle gap between requests is not a step cost
                self.cost.observe(query_tokens, dt)
            else:
                dt = None
        self._last_t = now
        self._steps += 1
        accepted = self._score_previous(req_ids, histories)
        ran = self.guards.get(self._decided_bucket)  # the guard whose arm ran the step just verified
        if dt is not None and ran is not None:  # it produced one token per request plus the accepted drafts
            ran.record(len(req_ids) + accepted, dt)
        self._bucket = self._decided_bucket = batch_bucket(len(req_ids))
        self._prune(req_ids)

        if self.guard.arm == "off":  # measured: no speculation is faster here (or being re-measured)
            proposals, sources, ks = [None] * len(req_ids), ["none"] * len(req_ids), [0] * len(req_ids)
        else:
            proposals, sources, ks = self._plan(req_ids, histories, dflash, extra_tokens)

        out: list[list[int]] = []
        chose_dflash = False
        for rid, hist, toks, src, k in zip(req_ids, histories, proposals, sources, ks):
            if k == 0:
                self._pending.pop(rid, None)
                out.append([])
                self._count("proposals_none")
                continue
            self._pending[rid] = _Pending(len(hist), toks[:k].copy(), src)
            out.append([int(t) for t in toks[:k]])
            chose_dflash |= src == "dflash"
            self._count(f"proposals_{src}")
            self._count(f"drafted_tokens_{src}", k)
        self._since_dflash_chosen = 0 if chose_dflash else self._since_dflash_chosen + 1
        publish_plan(self.metrics, ks, self.cost, self.guard)
        return out

    def step_overlap(self, req_ids: list[str], histories: list[np.ndarray | None], dflash: np.ndarray | None,
                     verified: list[tuple[int, int]]) -> np.ndarray:
        """Overlap (async) scheduling: the scheduler decides how many drafts each request verifies
        (integration/async_scheduler.py); here only the source. -> [B, k_max] proposals, full length.

        histories[r]: committed tokens of request r (None: incomplete, no prompt lookup); verified[r]: (drafts the
        step just verified, drafts accepted) for the request's previous proposal. A prompt-lookup proposal shorter
        than k_max is padded with the DFlash block's tail (or its own last token); the scheduler's per-request
        acceptance learns how far such a mix gets accepted."""
        verified_dflash = self.score_overlap(req_ids, verified)
        out = np.empty((len(req_ids), self.k_max), dtype=np.int64)
        for i, (rid, hist) in enumerate(zip(req_ids, histories)):
            toks, _, src = self._choose(rid, hist, dflash[i] if dflash is not None else None)
            n = len(toks)
            out[i, :n] = toks
            if n < self.k_max:
                fill = dflash[i, n:] if dflash is not None else None
                out[i, n:] = fill if fill is not None else (toks[-1] if n else (hist[-1] if hist is not None else 0))
            if src != "none":
                self._pending[rid] = _Pending(0, out[i].copy(), src)
        # the draft forward keeps running while the scheduler verifies DFlash proposals (else: a probe every
        # `probe_every` steps); a block drafted for requests the scheduler gives k = 0 is pure cost
        self._since_dflash_chosen = 0 if verified_dflash else self._since_dflash_chosen + 1
        self._prune(req_ids)
        return out

    def score_overlap(self, req_ids: list[str], verified: list[tuple[int, int]]) -> bool:
        """Score each request's pending proposal: (drafts verified this step, drafts accepted).
        -> whether any verified proposal was a DFlash block."""
        self._steps += 1
        dflash = False
        for rid, (k, a) in zip(req_ids, verified):
            p = self._pending.pop(rid, None)
            if p is not None and k > 0:
                dflash |= p.source == "dflash"
                a = max(0, min(a, k))
                self.acceptance.observe(rid, p.source, k, a)
                self._count(f"proposals_{p.source}")
                self._count(f"drafted_tokens_{p.source}", k)
                self._count(f"accepted_tokens_{p.source}", a)
        return dflash

    def _choose(self, rid: str, hist: np.ndarray | None,
                block: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, str]:
        """The source with the larger expected accepted length for this request.
        -> (its tokens, P(i) = probability drafts 1..i are all accepted over them, source)."""
        best = (np.zeros(0, dtype=np.int64), np.zeros(0), "none")
        cands = []
        if block is not None and self.mode in ("both", "dflash"):
            cands.append(("dflash", block))
        if hist is not None and self.mode in ("both", "ngram"):
            cands.append(("ngram", prompt_lookup(hist, self.k_max, self.ngram_min, self.ngram_max)))
        for src, toks in cands:
            if len(toks):
                p = cumulative_acceptance(self.acceptance.rates(rid, src), len(toks))
                if p.sum() > best[1].sum():
                    best = (np.asarray(toks), p, src)
        return best

    def _plan(self, req_ids: list[str], histories: list[np.ndarray], dflash: np.ndarray | None,
              extra_tokens: int) -> tuple[list[np.ndarray], list[str], list[int]]:
        """Per request the source with the larger expected accepted length, then the lengths (plan_lengths)."""
        proposals, gains, sources = [], [], []
        for i, (rid, hist) in enumerate(zip(req_ids, histories)):
            toks, p, src = self._choose(rid, hist, dflash[i] if dflash is not None else None)
            proposals.append(toks)
            gains.append(p)
            sources.append(src)
        return proposals, sources, plan_lengths(gains, self.cost, extra_tokens=extra_tokens)

    def _prune(self, req_ids: list[str]) -> None:
        """Every 64 steps: drop the state of requests that left the batch (finished, aborted, preempted)."""
        if self._steps % 64 == 0:
            live = set(req_ids)
            self.finished([r for r in list(self.acceptance.req) + list(self._pending) if r not in live])

    def finished(self, req_ids) -> None:
        for rid in req_ids:
            self._pending.pop(rid, None)
            self.acceptance.forget(rid)

    # ------------------------------------------------------------------ internals
    def _score_previous(self, req_ids: list[str], histories: list[np.ndarray]) -> int:
        """Score each request's previous proposal; returns the accepted draft tokens of the step just verified."""
        total = 0
        for rid, hist in zip(req_ids, histories):
            p = self._pending.pop(rid, None)
            if p is None or len(hist) <= p.start:
                continue  # not verified since (e.g. preempted): no outcome
            seen = hist[p.start: p.start + len(p.tokens)]
            m = min(len(seen), len(p.tokens))
            eq = seen[:m] == p.tokens[:m]
            accepted = int(m if eq.all() else np.argmin(eq))
            accepted = min(accepted, len(hist) - p.start - 1)  # the last history token is the bonus, not a draft
            self.acceptance.observe(rid, p.source, len(p.tokens), accepted)
            self._count(f"accepted_tokens_{p.source}", accepted)
            total += accepted
        return total

    def _count(self, name: str, n: float = 1.0) -> None:
        if self.metrics is not None:
            self.metrics.inc(name, n)
