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
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

SURE_SPEEDUP = 1.3  # the guard's default threshold (setting guard_threshold has the same default)
MIN_MARGIN = 0.02  # the guard's least margin between its arms (setting guard_margin "noise")
SOURCES = ("dflash", "ngram", "merged")  # merged: prompt-lookup tokens first, the DFlash block after them
# A merged proposal's lookup slots are scored as prompt lookup (they are its tokens); its "merged" rates are those of
# the block's slots after a lookup, by slot (the block drafts slot j from the anchor whatever the lookup put before).


class AcceptanceModel:
    """Conditional acceptance per source and draft position, global and per request (shrunk to the global).

    c[s][j] = P(draft j+1 accepted | drafts 1..j accepted). Global rates are exponential moving counts
    (`decay` per observation); a request's own counts decay faster and are blended with `prior_weight` pseudo
    counts of the global rate, so a new request starts at the global estimate and drifts to its own.

    Two pools of global counts: greedy requests (`acc` / `att`) and sampled ones (`acc_sampled` / `att_sampled`,
    requests marked with `mark_sampled`). Under sampling a draft is accepted with sum min(p, q) (one-hot q: p(x)),
    far from the greedy rate either way, so a sampled request starts from (and is shrunk to) the rates measured on
    sampled requests, never the greedy ones."""

    def __init__(self, k_max: int, prior: dict[str, float] | None = None, decay: float = 0.995,
                 request_decay: float = 0.8, prior_weight: float = 2.0):
        self.k_max = k_max
        self.decay, self.request_decay, self.prior_weight = decay, request_decay, prior_weight
        prior = prior or {"dflash": 0.5, "ngram": 0.7, "merged": 0.7}  # optimistic start: every source gets tried
        self.acc = {s: np.full(k_max, p * 8.0) for s, p in prior.items()}  # 8 pseudo observations each
        self.att = {s: np.full(k_max, 8.0) for s in prior}
        self.acc_sampled = {s: a.copy() for s, a in self.acc.items()}  # the sampled requests' pool
        self.att_sampled = {s: a.copy() for s, a in self.att.items()}
        self.sampled: set[str] = set()  # requests with temperature > 0 (`mark_sampled`)
        self.req: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}

    def mark_sampled(self, req_ids, sampled) -> None:
        """Which of these requests sample (temperature > 0): their global pool is the sampled one."""
        for rid, s in zip(req_ids, sampled):
            if s:
                self.sampled.add(rid)
            else:
                self.sampled.discard(rid)

    def _pool(self, sampled: bool) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        return (self.acc_sampled, self.att_sampled) if sampled else (self.acc, self.att)

    def global_rates(self, source: str, sampled: bool = False) -> np.ndarray:  # [k_max]
        acc, att = self._pool(sampled)
        return acc[source] / np.maximum(att[source], 1e-9)

    def rates(self, req_id: str, source: str) -> np.ndarray:  # [k_max]
        g = self.global_rates(source, req_id in self.sampled)
        mine = self.req.get(req_id, {}).get(source)
        if mine is None:
            return g
        return self._blend(*mine, g)

    def _blend(self, accepted: np.ndarray, attempts: np.ndarray, g: np.ndarray) -> np.ndarray:
        """A request's own counts shrunk to the global rates g by `prior_weight` pseudo counts (any leading shape)."""
        return (accepted + self.prior_weight * g) / (attempts + self.prior_weight)

    def rates_batch(self, req_ids: list[str], source: str) -> np.ndarray:  # [B, k_max]
        """`rates` of many requests at once (the planner's hot path: one array op instead of one per request)."""
        g = self.global_rates(source)[None, :]  # [1, k_max]
        if self.sampled:
            is_s = np.fromiter((r in self.sampled for r in req_ids), dtype=bool, count=len(req_ids))
            if is_s.any():
                g = np.where(is_s[:, None], self.global_rates(source, True)[None, :], g)  # [B, k_max]
        own = np.zeros((len(req_ids), 2, self.k_max))  # [B, (accepted, attempts), k_max]
        has = np.zeros(len(req_ids), dtype=bool)
        for i, rid in enumerate(req_ids):
            mine = self.req.get(rid)
            mine = mine.get(source) if mine is not None else None
            if mine is not None:
                own[i, 0], own[i, 1] = mine
                has[i] = True
        g = np.broadcast_to(g, (len(req_ids), self.k_max))
        return np.where(has[:, None], self._blend(own[:, 0], own[:, 1], g), g)

    def observe(self, req_id: str, source: str, num_drafted: int, num_accepted: int, start: int = 0) -> None:
        """One verified proposal: positions 1..accepted were accepted; position accepted+1 (if drafted) rejected.
        start: only positions start+1.. are this source's (the tail of a merged proposal after its lookup tokens);
        nothing is recorded when the target rejected a token before them."""
        if num_drafted <= start or num_accepted < start:
            return
        tried = min(num_accepted + 1, num_drafted)  # positions whose conditional outcome we saw
        hit = np.zeros(self.k_max)
        hit[start:num_accepted] = 1.0
        seen = np.zeros(self.k_max)
        seen[start:tried] = 1.0
        acc, att = self._pool(req_id in self.sampled)
        acc[source] = acc[source] * self.decay + hit
        att[source] = att[source] * self.decay + seen
        per = self.req.setdefault(req_id, {})
        a, n = per.get(source, (np.zeros(self.k_max), np.zeros(self.k_max)))
        per[source] = (a * self.request_decay + hit, n * self.request_decay + seen)

    def forget(self, req_id: str) -> None:
        self.req.pop(req_id, None)
        self.sampled.discard(req_id)


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
        self._xtx = np.zeros((p, p))  # weighted sum of x x^T, x = [1, n, B(, m)]
        self._xty = np.zeros(p)  # weighted sum of x * t
        # the sets of free slopes tried when the unconstrained fit has a negative one: all of them first, then
        # every smaller subset (alpha is always free)
        slopes = range(1, p)
        self._subsets = [(0,) + c for r in range(p - 1, -1, -1) for c in itertools.combinations(slopes, r)]

    def observe(self, n_tokens: int, seconds: float, num_reqs: int = 0, out_tokens: int = 0) -> None:
        """One step: n_tokens query tokens, num_reqs requests, out_tokens tokens it produced (used with
        `per_output`), `seconds` long."""
        if seconds <= 0 or n_tokens <= 0:
            return
        if self.num_obs >= self.warmup:
            seconds = min(seconds, self.max_ratio * self(n_tokens, num_reqs, out_tokens))
        x = np.array([1.0, float(n_tokens), float(num_reqs), float(out_tokens)][: self._p])
        self._xtx = self._xtx * self.forget + np.outer(x, x)
        self._xty = self._xty * self.forget + x * seconds
        self.num_obs += 1
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
        A = self._xtx.tolist()  # [p][p]
        for i in range(p):
            A[i][i] += ridge[i]
        y = [v + r * t for v, r, t in zip(self._xty.tolist(), ridge, self._theta0.tolist())]
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
                forward_s: float | None = None) -> None:
        """One step (as `StepCostModel.observe`) of which `forward_s` seconds were the target forward."""
        if forward_s is None or forward_s <= 0 or seconds <= forward_s or num_reqs <= 0:
            return
        self.forward.observe(n_tokens, forward_s)
        self.host.observe(num_reqs, seconds - forward_s, 0, out_tokens)

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


