# SPDX-License-Identifier: Apache-2.0
"""`AdaptiveController`: per step, per request, which proposal and how many of its tokens the target verifies
(0 = no speculation for that request).

Sources (`acceptance.SOURCES`): the DFlash block, the prompt-lookup continuation (adaptive/ngram.py), and the two merged:
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
(adaptive/lengths.py) and this controller only picks each request's source. The pieces it steps: `StepPlan`
(adaptive/step_plan.py), the source choice (adaptive/sources.py), the models, planner and guard (adaptive/policy.py).

Tensor parallelism: every TP rank runs its own controller on the same tokens, but the step-cost model and the guard
read the rank's own wall clock, so two ranks can plan differently; the draft forward holds collectives, so the ranks
must agree on whether it runs. The drafter therefore sends TP rank 0's plan to every rank after `plan` and before the
forward (`StepPlan.encode` / `StepPlan.adopt`; integration/tp_plan.py `sync_plan_across_tp`)."""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from vllm_dflash.adaptive.acceptance import AcceptanceModel
from vllm_dflash.adaptive.cross_lookup import ONE_TENANT, CrossRequestIndex
from vllm_dflash.adaptive.guard import SURE_SPEEDUP, SpeculationGuard, batch_bucket, guard_for
from vllm_dflash.adaptive.idle_plans import IdlePlanBackoff
from vllm_dflash.adaptive.ngram import prompt_lookup
from vllm_dflash.adaptive.policy import declare_metrics, plan_lengths, predicted_speedup, publish_plan
from vllm_dflash.adaptive.sources import choose, gain_table, merge, proposal_tokens  # noqa: F401 (merge: re-exported)
from vllm_dflash.adaptive.step_cost import SplitStepCost, StepCostModel, refresh_young
from vllm_dflash.adaptive.step_plan import PLAN_SOURCES, StepPlan, history_lengths, lookup_slots, uses_block  # noqa: F401 (re-exported)
from vllm_dflash.adaptive.trace import open_trace, trace_step

MODES = ("both", "dflash", "ngram", "merged")  # both: choose among dflash, ngram and merged per request-step


@dataclass
class _Pending:
    start: int  # len(history) when proposed: the drafts predict history[start:start + len(tokens)]
    tokens: np.ndarray
    source: str
    lookup: int = 0  # merged: how many of the tokens came from prompt lookup (slots 0..lookup-1)
    cross: bool = False  # the lookup tokens came from other requests' (scored as 'cross', not 'ngram')


