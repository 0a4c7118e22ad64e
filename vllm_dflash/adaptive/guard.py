# SPDX-License-Identifier: Apache-2.0
"""The speculation guard of adaptive drafting, free of vLLM: per batch-size bucket, the measured output tokens/s of
the plan against no speculation (`SpeculationGuard`, `guard_for`, `batch_bucket`)."""
from __future__ import annotations

SURE_SPEEDUP = 1.3  # the guard's default threshold (setting guard_threshold has the same default)
MIN_MARGIN = 0.02  # the guard's least margin between its arms (setting guard_margin "noise")


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

    Every bucket measures 'off' once, whatever the forecast: a forecast is the models' own view (measured acceptance
    and step times), and it can be wrong by more than any threshold (served at concurrency 8 on the bf16 EPYC, plans
    forecast at 1.2-1.3x ran 3-8 % slower than no speculation while 'off' was never measured). Re-measuring 'off'
    costs a window of steps without speculation each time, so once the plan was measured faster, the guard does not
    re-measure 'off' while the models' forecast (`predict`: output tokens/s of the plan over no speculation) stays
    at `sure_speedup` or above (served at concurrency 8 on chat prompts, each re-measurement cost a window of 12
    steps in rounds of about 110, the plan measured 1.1-1.7x faster each time). A measured loss wins over any
    forecast: once 'off' was measured faster, it runs.

    A guard may also be `vouched` for (`guard_for`): a larger batch-size bucket measured the plan faster than no
    speculation. Speculation gains shrink as the batch grows
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
        """Is the plan a clear win, so that re-measuring 'off' would only cost steps: a larger batch measured it
        faster (`vouched`), or this guard measured it faster than 'off' and its lead (or the models' forecast) is
        at least `sure_speedup`? Never before 'off' was measured here or in a larger bucket (a forecast alone does
        not replace the measurement) and never after 'off' was measured faster: a measured loss is re-checked on the
        guard's schedule whatever the forecast says. (Served at concurrency 8 on chat prompts the forecast read
        1.24-1.34 while the plan was measured 1.4x as fast as 'off', so 'off' was re-measured for 6 % of the decode
        steps.)"""
        if self.best == "off":  # 'off' measured faster
            return False
        if self.vouched:
            return True
        if self.rate["off"] is None:  # not measured yet: the forecast alone never decides
            return False
        return self._forecast_clear or self._measured_clear

    @property
    def _measured_clear(self) -> bool:
        """The plan was measured at least `sure_speedup` times as fast as 'off' (its rate since kept up to date)."""
        p, o = self.rate["plan"], self.rate["off"]
        return p is not None and o is not None and p >= o * self.sure_speedup

    @property
    def wins(self) -> bool:
        """Does this guard vouch for smaller buckets: the plan measured faster than 'off' here (a measurement, not a
        forecast, nor a vouch it was given)?"""
        p, o = self.rate["plan"], self.rate["off"]
        return o is not None and p is not None and p > o

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
        if self.sure:  # measured (here or in a larger batch) and a clear win: keep the plan
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
