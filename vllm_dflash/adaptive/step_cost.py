# SPDX-License-Identifier: Apache-2.0
"""The online step-cost models of adaptive drafting, free of vLLM: T(n, B, m) seconds of a step feeding the target
n query tokens for B requests that produces m tokens, fitted from measured step times (`StepCostModel`), or as the
target forward plus the rest of the step (`SplitStepCost`)."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

SOLVE_EVERY = 16  # `observe(solve=False)`: the fit is still solved every this many samples
YOUNG_FIT = 32  # `refresh_young`: below this many samples a planning step solves the fit itself


@dataclass
class StepCostModel:
    """Online least squares fit of step time T(n, B, m) = alpha + beta * n + delta * B (+ gamma * m): n query tokens
    fed to the target, B requests in the step, m tokens the step produced. beta is what one more draft token costs;
    delta what a request costs beyond its query tokens (its attention over its own context, sampling, a streamed
    chunk); gamma (with `per_output`) what each produced token costs wherever it is produced (output processing,
    detokenizing and streaming, which on a small CPU share the cores and land in the engine's step time).

    One slope per query token (delta = 0) charges per-request cost to draft tokens wherever the batch size moves with
    n (a batch draining while its draft lengths stay alike), so drafts look dearer than they are and the planner cuts
    proposals that pay (tests/unit/test_adaptive_policy.py: 2.5x the true slope). Where a request costs nothing
    beyond its tokens, delta fits to 0 and this is the one-slope model (the bf16 EPYC at concurrency 32). Likewise
    without gamma, per-produced-token work is charged to the draft tokens that produced it (accepted tokens grow with
    drafted ones): served at concurrency 32 on a 2-core Xeon the fit read 0.47-0.51 ms a query token against 0.33 ms
    in process, and the planner drafted less than vLLM's n-gram there.

    Exponentially weighted normal equations (forgetting factor `forget` per observation) with a ridge toward the
    initial values: `prior_weight` pseudo observations per parameter (at the scale of a spread of 16 in n, B and m),
    fading like the data down to a floor of `ridge_floor` of that. The floor keeps a direction the data leave open (a
    batch that never changes size, n that never moves) at the prior without biasing the rest; the slopes are kept
    >= 0 (a step never gets cheaper with more tokens or requests). Units: seconds.
    Callers that pass no num_reqs fit and evaluate the one-slope model T(n) = alpha + beta * n."""

    alpha: float = 0.03
    beta: float = 0.002
    delta: float = 0.0
    gamma: float = 0.0
    per_output: bool = False  # fit gamma from the produced tokens `observe` is given (else gamma stays as set)
    forget: float = 0.98
    prior_weight: float = 2.0
    ridge_floor: float = 0.01
    # a sample above max_ratio x the fit's prediction (after `warmup` samples) enters as max_ratio x the prediction:
    # a stall of the host (a garbage collection, the API server's burst on the same cores) is not a step cost, and
    # one 288 ms step among 50 ms ones moved the slope of a served fit from 0.6 to 1.5 ms a query token
    max_ratio: float = 3.0
    warmup: int = 8
    num_obs: int = 0

    def __post_init__(self):
        p = self._p = 4 if self.per_output else 3  # parameters fitted: (alpha, beta, delta[, gamma])
        self._theta0 = np.array([self.alpha, self.beta, self.delta, self.gamma][:p])  # [p] the prior
        self._ridge = self.prior_weight * np.array([1.0] + [16.0 ** 2] * (p - 1))  # [p] diagonal
        # Python floats, not numpy: `observe` runs after every step, where numpy's per-call overhead was most of it
        self._xtx = [[0.0] * p for _ in range(p)]  # [p][p] weighted sum of x x^T, x = [1, n, B(, m)]
        self._xty = [0.0] * p  # [p] weighted sum of x * t
        self._unsolved = False  # observations since the last solve (`refresh`)
        # the sets of free slopes tried when the unconstrained fit has a negative one: all of them first, then
        # every smaller subset (alpha is always free)
        slopes = range(1, p)
        self._subsets = [(0,) + c for r in range(p - 1, -1, -1) for c in itertools.combinations(slopes, r)]

    def observe(self, n_tokens: int, seconds: float, num_reqs: int = 0, out_tokens: int = 0,
                solve: bool = True) -> None:
        """One step: n_tokens query tokens, num_reqs requests, out_tokens tokens it produced (used with
        `per_output`), `seconds` long. solve=False: the fit's parameters keep their values until `refresh` or the
        next 16th observation (a caller that reads them only now and then skips most solves; the clipping of outliers
        uses them as they are)."""
        if seconds <= 0 or n_tokens <= 0:
            return
        if self.num_obs >= self.warmup:
            seconds = min(seconds, self.max_ratio * self(n_tokens, num_reqs, out_tokens))
        x = (1.0, float(n_tokens), float(num_reqs), float(out_tokens))[: self._p]
        f, xtx, xty = self.forget, self._xtx, self._xty
        for i, xi in enumerate(x):
            row = xtx[i]
            for j, xj in enumerate(x):
                row[j] = row[j] * f + xi * xj
            xty[i] = xty[i] * f + xi * seconds
        self.num_obs += 1
        self._unsolved = True
        if solve or self.num_obs % SOLVE_EVERY == 0:  # unsolved: still every 16th, so the clipping's fit stays current
            self.refresh()

    def refresh(self) -> None:
        """Solve the fit for the observations so far, if any came since the last solve."""
        if not self._unsolved:
            return
        self._unsolved = False
        th = self._solve()
        self.alpha, self.beta, self.delta = th[0], th[1], th[2]
        if self.per_output:
            self.gamma = th[3]

    def _solve(self) -> list[float]:
        """Ridge least squares with every slope >= 0: the unconstrained optimum if feasible, else the best of the
        fits with the offending slopes held at 0 (3 parameters: at most four small solves; 4: at most eight).

        Plain Python floats (`_solve_spd`), no LAPACK: this runs on the engine's main thread after every step (and
        after every draft forward, for the block's cost), where numpy.linalg's dispatch for the two fits cost 0.33 ms
        a step at concurrency 1 on a 2-core Xeon (0.13 ms now); the arithmetic itself is a few dozen flops."""
        p = self._p
        ridge = [r * max(self.forget ** self.num_obs, self.ridge_floor) for r in self._ridge.tolist()]
        A = [row[:] for row in self._xtx]  # [p][p]
        for i in range(p):
            A[i][i] += ridge[i]
        y = [v + r * t for v, r, t in zip(self._xty, ridge, self._theta0.tolist())]
        best, best_obj = None, float("inf")
        for free in self._subsets:
            sol = _solve_spd([[A[i][j] for j in free] for i in free], [y[i] for i in free])
            th = [0.0] * p
            for i, v in zip(free, sol):
                th[i] = v
            if any(t < 0 for t in th[1:]):
                continue
            obj = sum(th[i] * A[i][j] * th[j] for i in range(p) for j in range(p)) - 2.0 * sum(
                t * v for t, v in zip(th, y))
            if obj < best_obj:
                best, best_obj = th, obj
            if len(free) == p:
                break  # the unconstrained optimum is feasible: nothing beats it
        best[0] = max(best[0], 1e-6)
        return best

    def __call__(self, n_tokens: float, num_reqs: float = 0, out_tokens: float = 0) -> float:
        return self.alpha + self.beta * n_tokens + self.delta * num_reqs + self.gamma * out_tokens


class SplitStepCost:
    """The step's cost as two fits: the target forward F(n) = a_f + b_f * n, timed on its own, and the rest of the
    step H(B, m) = a_h + d_h * B + g_h * m (sampling, output processing, scheduling, the drafter's host work), the
    step's wall time less its forward. Evaluated and published like `StepCostModel`: T(n, B, m) = F(n) + H(B, m),
    alpha = a_f + a_h, beta = b_f, delta = d_h, gamma = g_h.

    Why split: a query token's cost lives in the forward, a request's and a produced token's mostly outside it. Fitted
    on the wall time alone, the three slopes are told apart only by steps whose draft lengths differ, and the host's
    stalls land on whichever steps they hit: served at concurrency 32 on a 2-core Xeon, the whole-step fit read 0.9-1.3
    ms a query token (so the planner drafted almost nothing), where vLLM's n-gram drafter, verifying 25.6 more tokens
    a step than no speculation, took 5.3 ms more a step (0.21 ms a draft token, its accepted tokens' output included)
    and its forward 2.8 ms more (0.11 ms a token). The forward's own time is clean (no host stall in it) and moves
    with every change of n (batch size included), so b_f is identified even when nothing is drafted; a request adds
    no forward cost beyond its query tokens, so F has no per-request term.
    Used where the forward's time is known when the step is observed (CPU: a forward has finished when it returns)."""

    def __init__(self):
        self.forward = StepCostModel(alpha=0.01, beta=0.0005)  # F(n): observed with num_reqs = 0 (no delta term)
        # H(B, m): B enters as the model's "n" column (its beta is the per-request slope), m as produced tokens
        self.host = StepCostModel(alpha=0.005, beta=0.0005, per_output=True)

    def observe(self, n_tokens: int, seconds: float, num_reqs: int = 0, out_tokens: int = 0,
                forward_s: float | None = None, solve: bool = True) -> None:
        """One step (as `StepCostModel.observe`) of which `forward_s` seconds were the target forward."""
        if forward_s is None or forward_s <= 0 or seconds <= forward_s or num_reqs <= 0:
            return
        self.forward.observe(n_tokens, forward_s, solve=solve)
        self.host.observe(num_reqs, seconds - forward_s, 0, out_tokens, solve=solve)

    def refresh(self) -> None:
        self.forward.refresh()
        self.host.refresh()

    @property
    def num_obs(self) -> int:
        return self.forward.num_obs

    @property
    def alpha(self) -> float:
        return self.forward.alpha + self.host.alpha

    @property
    def beta(self) -> float:
        return self.forward.beta

    @property
    def delta(self) -> float:
        return self.host.beta

    @property
    def gamma(self) -> float:
        return self.host.gamma

    def __call__(self, n_tokens, num_reqs=0, out_tokens=0):
        return self.forward(n_tokens) + self.host(num_reqs, 0, out_tokens)


def refresh_young(cost: StepCostModel | SplitStepCost) -> None:
    """Solve the fit now if it is young (under YOUNG_FIT samples: it still moves fast); an older one is solved every
    SOLVE_EVERY samples by `observe` (a solve is 0.2-0.3 ms at batch 32 on a 2-core EPYC). The adaptive controller
    calls this when a plan weighs drafts; bench/cost_model.py replays the same rule."""
    if cost.num_obs < YOUNG_FIT:
        cost.refresh()


def _solve_spd(A: list[list[float]], y: list[float]) -> list[float]:
    """x with A x = y for a small symmetric positive definite A (nested lists), by Cholesky in Python floats.
    A is the ridge-regularised normal matrix of `StepCostModel`, so it is positive definite."""
    n = len(y)
    L = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1):
            v = A[i][j] - sum(L[i][k] * L[j][k] for k in range(j))
            L[i][j] = math.sqrt(v) if i == j else v / L[j][j]
    z = [0.0] * n
    for i in range(n):  # L z = y
        z[i] = (y[i] - sum(L[i][k] * z[k] for k in range(i))) / L[i][i]
    x = [0.0] * n
    for i in reversed(range(n)):  # L^T x = z
        x[i] = (z[i] - sum(L[k][i] * x[k] for k in range(i + 1, n))) / L[i][i]
    return x
