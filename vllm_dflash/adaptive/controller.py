# SPDX-License-Identifier: Apache-2.0
"""`AdaptiveController`: per step, per request, which proposal and how many of its tokens the target verifies
(0 = no speculation for that request).

Sources (`policy.SOURCES`): the DFlash block, the prompt-lookup continuation (adaptive/ngram.py), and the two merged:
the lookup's m tokens in slots 0..m-1, the DFlash block's tokens in slots m..k-1 (the block is drafted from the
anchor as always, so its token j is its guess for slot j).

Each step has two halves around the draft forward, so the forward runs only when this step's plan uses its tokens:
  1. `plan` (synchronous scheduling; `plan_overlap` under overlap) scores the previous proposal of each request
     against its history (accepted = common prefix; overlap: the counts the target reported), updating the acceptance
     model of the source that proposed it; times the step (wall clock between calls) for the step-cost model; looks
     up every request's prompt-lookup continuation; picks per request the source with the larger expected accepted
     length and (synchronous) plans the lengths with `plan_lengths`. `StepPlan.needs_block` says whether any
     request will verify a DFlash token.
  2. `propose` (`propose_overlap`) builds the proposals from the plan and the block (None when the forward did not
     run).
Every decision is counted in the metrics (request-steps, sources, lengths, accepted tokens per source, cost fit).
Host-side by design (numpy on token lists). Under overlap scheduling the scheduler plans the lengths
(adaptive/lengths.py) and this controller only picks each request's source.

Tensor parallelism: every TP rank runs its own controller on the same tokens, but the step-cost model and the guard
read the rank's own wall clock, so two ranks can plan differently; the draft forward holds collectives, so the ranks
must agree on whether it runs. The drafter therefore sends TP rank 0's plan to every rank after `plan` and before the
forward (`StepPlan.encode` / `StepPlan.adopt`; integration/tp_plan.py `sync_plan_across_tp`)."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from vllm_dflash.adaptive.ngram import prompt_lookup
from vllm_dflash.adaptive.policy import (SURE_SPEEDUP, AcceptanceModel, SpeculationGuard, SplitStepCost,
                                         StepCostModel, batch_bucket, guard_for, plan_lengths, predicted_speedup,
                                         publish_plan)
from vllm_dflash.adaptive.trace import open_trace

MODES = ("both", "dflash", "ngram", "merged")  # both: choose among dflash, ngram and merged per request-step
PLAN_SOURCES = ("none", "dflash", "ngram", "merged")  # StepPlan.encode: a source's code is its index here


@dataclass
class _Pending:
    start: int  # len(history) when proposed: the drafts predict history[start:start + len(tokens)]
    tokens: np.ndarray
    source: str
    lookup: int = 0  # merged: how many of the tokens came from prompt lookup (slots 0..lookup-1)


@dataclass
class StepPlan:
    """One step's decisions, made before the draft forward. Per request: its prompt-lookup continuation, the chosen
    source ('none': no proposal) and how many tokens of it the target verifies (overlap: the proposal's length; the
    scheduler decides how many are verified)."""

    req_ids: list[str]
    starts: list[int]  # len(history): the drafts predict history[start:]
    lookups: list[np.ndarray]  # [<= k_max] each
    sources: list[str]
    ks: list[int]
    run_block: bool | None = None  # adopted from another rank (`adopt`): whether the draft forward runs
    # speculation is off here because no speculation was measured faster (not while 'off' is only being re-measured):
    # the drafter drops this step's context rows instead of holding them (`AdaptiveController.context_dropped`)
    drop_context: bool = False

    def block_requests(self) -> list[int]:
        """Positions (in this plan) of the requests that verify DFlash tokens: the draft forward's rows."""
        return [j for j, (s, k, t) in enumerate(zip(self.sources, self.ks, self.lookups)) if _needs_block(s, k, t)]

    def block_spans(self) -> list[tuple[int, int]]:
        """Per request of `block_requests`, the block slots (lo, hi) it verifies: 0..k-1 for a DFlash proposal, the
        slots after the lookup's tokens (m..k-1) for a merged one. The draft's argmax runs there alone."""
        return [(_lookup_slots(s, t, k), k) for s, k, t in zip(self.sources, self.ks, self.lookups)
                if _needs_block(s, k, t)]

    def overlap_spans(self, k_max: int) -> list[tuple[int, int] | None]:
        """Per request, the block slots (lo, hi) of its full-length proposal under overlap scheduling
        (`propose_overlap`): 0..k_max-1 for a DFlash proposal, those after the lookup's tokens for a merged one, None
        for the others (no DFlash token)."""
        return [(_lookup_slots(s, t, k_max), k_max) if _needs_block(s, k_max, t) else None
                for s, t in zip(self.sources, self.lookups)]

    @property
    def needs_block(self) -> bool:
        """Does any request verify a DFlash token, i.e. must the draft forward run? (After `adopt`: the deciding
        rank's answer, so every rank runs the forward, with its collectives, or none does.)"""
        if self.run_block is not None:
            return self.run_block
        return any(_needs_block(s, k, t) for s, k, t in zip(self.sources, self.ks, self.lookups))

    def encode(self) -> np.ndarray:
        """The decisions as [2 * B + 1] int64: source codes (PLAN_SOURCES), lengths, then needs_block | 2 *
        drop_context. B is the same on every TP rank (the batch is), so the size is known before the broadcast."""
        out = np.empty(2 * len(self.sources) + 1, dtype=np.int64)
        n = len(self.sources)
        out[:n] = [PLAN_SOURCES.index(s) for s in self.sources]
        out[n: 2 * n] = self.ks
        out[2 * n] = int(self.needs_block) | (int(self.drop_context) << 1)
        return out

    def adopt(self, code: np.ndarray) -> "StepPlan":
        """Take another rank's decisions (`encode` of its plan for the same requests) in place; the lookups stay this
        rank's (pure functions of the same tokens). -> self."""
        n = len(self.sources)
        if len(code) != 2 * n + 1:
            raise ValueError(f"plan code of length {len(code)} for {n} requests: the TP ranks disagree on the batch")
        self.sources = [PLAN_SOURCES[int(c)] for c in code[:n]]
        self.ks = [int(k) for k in code[n: 2 * n]]
        self.run_block = bool(int(code[2 * n]) & 1)
        self.drop_context = bool(int(code[2 * n]) & 2)
        return self