class SpeculationGuard:
    """A measured safety net over the model-based plan: the realised output tokens/s of the plan ('plan') and of no
    speculation ('off') are compared in windows of `window` steps; the better arm runs and the other is re-measured
    after `explore_every` windows. Each re-measurement that confirms the winner doubles that gap (up to
    `max_gap`); a flip resets it. It catches what the step-cost model does not see (fixed costs of the speculative
    path, batch effects), so speculation that does not pay on this machine turns itself off, and stays off at
    little exploration cost.

    Every comparison is flanked (A B A): a window of the other arm runs between two windows of the running one, and
    it is judged against their mean. A comparison that would change the winner is repeated at once (`confirm`), and
    the winner changes only if the mean of the two says so. The speed of a 2-core machine drifts by tens of percent
    within minutes and a batch's requests grow longer as they decode, so a window compared with one measured earlier
    mostly measures the drift: measured at concurrency 32 on chat prompts, a cold first window of the plan (544
    tokens/s) against a later 'off' window (671-770) kept speculation off for 53 of 122 steps, while the plan's next
    windows ran at 847-881.

    Measuring 'off' costs a window of steps without speculation, which is the price of every batch-size bucket's
    first windows in a short burst of traffic. So the guard only measures 'off' while the models' own forecast of
    the plan (`predict`: output tokens/s of the plan over no speculation, from measured acceptance and measured step
    times) is below `sure_speedup`; where the forecast is a clear win it keeps the plan, and once the plan was also
    measured faster it does not re-measure 'off' while the forecast stays clear (served at concurrency 8 on chat
    prompts, each re-measurement cost a window of 12 steps in rounds of about 110, the plan measured 1.1-1.7x faster
    each time). A measured loss still wins over any forecast: once 'off' was measured faster, it runs.

    A guard may also be `vouched` for (`guard_for`): a larger batch-size bucket measured the plan faster than no
    speculation, or has not measured 'off' and forecasts a clear win. Speculation gains shrink as the batch grows
    (verifying drafts turns the step from memory- to compute-bound), so such a guard does not measure 'off' either:
    measured at concurrency 32 on HumanEval (2-core Xeon, served), every bucket measuring 'off' on its own ran 19 % of
    all steps without speculation; at concurrency 8 on chat prompts the 4-7 bucket measured 'off' as each round
    drained (forecast 1.16-1.25) while the 8-15 bucket forecast 1.5-2.0 and never measured it."""

    ARMS = ("plan", "off")

    def __init__(self, window: int = 12, explore_every: int = 4, max_gap: int = 32, ema: float = 0.5,
                 sure_speedup: float = SURE_SPEEDUP, min_margin: float = MIN_MARGIN, noise_margin: bool = True,
                 confirm: bool = True):
        self.window, self.explore_every, self.max_gap, self.ema = window, explore_every, max_gap, ema
        self.sure_speedup = sure_speedup
        # hysteresis: the arm that is not the winner must beat it by `margin` (relative) to take over. Each flanked
        # comparison sets it to the spread of its two flanks (at least `min_margin`): a lead smaller than the
        # drift between two windows of the same arm is noise (in process at concurrency 8 on the AVX2 EPYC, a 6 %
        # reading turned speculation off for 24 of 88 steps; that machine drifts by 20-30 % between runs)
        self.min_margin = self.margin = min_margin
        self.noise_margin = noise_margin  # False: a fixed margin `min_margin` (setting guard_margin a number)
        self._winner = "plan"
        self.vouched = False  # a larger batch measured the plan faster than 'off' (`guard_for`)
        self.forecast: float | None = None  # EMA of the plan's forecast speed-up (`predict`)
        self.rate: dict[str, float | None] = {a: None for a in self.ARMS}
        self.arm = "plan"  # the arm of the current window
        self.windows = 0
        self.gap = explore_every  # windows of the winner before the loser is measured again
        self._since_explore = 0  # windows of the running arm since the last exploration
        self._exploring = False  # the current window measures the other arm
        self._before: float | None = None  # the running arm's window just before the one being explored
        self._explored: tuple[str, float] | None = None  # (arm, rate) of the window just explored: now its flank
        # a comparison that would change the winner, awaiting the one that confirms it: ({arm: rate}, flank spread)
        self.confirm = confirm
        self._unconfirmed: tuple[dict[str, float], float] | None = None
        self._n, self._tokens, self._seconds = 0, 0.0, 0.0

    def predict(self, speedup: float) -> None:
        """The planner's forecast for this step's plan (`predicted_speedup`)."""
        self.forecast = speedup if self.forecast is None else 0.8 * self.forecast + 0.2 * speedup

    @property
    def sure(self) -> bool:
        """Is the plan a clear win (its forecast, a larger batch's measurement: `vouched`, or its own measured lead of
        `sure_speedup` over 'off'), so that measuring 'off' (or re-measuring it, after the plan was measured faster)
        would only cost steps? Never after 'off' was measured faster: a measured loss is re-checked on the guard's
        schedule whatever the forecast says. (Served at concurrency 8 on chat prompts the forecast read 1.24-1.34
        while the plan was measured 1.4x as fast as 'off', so 'off' was re-measured for 6 % of the decode steps.)"""
        if self.best == "off":  # 'off' measured faster
            return False
        return self.vouched or self._forecast_clear or self._measured_clear

    @property
    def _measured_clear(self) -> bool:
        """The plan was measured at least `sure_speedup` times as fast as 'off' (its rate since kept up to date)."""
        p, o = self.rate["plan"], self.rate["off"]
        return p is not None and o is not None and p >= o * self.sure_speedup

    @property
    def wins(self) -> bool:
        """Does this guard vouch for smaller buckets: the plan measured faster than 'off', or 'off' unmeasured and
        the forecast a clear win (its own, not a vouch it was given)?"""
        p, o = self.rate["plan"], self.rate["off"]
        if o is not None:
            return p is not None and p > o
        return self._forecast_clear

    @property
    def _forecast_clear(self) -> bool:
        """The plan's own forecast is a clear win (at least `sure_speedup`)."""
        return self.forecast is not None and self.forecast >= self.sure_speedup

    @property
    def best(self) -> str:
        """The faster arm as measured, with hysteresis: the other arm must lead the last winner by `margin`."""
        return _faster(self.rate["plan"], self.rate["off"], self._winner, self.margin)

    def record(self, tokens: float, seconds: float, arm: str | None = None) -> None:
        """One verified step of the current arm: output tokens it produced and its wall time. `arm`: the arm that
        decided the step, when it was decided steps earlier (overlap scheduling); a step of another arm is dropped."""
        if arm is not None and arm != self.arm:
            return
        self._n += 1
        self._tokens += tokens
        self._seconds += seconds
        if self._n < self.window:
            return
        r = self._tokens / max(self._seconds, 1e-9)
        self._n, self._tokens, self._seconds = 0, 0.0, 0.0
        self.windows += 1
        if self._exploring:  # the other arm's window just ended: its flank, a window of the running arm, comes next
            self._exploring, self._explored = False, (self.arm, r)
            self.arm = "off" if self.arm == "plan" else "plan"
            return
        if self._explored is not None:  # the flank ended: judge the explored window against both of its flanks
            (other, r_other), mine = self._explored, r if self._before is None else (self._before + r) / 2
            reading = {self.arm: mine, other: r_other}
            spread = 0.0 if self._before is None else abs(self._before - r) / max(mine, 1e-9)
            self._explored = self._before = None
            if self._unconfirmed is not None:  # the confirming comparison: the winner is judged on both of them
                first_reading, first_spread = self._unconfirmed
                self._unconfirmed = None
                reading = {a: (v + first_reading[a]) / 2 for a, v in reading.items()}
                spread = (spread + first_spread) / 2
            elif self.confirm and _faster(reading["plan"], reading["off"], self._winner,
                                          self._margin_for(spread)) != self._winner:
                # a change of winner is confirmed by a second comparison right away before it takes effect: one
                # slow window of the running arm (a stall of the host) is not a loss (served at concurrency 1 on
                # chat prompts, one such reading turned speculation off, and its requests' draft context was dropped)
                self._unconfirmed = (reading, spread)
                self._explore(other, r)
                return
            first, winner_before = self.rate[other] is None, self.best
            self.rate.update(reading)
            self.margin = self._margin_for(spread)
            self._winner = self.best
            if not first:
                self.gap = min(2 * self.gap, self.max_gap) if self.best == winner_before else self.explore_every
            self._since_explore = 1  # the flank was a window of the running arm
            self.arm = self.best
            return
        old = self.rate[self.arm]
        self.rate[self.arm] = r if old is None else self.ema * r + (1 - self.ema) * old
        self._winner = self.best
        untried = [a for a in self.ARMS if self.rate[a] is None]
        if untried and not (untried == ["off"] and self.sure):
            self._explore(untried[0], r)
            return
        if self.sure:  # 'off' never measured and the plan forecast a clear win: keep it
            self.arm = "plan"
            return
        self._since_explore += 1
        if self._since_explore >= self.gap:  # `gap` windows of the running arm (its flank included) since the last one
            self._explore("off" if self.best == "plan" else "plan", r)
        else:
            self.arm = self.best

    def _margin_for(self, spread: float) -> float:
        """The hysteresis margin after a comparison whose flanks differed by `spread` (relative)."""
        return max(self.min_margin, spread) if self.noise_margin else self.min_margin

    def _explore(self, other: str, before: float) -> None:
        """Measure `other` for a window, between the window that just ended (rate `before`) and the next one."""
        self._since_explore, self._exploring, self._before, self.arm = 0, True, before, other


