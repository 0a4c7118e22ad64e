# SPDX-License-Identifier: Apache-2.0
"""The adaptive-drafting policy, free of vLLM: acceptance estimates, an online step-cost model, and the planner
that turns both into per-request draft lengths.

Model. Verifying a step of B requests that feeds the target n query tokens costs T(n, B) = alpha + beta * n +
delta * B seconds (fitted online from measured step times; on CPU the verify cost grows with the tokens fed, on GPU it
is flat until compute-bound, which the fit also captures as beta ~ 0). A request drafting k tokens yields
1 + sum_{i<=k} P(i) tokens, P(i) the probability that the first i drafts are all accepted. The planner picks the k of
every request that maximises tokens per second of the whole step: sum_r (1 + sum_{i<=k_r} P_r(i)) /
T(sum_r (1 + k_r), B).

Because P_r(i) falls with i, the best plan takes the globally largest marginal gains first: sort every
(request, position) gain, evaluate every prefix, keep the best (O(N log N) for N = batch * k_max, as array
operations over the whole batch: the planner runs on every step, at every batch size).

The pieces: `AcceptanceModel` (adaptive/acceptance.py), `StepCostModel` / `SplitStepCost` (adaptive/step_cost.py),
`SpeculationGuard` (adaptive/guard.py); this module holds the planner and re-exports them.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from vllm_dflash.adaptive.acceptance import SOURCES, AcceptanceModel, cumulative_acceptance  # noqa: F401 (re-exported)
from vllm_dflash.adaptive.guard import (MIN_MARGIN, SURE_SPEEDUP, SpeculationGuard,  # noqa: F401 (re-exported)
                                        batch_bucket, guard_for)
from vllm_dflash.adaptive.sources import candidates
from vllm_dflash.adaptive.step_cost import SplitStepCost, StepCostModel  # noqa: F401 (re-exported)


def gain_matrix(gains) -> np.ndarray:
    """gains as `plan_lengths` takes them -> [B, K] float64, zero past each request's proposal (a list of ragged
    arrays is padded; a 2-D array is used as it is)."""
    if isinstance(gains, np.ndarray) and gains.ndim == 2:
        return gains.astype(np.float64, copy=False)
    K = max((len(g) for g in gains), default=0)
    out = np.zeros((len(gains), K))
    for r, g in enumerate(gains):
        out[r, : len(g)] = g
    return out


def plan_lengths(gains, cost: StepCostModel, extra_tokens: int = 0, token_cost=None) -> list[int]:
    """Draft length per request maximising expected tokens per second of the step.

    gains[r][i] = P_r(i+1): probability that drafts 1..i+1 of request r are all accepted (non-increasing in i); a
    list of arrays (request r may verify up to len(gains[r]) drafts) or a [B, K] array, zero where request r has
    no draft. extra_tokens: query tokens of the step that are not decodes (e.g. prefill chunks). token_cost: [B]
    seconds each draft of request r adds beyond the step-cost model (a sampled request's verification, which the
    model's fit does not see per request; None: 0). Returns k_r per request (0 = no speculation for that request).

    Every (request, position) gain sorted in decreasing order (stable: request-major on ties), every prefix valued
    at once; the first best prefix wins. A zero gain never joins a plan (it adds cost, not tokens), so the padding
    of ragged gains changes nothing."""
    G = gain_matrix(gains)  # [B, K]
    B, K = G.shape
    if B == 0:
        return []
    flat = G.ravel()  # request-major, as the per-request lists
    if token_cost is None:
        order = np.argsort(-flat, kind="stable")
        extra = 0.0
    else:
        # drafts priced differently: the best plan takes drafts by gain per second (a fractional objective's optimum
        # is a threshold on gain / cost), which keeps each request's drafts in order (same price, falling gains)
        tc = np.repeat(np.asarray(token_cost, np.float64), K)  # [B * K]
        price = cost.beta + tc
        ratio = np.where(price > 0, flat / np.where(price > 0, price, 1.0), np.inf)
        ratio[flat <= 0] = -1.0  # a zero gain (padding past a proposal) never comes before a real one
        order = np.lexsort((-flat, -ratio))  # by ratio, then gain; stable (request-major) on ties
        extra = np.cumsum(tc[order])
    n0 = float(B + extra_tokens)
    drafted = np.arange(1, flat.size + 1, dtype=np.float64)
    vals = np.empty(flat.size + 1)
    tokens = B + np.cumsum(flat[order])  # [B * K] expected tokens of each prefix
    vals[0] = B / cost(n0, B, B)
    vals[1:] = tokens / (cost(n0 + drafted, B, tokens) + extra)
    best_m = int(np.argmax(vals))  # the first maximum: a longer plan must be strictly better
    return np.bincount(order[:best_m] // max(K, 1), minlength=B).tolist()


def predicted_speedup(gains, ks: list[int], cost: StepCostModel, extra_tokens: int = 0,
                      fixed_seconds: float = 0.0, token_cost=None) -> float:
    """The models' own forecast for a plan: expected output tokens/s of the step with lengths ks over the same step
    without drafts (1.0: no gain). gains as for `plan_lengths`; fixed_seconds: a cost the plan adds whatever its
    lengths (the draft forward, when some request verifies DFlash tokens); token_cost as for `plan_lengths`."""
    G = gain_matrix(gains)
    B, K = G.shape
    if B == 0:
        return 1.0
    n0 = float(B + extra_tokens)
    k = np.asarray(ks)
    drafted = int(k.sum())
    tokens = B + float(G[np.arange(K)[None, :] < k[:, None]].sum())
    extra = 0.0 if token_cost is None else float(np.dot(k, np.asarray(token_cost, np.float64)))
    return ((tokens / (cost(n0 + drafted, B, tokens) + extra + (fixed_seconds if drafted else 0.0)))
            / (B / cost(n0, B, B)))


def declare_metrics(metrics, mode: str, k_max: int, cross: bool = False, lease: bool = False) -> None:
    """The series an `AdaptiveController` of this mode counts, exported at 0 from the start (serve/metrics.py
    `MetricsSink.declare`; None: nothing): the sources the mode can propose (`sources.candidates`), no speculation,
    cross lookups and context releases where they are on (cross, lease)."""
    if metrics is None:
        return
    metrics.declare("request_steps", "draft_tokens_per_request", *(["cross_lookups"] if cross else []),
                    *(["context_released"] if lease else []))
    metrics.declare("proposals", source="none")
    for src in dict.fromkeys(c[0] for c in candidates(mode, k_max)):
        for name in ("proposals", "drafted_tokens", "accepted_tokens"):
            metrics.declare(name, source=src)


def publish_plan(metrics, ks: list[int], cost: StepCostModel, guard: SpeculationGuard) -> None:
    """One step's plan into the metrics (any object with observe/set; None: nothing): the chosen lengths, the
    current step-cost fit and the guard's measured rates. Shared by the drafter's and the scheduler's planners."""
    if metrics is None:
        return
    for k, n in Counter(ks).items():  # one histogram call per distinct length (one a request: 0.07 ms at c32)
        metrics.observe("draft_tokens_per_request", float(k), n)
    metrics.set("cost_fixed_seconds", cost.alpha)
    metrics.set("cost_per_token_seconds", cost.beta)
    metrics.set("cost_per_request_seconds", cost.delta)
    metrics.set("cost_per_output_token_seconds", cost.gamma)
    for arm in guard.ARMS:
        if guard.rate[arm] is not None:
            metrics.set("guard_tokens_per_second", guard.rate[arm], arm=arm)