class AdaptiveController:
    def __init__(self, k_max: int, mode: str = "both", ngram_min: int = 2, ngram_max: int = 4, metrics=None,
                 clock=time.perf_counter, split_cost: bool = False,
                 guard_threshold: float = SURE_SPEEDUP, guard_margin: float | str = "noise",
                 guard_confirm: bool = True, reexplore_steps: float = 32.0, cross_lookup: int = 0):
        if mode not in MODES:
            raise ValueError(f"adaptive mode {mode!r}: expected one of {MODES}")
        self.k_max, self.mode = k_max, mode
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        # setting cross_lookup: other requests' tokens, the lookup's fallback (adaptive/cross_lookup.py; None: off)
        self.cross = CrossRequestIndex(cross_lookup) if cross_lookup > 0 and mode != "dflash" else None
        self._from_cross: set[str] = set()  # requests whose lookup this step came from `cross`
        # request id -> its tenant in `cross` (a request only draws on its own tenant's tokens; None: isolation
        # unknown, no cross lookup for it). Unset: one tenant. The drafter keys by cache_salt and LoRA adapter
        self.tenant_of: Callable[[str], Hashable | None] | None = None
        # setting reexplore_steps: a request's own record of a source halves every that many steps it verified none
        self.acceptance = AcceptanceModel(k_max, idle_decay=0.5 ** (1.0 / reexplore_steps) if reexplore_steps > 0
                                          else 1.0)
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
        self.idle_plans = IdlePlanBackoff()  # buckets whose plans keep drafting nothing plan every 4th step
        self.trace = open_trace()  # DFLASH_TRACE: one record per step (adaptive/trace.py), else None
        declare_metrics(metrics, mode, k_max, cross=self.cross is not None, lease=self.lease_steps > 0)

    @property
    def guard(self) -> SpeculationGuard:
        """The guard of the current batch-size bucket."""
        return guard_for(self.guards, self._bucket, self.guard_threshold, self.guard_margin, self.guard_confirm)

    # ------------------------------------------------------------------ synchronous scheduling
    def plan(self, req_ids: list[str], histories: Sequence[np.ndarray], query_tokens: int, decode_only: bool,
             extra_tokens: int = 0, forward_s: float | None = None, sampled: list[bool] | None = None) -> StepPlan:
        """Sources and lengths of this step, before the draft forward.

        histories[r]: committed tokens of request r (prompt + output, newest last); query_tokens: tokens the target
        was fed in the step just verified; decode_only: that step had no prefill chunk (its time is a clean cost
        sample); extra_tokens: prefill tokens likely to share the next step; forward_s: that step's target forward
        time (with `split_cost`; None: unknown, the step is then not a cost sample); sampled: per request, whether it
        samples (temperature > 0): its acceptance is estimated from sampled requests' rates (`AcceptanceModel`)."""
        now = self.clock()
        self.acceptance.tick()
        if sampled is not None:
            self.acceptance.mark_sampled(req_ids, sampled)
        accepted = self._score_previous(req_ids, histories)
        produced = len(req_ids) + accepted  # tokens of the step just verified: one per request plus accepted drafts
        dt = None
        if self._last_t is not None and decode_only and query_tokens > 0:
            dt = now - self._last_t - self._block_s
            if dt < 10 * self.cost(query_tokens, len(req_ids), produced) + 0.05:  # an idle gap is not a step cost
                # the step just verified; the fit is solved when a plan weighs drafts (`_best_plan`), so a step
                # that plans nothing (the guard's measured 'off') solves none (0.23 ms a step at c32 on the EPYC)
                if isinstance(self.cost, SplitStepCost):
                    self.cost.observe(query_tokens, dt, len(req_ids), produced, forward_s, solve=False)
                else:
                    self.cost.observe(query_tokens, dt, len(req_ids), produced, solve=False)
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
        # a bucket whose recent plans drafted nothing plans every few steps only (`IdlePlanBackoff`; not on a TP
        # follower rank, which keeps its lookups for rank 0's plan)
        idle_skip = self.skip_when_off and self.guard.arm == "plan" and self.idle_plans.skip(self._bucket)
        skip = idle_skip or self.skip_when_off and self.guard.arm == "off" and self.guard.rate["off"] is not None
        if skip:
            # measured: no speculation is faster here (or being re-measured). The forecast only steers the guard
            # before 'off' was measured, so nothing is planned: no lookups, no planning cost at any batch size.
            empty = np.zeros(0, dtype=np.int64)
            plan = StepPlan(list(req_ids), history_lengths(histories), [empty] * B, ["none"] * B, [0] * B,
                            drop_context=not idle_skip and self.guard.best == "off")
        else:
            lookups = [self._lookup(r, h) for r, h in zip(req_ids, histories)]
            sources, ks, forecast = self._best_plan(req_ids, lookups, extra_tokens)
            self.guard.predict(forecast)
            self.idle_plans.planned(self._bucket, drafted=sum(ks) > 0)
            if self.guard.arm == "off":  # 'off' being measured for the first time
                sources, ks = ["none"] * B, [0] * B
            plan = StepPlan(list(req_ids), history_lengths(histories), lookups, sources, ks)
        if self.trace is not None:
            trace_step(self, plan, q=query_tokens, out=produced, dt=dt, fwd=forward_s, blk=block_s,
                       plan_s=self.clock() - now, decode=decode_only, extra=extra_tokens, planned=not skip,
                       idle_skip=idle_skip)
        return plan

    def _best_plan(self, req_ids: list[str], lookups: list[np.ndarray],
                   extra_tokens: int) -> tuple[list[str], list[int], float]:
        """Sources and lengths of the step, and their forecast speed-up over no speculation. The draft forward is a
        cost of the whole step, paid once if any request verifies a DFlash token: the best plan with the block is
        weighed against the best plan from prompt lookup alone, each with its full cost.
        -> (sources, lengths, forecast)."""
        refresh_young(self.cost)  # a young fit is solved here; an older one by `observe`, every 16th sample
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
            n_block = sum(uses_block(s, k, t) for s, k, t in zip(sources, ks, lookups))  # requests using it
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
            if uses_block(src, k, t):
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
        proposals, drafted = Counter(), Counter()  # counted once per source and step (a call a request: 0.1 ms, c32)
        pending = self._pending
        for i, (rid, src, k) in enumerate(zip(plan.req_ids, plan.sources, plan.ks)):
            if k == 0:
                pending.pop(rid, None)
                out.append([])
                proposals["none"] += 1
                continue
            toks = proposal_tokens(src, plan.lookups[i], block[i] if block is not None else None, self.k_max)[:k]
            pending[rid] = _Pending(plan.starts[i], toks.copy(), src, lookup_slots(src, plan.lookups[i], k),
                                    rid in self._from_cross)
            out.append([int(t) for t in toks])
            proposals[src] += 1
            drafted[src] += k
        for name, by_source in (("proposals", proposals), ("drafted_tokens", drafted)):
            for src, n in by_source.items():
                self._count(name, n, source=src)
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
        self.acceptance.tick()
        if sampled is not None:
            self.acceptance.mark_sampled(req_ids, sampled)
        self.score_overlap(req_ids, verified)
        lookups = [self._lookup(r, h) for r, h in zip(req_ids, histories)]
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
            toks = proposal_tokens(src, plan.lookups[i], block[i] if block is not None else None, self.k_max)
            if not len(toks):
                continue
            out[i, : len(toks)] = toks
            out[i, len(toks):] = toks[-1]
            self._pending[rid] = _Pending(0, out[i].copy(), src, lookup_slots(src, plan.lookups[i], self.k_max),
                                          rid in self._from_cross)
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
                self._count("proposals", source=p.source)
                self._count("drafted_tokens", k, source=p.source)
                self._count("accepted_tokens", a, source=p.source)

    def finished(self, req_ids) -> None:
        if self.cross is not None:
            self.cross.finish(req_ids)
        for rid in req_ids:
            self._pending.pop(rid, None)
            self._from_cross.discard(rid)
            self.acceptance.forget(rid)
            self._stale.discard(rid)
            self._idle.pop(rid, None)

    # ------------------------------------------------------------------ internals
    def _lookup(self, req_id: str, hist: np.ndarray | None) -> np.ndarray:
        """The request's prompt-lookup continuation, [<= k_max] (empty where prompt lookup is no source): in its own
        history, else (with `cross`) in other requests' tokens, which it then indexes its own new tokens into."""
        if hist is None or self.mode == "dflash":
            return np.zeros(0, dtype=np.int64)
        own = prompt_lookup(hist, self.k_max, self.ngram_min, self.ngram_max)
        if self.cross is None:
            return own
        tenant = ONE_TENANT if self.tenant_of is None else self.tenant_of(req_id)
        if tenant is None:  # its tenant is not known: neither drafted from others' tokens nor indexed
            self._from_cross.discard(req_id)
            return own
        found = own if len(own) else self.cross.lookup(hist, self.k_max, tenant)
        if len(found) and found is not own:
            self._count("cross_lookups")
            self._from_cross.add(req_id)
        else:
            self._from_cross.discard(req_id)
        self.cross.observe(req_id, hist, tenant)
        return found

    def _gain_table(self, req_ids: list[str], m: np.ndarray) -> dict[str, np.ndarray]:
        """`sources.gain_table` of this controller's mode: P(i) per source, [B, k_max] each."""
        cross = None
        if self._from_cross:
            cross = np.fromiter((r in self._from_cross for r in req_ids), dtype=bool, count=len(req_ids))
        return gain_table(self.acceptance, self.mode, self.k_max, req_ids, m, cross)

    def _choose(self, table: dict[str, np.ndarray], m: np.ndarray, block: bool = True,
                fresh: np.ndarray | None = None) -> tuple[list[str], np.ndarray]:
        """`sources.choose` of this controller's mode: (sources, [B, k_max] P(i) of each chosen proposal)."""
        return choose(table, m, self.mode, self.k_max, block, fresh)

    def _fresh(self, req_ids: list[str]) -> np.ndarray | None:
        """[B] bool: the request's draft context is whole (None: every request's is, the common case)."""
        if not self._stale:
            return None
        return np.fromiter((r not in self._stale for r in req_ids), dtype=bool, count=len(req_ids))

    def _prune(self, req_ids: list[str]) -> None:
        """Every 64 steps: drop the state of requests that left the batch (finished, aborted, preempted). Every
        step, their cross-lookup documents are marked finished (evicted first: `CrossRequestIndex.finish`)."""
        if self.cross is not None and self.cross.live:
            batch = set(req_ids)
            self.cross.finish([r for r in self.cross.live if r not in batch])
        if self._steps % 64 == 0:
            # every request with state here
            known = (set(self.acceptance.req) | self.acceptance.sampled | set(self._pending) | self._stale
                     | set(self._idle))
            self.finished(known - set(req_ids))

    def _score_previous(self, req_ids: list[str], histories: Sequence[np.ndarray]) -> int:
        """Score each request's previous proposal; returns the accepted draft tokens of the step just verified."""
        if not self._pending:
            return 0
        accepted_by = Counter()  # counted once per source and step
        for j, rid in enumerate(req_ids):
            p = self._pending.pop(rid, None)
            hist = histories[j] if p is not None else None  # built only here (a lazy `Histories`)
            if hist is None or len(hist) <= p.start:
                continue  # no proposal, or not verified since (e.g. preempted): no outcome
            seen = hist[p.start: p.start + len(p.tokens)]
            m = min(len(seen), len(p.tokens))
            eq = seen[:m] == p.tokens[:m]
            accepted = int(m if eq.all() else np.argmin(eq))
            accepted = min(accepted, len(hist) - p.start - 1)  # the last history token is the bonus, not a draft
            self._observe(rid, p, len(p.tokens), accepted)
            accepted_by[p.source] += accepted
        for src, n in accepted_by.items():
            self._count("accepted_tokens", n, source=src)
        return sum(accepted_by.values())

    def _observe(self, rid: str, p: _Pending, drafted: int, accepted: int) -> None:
        """A verified proposal into the acceptance model: a merged one's lookup slots as prompt lookup, its block
        slots after them as 'merged' (by slot); any other under its own source."""
        lookup = "cross" if p.cross else "ngram"  # a lookup from other requests' tokens has its own rates
        if p.source == "merged" and p.lookup > 0:
            m = min(p.lookup, drafted)
            self.acceptance.observe(rid, lookup, m, min(accepted, m))
            self.acceptance.observe(rid, "merged", drafted, accepted, start=m)
        else:
            self.acceptance.observe(rid, lookup if p.source == "ngram" else p.source, drafted, accepted)

    def _count(self, name: str, n: float = 1.0, **labels: str) -> None:
        if self.metrics is not None:
            self.metrics.inc(name, n, **labels)