def _faster(plan: float | None, off: float | None, winner: str, margin: float) -> str:
    """The faster arm of two measured rates (tokens/s), with hysteresis: the arm that is not `winner` must lead it by
    `margin` (relative). Either rate unmeasured: 'plan'."""
    if plan is None or off is None:
        return "plan"
    if winner == "plan":
        return "off" if off > plan * (1 + margin) else "plan"
    return "plan" if plan > off * (1 + margin) else "off"


def guard_for(guards: dict[int, SpeculationGuard], bucket: int, sure_speedup: float = SURE_SPEEDUP,
              margin: float | str = "noise", confirm: bool = True) -> SpeculationGuard:
    """The guard of a batch-size bucket (created on first use with `sure_speedup`: setting guard_threshold, and
    `margin`: setting guard_margin, "noise" or a fixed number, and `confirm`: setting guard_confirm), `vouched` for
    while some larger bucket `wins`."""
    g = guards.get(bucket)
    if g is None:
        fixed = not isinstance(margin, str)
        g = guards[bucket] = SpeculationGuard(sure_speedup=sure_speedup, noise_margin=not fixed,
                                              min_margin=float(margin) if fixed else MIN_MARGIN, confirm=confirm)
    g.vouched = any(b > bucket and o.wins for b, o in guards.items())
    return g