def _needs_block(source: str, k: int, lookup: np.ndarray) -> bool:
    """Does verifying k tokens of this source use a DFlash token (so the draft forward must run)?"""
    return (source == "dflash" and k > 0) or (source == "merged" and k > len(lookup))


def _lookup_slots(source: str, lookup: np.ndarray, k: int) -> int:
    """How many of a proposal's first k slots hold prompt-lookup tokens inside a merged proposal (0 otherwise)."""
    return min(len(lookup), k) if source == "merged" else 0


def merge(lookup: np.ndarray, block: np.ndarray | None, k: int) -> np.ndarray:
    """The merged proposal: lookup: [m] prompt-lookup tokens, block: [>= k] DFlash tokens (None: not drafted).
    -> [k]: lookup[j] in slots j < m, block[j] in slots m <= j < k (without a block: the lookup alone, [min(m, k)])."""
    head = lookup[:k]
    if block is None or len(head) == k:
        return head
    return np.concatenate([head, block[len(head): k]])


class AdaptiveController:
    def __init__(self, k_max: int, mode: str = "both", ngram_min: int = 2, ngram_max: int = 4, metrics=None,
                 clock=time.perf_counter, split_cost: bool = False,
                 guard_threshold: float = SURE_SPEEDUP, guard_margin: float | str = "noise",
                 guard_confirm: bool = True):
        if mode not in MODES:
            raise ValueError(f"adaptive mode {mode!r}: expected one of {MODES}")
        self.k_max, self.mode = k_max, mode
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        self.acceptance = AcceptanceModel(k_max)
        # the step without the draft forward: T(query tokens, requests, produced tokens); split_cost: fitted as the
        # target forward (timed by the caller, `plan(forward_s=...)`) plus the rest of the step (`SplitStepCost`)
        self.cost = SplitStepCost() if split_cost else StepCostModel(per_output=True)
        self.block_cost = StepCostModel(alpha=0.002, beta=0.0003)  # the draft forward: T(requests it runs over)
        # seconds a sampled request's draft adds to the step in verification (a rejection-sampler row beyond the
        # plain sampler's: measured by the caller, integration/patches/cpu_sampled_verify.py; 0: not known). The
        # step-cost fit sees it only as noise (its host part has no per-draft term), so the planner charges it
        self.sampled_row_s = 0.0
        # the drafter runs the forward over the requests that verify DFlash tokens only (synchronous, one pass:
        # integration/block_rows.py), so a plan's block costs block_cost(those requests); else block_cost(batch)
        self.block_rows_only = False
        self._block_s = 0.0  # draft-forward time inside the step being timed (taken out of its cost sample)
        self.guards: dict[int, SpeculationGuard] = {}  # per batch-size bucket (1, 2-3, 4-7, ...)
        self.guard_threshold = guard_threshold  # the guards' sure_speedup (setting guard_threshold)
        self.guard_margin = guard_margin  # setting guard_margin
        self.guard_confirm = guard_confirm  # setting guard_confirm
        self._bucket = 0  # batch-size bucket of the current step
        self._decided_bucket = -1  # bucket whose guard chose the arm of the previous step
        self.metrics = metrics
        self.clock = clock
        self._pending: dict[str, _Pending] = {}
        self._last_t: float | None = None
        self._steps = 0
        self.skip_when_off = True  # a measured-off step plans nothing (False: plan anyway, e.g. a TP follower rank)
        # requests whose draft context has holes (rows dropped while 'off' won): no DFlash tokens for them again
        self._stale: set[str] = set()
        # the context lease: a request given no DFlash token for `lease_steps` decode steps in a row releases its draft
        # context (stale from then on, its rows no longer kept: `wants_context`), so a request that lives on prompt
        # lookup or no speculation stops paying for the rows only a draft forward reads (0: never released)
        # Released only where keeping context is a real cost: while the injection of a step's rows (measured seconds
        # a row x the step's query tokens) is at least `lease_min_share` of the step's predicted time. At concurrency 1
        # it is well under 1 % (a request's DFlash tokens are worth far more after a long prompt-lookup span); at c8 on
        # chat prompts on a 2-core Xeon it measured 3.2 ms of a 55 ms step.
        self.lease_steps = 32 if mode in ("both", "merged") else 0
        self.lease_min_share = 0.02
        self._idle: dict[str, int] = {}  # decode steps since the request last verified a DFlash token
        self._row_s: float | None = None  # EMA of the injection's seconds per context row
        self._step_rows = 0  # query tokens (= context rows) of the step just verified
        self.trace = open_trace()  # DFLASH_TRACE: one record per step (adaptive/trace.py), else None

    @property
    def guard(self) -> SpeculationGuard:
        """The guard of the current batch-size bucket."""
        return guard_for(self.guards, self._bucket, self.guard_threshold, self.guard_margin, self.guard_confirm)

    # ------------------------------------------------------------------ synchronous scheduling
    def plan(self, req_ids: list[str], histories: list[np.ndarray], query_tokens: int, decode_only: bool,
             extra_tokens: int = 0, forward_s: float | None = None, sampled: list[bool] | None = None) -> StepPlan:
        """Sources and lengths of this step, before the draft forward.

        histories[r]: committed tokens of request r (prompt + output, newest last); query_tokens: tokens the target
        was fed in the step just verified; decode_only: that step had no prefill chunk (its time is a clean cost
        sample); extra_tokens: prefill tokens likely to share the next step; forward_s: that step's target forward
        time (with `split_cost`; None: unknown, the step is then not a cost sample); sampled: per request, whether it
        samples (temperature > 0): its acceptance is estimated from sampled requests' rates (`AcceptanceModel`)."""
        now = self.clock()
        if sampled is not None:
            self.acceptance.mark_sampled(req_ids, sampled)
        accepted = self._score_previous(req_ids, histories)
        produced = len(req_ids) + accepted  # tokens of the step just verified: one per request plus accepted drafts
        dt = None
        if self._last_t is not None and decode_only and query_tokens > 0:
            dt = now - self._last_t - self._block_s
            if dt < 10 * self.cost(query_tokens, len(req_ids), produced) + 0.05:  # an idle gap is not a step cost
                if isinstance(self.cost, SplitStepCost):
                    self.cost.observe(query_tokens, dt, len(req_ids), produced, forward_s)
                else:
                    self.cost.observe(query_tokens, dt, len(req_ids), produced)  # the step just verified
            else:
                dt = None
        self._last_t, block_s, self._block_s = now, self._block_s, 0.0
        self._steps += 1
        self._step_rows = query_tokens
        self._count("request_steps", len(req_ids))
        ran = self.guards.get(self._decided_bucket)  # the guard whose arm ran the step just verified
        if dt is not None and ran is not None:  # it produced one token per request plus the accepted drafts
            ran.record(produced, dt + block_s)  # the guard judges the whole step
        self._bucket = self._decided_bucket = batch_bucket(len(req_ids))
        self._prune(req_ids)

        B = len(req_ids)
        if self.skip_when_off and self.guard.arm == "off" and self.guard.rate["off"] is not None:
            # measured: no speculation is faster here (or being re-measured). The forecast only steers the guard
            # before 'off' was measured, so nothing is planned: no lookups, no planning cost at any batch size.
            empty = np.zeros(0, dtype=np.int64)
            plan = StepPlan(list(req_ids), [len(h) for h in histories], [empty] * B, ["none"] * B, [0] * B,
                            drop_context=self.guard.best == "off")
        else:
            lookups = [self._lookup(h) for h in histories]
            sources, ks, forecast = self._best_plan(req_ids, lookups, extra_tokens)
            self.guard.predict(forecast)
            if self.guard.arm == "off":  # 'off' being measured for the first time
                sources, ks = ["none"] * B, [0] * B
            plan = StepPlan(list(req_ids), [len(h) for h in histories], lookups, sources, ks)
        if self.trace is not None:
            self._trace_step(plan, query_tokens, produced, dt, block_s, forward_s, decode_only, extra_tokens,
                             self.clock() - now)
        return plan

    def _trace_step(self, plan: StepPlan, query_tokens: int, produced: int, dt: float | None, block_s: float,
                    forward_s: float | None, decode_only: bool, extra_tokens: int, plan_s: float) -> None:
        """One `trace` record: the step just verified (its query and produced tokens, its cost sample dt, its target
        forward and the draft forward's time in it), this step's decision (guard arm and rates, forecast, sources,
        lengths) and `plan_s`, the planning time."""
        g = self.guard
        by_source: dict[str, int] = {}
        for s, k in zip(plan.sources, plan.ks):
            if k > 0:
                by_source[s] = by_source.get(s, 0) + 1
        self.trace.record(
            B=len(plan.req_ids), q=query_tokens, out=produced, dt=dt, fwd=forward_s, blk=block_s, plan_s=plan_s,
            decode=decode_only, extra=extra_tokens, bucket=self._bucket, arm=g.arm, best=g.best,
            plan_rate=g.rate["plan"], off_rate=g.rate["off"], forecast=g.forecast,
            matched=int(sum(len(t) > 0 for t in plan.lookups)), drafted=int(sum(plan.ks)), sources=by_source,
            block=plan.needs_block,
            cost=[self.cost.alpha, self.cost.beta, self.cost.delta, self.cost.gamma])

    def _best_plan(self, req_ids: list[str], lookups: list[np.ndarray],
                   extra_tokens: int) -> tuple[list[str], list[int], float]:
        """Sources and lengths of the step, and their forecast speed-up over no speculation. The draft forward is a
        cost of the whole step, paid once if any request verifies a DFlash token: the best plan with the block is
        weighed against the best plan from prompt lookup alone, each with its full cost.
        -> (sources, lengths, forecast)."""
        B = len(req_ids)
        m = np.fromiter((len(t) for t in lookups), dtype=np.int64, count=B)  # [B] lookup tokens per request
        table = self._gain_table(req_ids, m)
        fresh = self._fresh(req_ids)
        plans = []
        # a sampled request's draft costs its verification row beyond the step-cost fit (`sampled_row_s`)
        token_cost = None
        if self.sampled_row_s > 0 and self.acceptance.sampled:
            token_cost = np.array([self.sampled_row_s if r in self.acceptance.sampled else 0.0 for r in req_ids])
        for block in (True, False) if self.mode != "ngram" else (False,):
            sources, gains = self._choose(table, m, block, fresh)
            ks = plan_lengths(gains, self.cost, extra_tokens=extra_tokens, token_cost=token_cost)
            n_block = sum(_needs_block(s, k, t) for s, k, t in zip(sources, ks, lookups))  # requests using it
            uses = n_block > 0
            fixed = self.block_cost(n_block if self.block_rows_only else B) if uses else 0.0
            plans.append((predicted_speedup(gains, ks, self.cost, extra_tokens, fixed, token_cost), sources, ks))
            if not uses:
                break  # the plan with the block did not use it: it is the prompt-lookup plan already
        forecast, sources, ks = max(plans, key=lambda x: x[0])
        return sources, ks, forecast

    def wants_context(self, req_id: str) -> bool:
        """Does this request still need its context rows in the draft cache (not stale)?"""
        return req_id not in self._stale

    @property
    def stale(self) -> set[str]:
        """Requests whose draft context was dropped or released (planned without DFlash tokens until they leave)."""
        return self._stale

    def _renew_leases(self, plan: StepPlan) -> None:
        """Count each request's decode steps without a DFlash token; release the context of those past the lease."""
        if not self.lease_steps:
            return
        B = len(plan.req_ids)
        release = (self._row_s is not None and B > 0 and self._row_s * self._step_rows
                   >= self.lease_min_share * self.cost(self._step_rows, B, B))
        for rid, src, k, t in zip(plan.req_ids, plan.sources, plan.ks, plan.lookups):
            if rid in self._stale:
                continue
            if _needs_block(src, k, t):
                self._idle[rid] = 0
                continue
            n = self._idle[rid] = self._idle.get(rid, 0) + 1
            if n >= self.lease_steps and release:
                self._stale.add(rid)
                self._idle.pop(rid, None)
                self._count("context_released")

    def observe_injection(self, rows: int, seconds: float) -> None:
        """The drafter injected `rows` context rows (fc + K/V into every draft layer) in `seconds`."""
        if rows > 0 and seconds > 0:
            r = seconds / rows
            self._row_s = r if self._row_s is None else 0.9 * self._row_s + 0.1 * r

    def context_dropped(self, req_ids) -> None:
        """The drafter dropped a step's context rows of these requests (`StepPlan.drop_context`): their draft
        context has holes from now on, so they are planned without DFlash tokens (prompt lookup only) until they
        finish. Losslessness does not depend on it (the target verifies every draft); acceptance would."""
        self._stale.update(req_ids)

    def observe_block(self, rows: int, seconds: float, injection_s: float = 0.0) -> None:
        """The draft forward of this step ran over `rows` batch rows in `seconds` (wall clock), of which
        `injection_s` injected held context rows (`deferred_context.py`). The whole time leaves the step's cost
        sample; the block's cost model is fitted on the forward alone: the held rows are injected whether or not a
        block runs (the FIFO flushes when full), and their number depends on how long no block ran, not on `rows`
        (fitted with them, the slope read 0.8 ms a row at batch 32 on a 2-core Xeon, against 0.2 for the forward)."""
        self._block_s += seconds
        self.block_cost.observe(rows, max(seconds - injection_s, 0.0))

    def propose(self, plan: StepPlan, block: np.ndarray | None) -> list[list[int]]:
        """-> draft token ids per request of the plan (variable length, possibly empty).

        block: [B, k_max] the DFlash drafts of the plan's requests (None: the draft forward did not run, which is
        only right when `plan.needs_block` is False)."""
        assert block is not None or not plan.needs_block, "the plan verifies DFlash tokens: draft the block"
        out: list[list[int]] = []
        for i, (rid, src, k) in enumerate(zip(plan.req_ids, plan.sources, plan.ks)):
            if k == 0:
                self._pending.pop(rid, None)
                out.append([])
                self._count("proposals_none")
                continue
            toks = self._tokens(src, plan.lookups[i], block[i] if block is not None else None)[:k]
            self._pending[rid] = _Pending(plan.starts[i], toks.copy(), src, _lookup_slots(src, plan.lookups[i], k))
            out.append([int(t) for t in toks])
            self._count(f"proposals_{src}")
            self._count(f"drafted_tokens_{src}", k)
        self._renew_leases(plan)
        publish_plan(self.metrics, plan.ks, self.cost, self.guard)
        return out

    # ------------------------------------------------------------------ overlap scheduling
    def plan_overlap(self, req_ids: list[str], histories: list[np.ndarray | None],
                     verified: list[tuple[int, int]], sampled: list[bool] | None = None) -> StepPlan:
        """Overlap (async) scheduling: the scheduler decides how many drafts each request verifies
        (integration/async_scheduler.py); here only the source, before the draft forward.

        histories[r]: committed tokens of request r (None: incomplete, no prompt lookup); verified[r]: (drafts the
        step just verified, drafts accepted) for the request's previous proposal; sampled: as in `plan`."""
        if sampled is not None:
            self.acceptance.mark_sampled(req_ids, sampled)
        self.score_overlap(req_ids, verified)
        lookups = [self._lookup(h) for h in histories]
        m = np.fromiter((len(t) for t in lookups), dtype=np.int64, count=len(lookups))
        sources = self._choose(self._gain_table(req_ids, m), m, fresh=self._fresh(req_ids))[0]
        ks = [0 if s == "none" else (len(t) if s == "ngram" else self.k_max) for s, t in zip(sources, lookups)]
        self._prune(req_ids)
        return StepPlan(list(req_ids), [0] * len(req_ids), lookups, sources, ks)

    def propose_overlap(self, plan: StepPlan, block: np.ndarray | None, anchors: np.ndarray) -> np.ndarray:
        """-> [B, k_max] full-length proposals (the scheduler verifies a prefix of each). A proposal shorter than
        k_max (prompt lookup alone) is padded with its last token; a request without one gets its anchor
        (anchors: [B], the token each request just sampled) repeated. Padding is only ever rejected or accepted as
        the target's own token: lossless."""
        assert block is not None or not plan.needs_block, "the plan verifies DFlash tokens: draft the block"
        out = np.empty((len(plan.req_ids), self.k_max), dtype=np.int64)
        out[:] = anchors[:, None]
        for i, (rid, src) in enumerate(zip(plan.req_ids, plan.sources)):
            if src == "none":
                continue
            toks = self._tokens(src, plan.lookups[i], block[i] if block is not None else None)
            if not len(toks):
                continue
            out[i, : len(toks)] = toks
            out[i, len(toks):] = toks[-1]
            self._pending[rid] = _Pending(0, out[i].copy(), src, _lookup_slots(src, plan.lookups[i], self.k_max))
        return out

    def score_overlap(self, req_ids: list[str], verified: list[tuple[int, int]]) -> None:
        """Score each request's pending proposal: (drafts verified this step, drafts accepted)."""
        self._steps += 1
        self._count("request_steps", len(req_ids))
        for rid, (k, a) in zip(req_ids, verified):
            p = self._pending.pop(rid, None)
            if p is not None and k > 0:
                a = max(0, min(a, k))
                self._observe(rid, p, k, a)
                self._count(f"proposals_{p.source}")
                self._count(f"drafted_tokens_{p.source}", k)
                self._count(f"accepted_tokens_{p.source}", a)

    def finished(self, req_ids) -> None:
        for rid in req_ids:
            self._pending.pop(rid, None)
            self.acceptance.forget(rid)
            self._stale.discard(rid)
            self._idle.pop(rid, None)

    # ------------------------------------------------------------------ internals
    def _lookup(self, hist: np.ndarray | None) -> np.ndarray:
        """The request's prompt-lookup continuation, [<= k_max] (empty where prompt lookup is no source)."""
        if hist is None or self.mode == "dflash":
            return np.zeros(0, dtype=np.int64)
        return prompt_lookup(hist, self.k_max, self.ngram_min, self.ngram_max)

    def _gain_table(self, req_ids: list[str], m: np.ndarray) -> dict[str, np.ndarray]:
        """P(i) (drafts 1..i all accepted) of every request's full-length proposal per source, [B, k_max] each, for
        requests with m[r] lookup tokens: a merged proposal is prompt lookup's in its first m slots and the
        block-after-lookup rates ('merged') after them. Only the sources this mode can propose."""
        names = {"dflash": ("dflash",), "ngram": ("ngram",), "merged": ("ngram", "merged")}.get(
            self.mode, ("dflash", "ngram", "merged"))
        rates = {s: self.acceptance.rates_batch(req_ids, s) for s in names}
        if "merged" in rates:
            in_lookup = np.arange(self.k_max)[None, :] < m[:, None]  # [B, k_max]
            rates["merged"] = np.where(in_lookup, rates["ngram"], rates["merged"])
        return {s: np.cumprod(np.clip(r, 0.0, 1.0), axis=1) for s, r in rates.items()}

    def _choose(self, table: dict[str, np.ndarray], m: np.ndarray, block: bool = True,
                fresh: np.ndarray | None = None) -> tuple[list[str], np.ndarray]:
        """Per request, the candidate (`_candidates`: source and proposal length) with the largest expected accepted
        length Σ P(i) (it depends only on the proposal's length, so the choice precedes the draft forward); the
        first in candidate order on ties, 'none' when none expects any token. table: `_gain_table`; fresh: [B] bool,
        False for a request whose draft context has holes (`context_dropped`): only candidates without DFlash tokens
        for it. -> (sources, [B, k_max] P(i) of each chosen proposal, zero past its length and for 'none')."""
        B, K = len(m), self.k_max
        cands = self._candidates(block)
        free = None  # where some request is stale: (source, length) of the candidates that need no draft forward
        if fresh is not None and block and not fresh.all():
            free_cands, have = self._candidates(False), {c[:2] for c in cands}
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

    def _candidates(self, block: bool = True) -> list[tuple]:
        """(source, proposal length: 'k' = k_max or 'm' = the lookup's, which requests may propose it: m -> [B] bool)
        in preference order. Under 'both' the merge is a candidate of its own only where it differs from both parts
        (0 < m < k_max). block=False: only what needs no draft forward (the lookup's own tokens)."""
        K = self.k_max
        any_m, always = (lambda m: m > 0), (lambda m: np.ones(len(m), dtype=bool))
        if not block:
            if self.mode == "dflash":
                return []
            return [("ngram" if self.mode in ("both", "ngram") else "merged", "m", any_m)]
        if self.mode == "dflash":
            return [("dflash", "k", always)]
        if self.mode == "ngram":
            return [("ngram", "m", any_m)]
        if self.mode == "merged":
            return [("merged", "k", always)]
        return [("dflash", "k", always), ("ngram", "m", any_m), ("merged", "k", lambda m: (m > 0) & (m < K))]

    def _fresh(self, req_ids: list[str]) -> np.ndarray | None:
        """[B] bool: the request's draft context is whole (None: every request's is, the common case)."""
        if not self._stale:
            return None
        return np.fromiter((r not in self._stale for r in req_ids), dtype=bool, count=len(req_ids))

    def _tokens(self, src: str, lookup: np.ndarray, block: np.ndarray | None) -> np.ndarray:
        """The full proposal of a source: [k_max] (prompt lookup alone: [m]). Without a block (only possible on a TP
        rank whose own plan differed from the adopted one, which would be a bug; that rank's drafts are dropped) a
        DFlash proposal is empty."""
        if src == "dflash":
            return block if block is not None else np.zeros(0, dtype=np.int64)
        if src == "ngram":
            return lookup
        return merge(lookup, block, self.k_max)

    def _prune(self, req_ids: list[str]) -> None:
        """Every 64 steps: drop the state of requests that left the batch (finished, aborted, preempted)."""
        if self._steps % 64 == 0:
            # every request with state here
            known = (set(self.acceptance.req) | self.acceptance.sampled | set(self._pending) | self._stale
                     | set(self._idle))
            self.finished(known - set(req_ids))

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
            self._observe(rid, p, len(p.tokens), accepted)
            self._count(f"accepted_tokens_{p.source}", accepted)
            total += accepted
        return total

    def _observe(self, rid: str, p: _Pending, drafted: int, accepted: int) -> None:
        """A verified proposal into the acceptance model: a merged one's lookup slots as prompt lookup, its block
        slots after them as 'merged' (by slot); any other under its own source."""
        if p.source == "merged" and p.lookup > 0:
            m = min(p.lookup, drafted)
            self.acceptance.observe(rid, "ngram", m, min(accepted, m))
            self.acceptance.observe(rid, "merged", drafted, accepted, start=m)
        else:
            self.acceptance.observe(rid, p.source, drafted, accepted)

    def _count(self, name: str, n: float = 1.0) -> None:
        if self.metrics is not None:
            self.metrics.inc(name, n)
