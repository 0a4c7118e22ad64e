# SPDX-License-Identifier: Apache-2.0
"""`LengthPlanner`: adaptive draft lengths decided in the scheduler, for overlap (async) scheduling.

Under async scheduling vLLM's scheduler reserves each request's draft slots (placeholders) for step N+1 while step N
is still running, so the number of drafts a request verifies is the scheduler's choice, not the drafter's (see
docs/ADAPTIVE.md). This class is that choice, free of vLLM:

- **Acceptance** per request and position, from what the scheduler sees in each step's output: k drafts were
  verified and the request produced g tokens, so g - 1 drafts were accepted. It does not see which source (DFlash
  block or prompt lookup) the drafter used, so it keeps the rates per *context* instead: whether prompt lookup finds
  a match in the request's tokens as the scheduler knows them (`CONTEXTS`; two steps behind the drafter's view).
  On code a copy span lasts many steps, so a match there predicts a long accepted prompt-lookup proposal, and no
  match predicts the DFlash block's (lower) acceptance.
- **Step cost** T(n, B, m) = alpha + beta * n + delta * B + gamma * m from the time between consecutive step
  outputs (under overlap the worker runs steps back to back, so that gap is the step's duration), the tokens the
  step scheduled, its requests and the tokens it produced.
- **Plan**: `plan_lengths` over every decoding request, then a `SpeculationGuard` per batch-size bucket that
  compares realised output tokens/s against no speculation, as in the synchronous controller.

Outcomes arrive two steps after the plan that caused them (the scheduler plans step N+1 before it has processed
step N-1's output); each step's decision (bucket, arm) travels with it so the guard scores the arm that ran."""
from __future__ import annotations

import time

import numpy as np

from vllm_dflash.adaptive.acceptance import AcceptanceModel, cumulative_acceptance
from vllm_dflash.adaptive.guard import SURE_SPEEDUP, SpeculationGuard, batch_bucket, guard_for
from vllm_dflash.adaptive.policy import plan_lengths, predicted_speedup, publish_plan
from vllm_dflash.adaptive.step_cost import StepCostModel

ANY = "any"  # context when prompt lookup is not a source (adaptive "dflash")
CONTEXTS = {"match": 0.7, "nomatch": 0.5, ANY: 0.6}  # priors, as the drafter's per-source ones


class LengthPlanner:
    def __init__(self, k_max: int, metrics=None, clock=time.perf_counter, guard_threshold: float = SURE_SPEEDUP,
                 guard_margin: float | str = "noise", guard_confirm: bool = True):
        self.k_max = k_max
        self.guard_threshold = guard_threshold  # the guards' sure_speedup (setting guard_threshold)
        self.guard_margin = guard_margin  # setting guard_margin
        self.guard_confirm = guard_confirm  # setting guard_confirm
        self.acceptance = AcceptanceModel(k_max, prior=dict(CONTEXTS))
        self.cost = StepCostModel(per_output=True)
        self.guards: dict[int, SpeculationGuard] = {}
        self.metrics, self.clock = metrics, clock
        if metrics is not None:  # what this planner counts, at 0 from the start (serve/metrics.py `declare`)
            metrics.declare("draft_tokens_per_request")
            metrics.declare("proposals", source="none")
        self._last_t: float | None = None
        self._steps = 0

    def guard(self, bucket: int) -> SpeculationGuard:
        return guard_for(self.guards, bucket, self.guard_threshold, self.guard_margin, self.guard_confirm)

    def observe(self, decision: tuple | None, outcomes: list[tuple[str, int, int]], num_tokens: int,
                tokens_out: int, decode_only: bool, num_reqs: int = 0) -> None:
        """One step's output. decision: (bucket, arm, {req_id: context}) of the plan that set its drafts (None:
        unknown);
        outcomes: (req_id, drafts verified, drafts accepted) per request that verified drafts; num_tokens: query
        tokens the step fed the target; tokens_out: tokens it produced; decode_only: no prefill chunk in it;
        num_reqs: requests in the step (0: unknown, the step cost is then fitted on num_tokens alone)."""
        now = self.clock()
        dt = None if self._last_t is None else now - self._last_t
        self._last_t = now
        ctx = decision[2] if decision is not None else {}
        for rid, k, a in outcomes:
            self.acceptance.observe(rid, ctx.get(rid, ANY), k, max(0, min(a, k)))
        if (dt is None or not decode_only or num_tokens <= 0
                or dt > 10 * self.cost(num_tokens, num_reqs, tokens_out) + 0.05):
            return  # a prefill step's time is not a decode cost; a long gap is idle time, not a step
        self.cost.observe(num_tokens, dt, num_reqs, tokens_out)
        if decision is not None:
            bucket, arm, _ = decision
            self.guard(bucket).record(tokens_out, dt, arm=arm)

    def plan(self, req_ids: list[str], extra_tokens: int = 0,
             contexts: list[str] | None = None, sampled: list[bool] | None = None) -> tuple[list[int], tuple]:
        """Drafts each decoding request verifies next step; contexts[r] in CONTEXTS (default ANY); sampled[r]: the
        request samples (temperature > 0), so its rates come from sampled requests (`AcceptanceModel`).
        -> (k per request, the decision (bucket, arm, {req_id: context}) to hand back to `observe`)."""
        self._steps += 1
        if sampled is not None:
            self.acceptance.mark_sampled(req_ids, sampled)
        contexts = contexts or [ANY] * len(req_ids)
        bucket = batch_bucket(len(req_ids))
        g = self.guard(bucket)
        if not req_ids:
            ks = []
        else:
            gains = [cumulative_acceptance(self.acceptance.rates(r, c), self.k_max) for r, c in zip(req_ids, contexts)]
            ks = plan_lengths(gains, self.cost, extra_tokens=extra_tokens)
            g.predict(predicted_speedup(gains, ks, self.cost, extra_tokens))  # the forecast, in either arm
            if g.arm == "off":
                ks = [0] * len(req_ids)
        self._count("proposals", sum(1 for k in ks if k == 0), source="none")
        publish_plan(self.metrics, ks, self.cost, g)
        return ks, (bucket, g.arm, dict(zip(req_ids, contexts)))

    def forget(self, live_req_ids) -> None:
        """Drop the state of requests that are gone (call now and then with the live ids)."""
        live = set(live_req_ids)
        for rid in [r for r in set(self.acceptance.req) | self.acceptance.sampled if r not in live]:
            self.acceptance.forget(rid)

    def _count(self, name: str, n: float = 1.0, **labels: str) -> None:
        if self.metrics is not None and n:
            self.metrics.inc(name, n, **labels)


def expected_accepted(planner: LengthPlanner, req_id: str, k: int, context: str = ANY) -> float:
    """E[accepted drafts] of request `req_id` verifying k drafts in `context` (for tests and logs)."""
    return float(np.sum(cumulative_acceptance(planner.acceptance.rates(req_id, context), k)))