def batch_bucket(num_reqs: int) -> int:
    """Guard bucket of a batch: 1, 2-3, 4-7, 8-15, ... -> 0, 1, 2, 3, ... (speculation pays differently at each)."""
    return max(int(num_reqs), 1).bit_length() - 1


def cumulative_acceptance(cond: np.ndarray, length: int) -> np.ndarray:
    """P(i) = prod_{j<=i} cond[j] for i = 1..length -> [length]."""
    return np.cumprod(np.clip(cond[:length], 0.0, 1.0))


def publish_plan(metrics, ks: list[int], cost: StepCostModel, guard: SpeculationGuard) -> None:
    """One step's plan into the metrics (any object with observe/set; None: nothing): the chosen lengths, the
    current step-cost fit and the guard's measured rates. Shared by the drafter's and the scheduler's planners."""
    if metrics is None:
        return
    for k in ks:
        metrics.observe("draft_tokens_per_request", float(k))
    metrics.set("cost_fixed_ms", cost.alpha * 1e3)
    metrics.set("cost_per_token_ms", cost.beta * 1e3)
    metrics.set("cost_per_request_ms", cost.delta * 1e3)
    metrics.set("cost_per_output_token_ms", cost.gamma * 1e3)
    for arm in guard.ARMS:
        if guard.rate[arm] is not None:
            metrics.set(f"guard_{arm}_tokens_per_s", guard.rate[arm])
