# SPDX-License-Identifier: Apache-2.0
"""Guards of different batch-size buckets (`guard_for`): a bucket whose 'off' was never measured is vouched for by a
larger bucket that measured the plan faster than no speculation or forecasts a clear win, and then never spends a
window without speculation; a larger bucket where 'off' won, or one with neither, vouches for nothing."""
from __future__ import annotations

from vllm_dflash.adaptive.lengths import LengthPlanner
from vllm_dflash.adaptive.policy import SpeculationGuard, guard_for


def _measured(plan: float, off: float) -> SpeculationGuard:
    g = SpeculationGuard()
    g.rate = {"plan": plan, "off": off}
    return g


def _arms(g: SpeculationGuard, forecast: float, steps: int = 80) -> list[str]:
    """Arms the guard runs over `steps` steps where the plan is 20 % faster and the forecast is marginal."""
    arms = []
    for _ in range(steps):
        g.predict(forecast)
        arms.append(g.arm)
        g.record(12.0 if g.arm == "plan" else 10.0, 1.0)
    return arms


def test_a_larger_bucket_where_the_plan_won_vouches_for_smaller_ones():
    guards = {5: _measured(plan=110.0, off=100.0)}  # batch 32: speculation measured 10 % faster
    g = guard_for(guards, 4)
    assert g.vouched and guards[4] is g
    assert "off" not in _arms(g, forecast=1.05)  # a marginal forecast, yet 'off' is never measured
    assert not guard_for(guards, 5).vouched  # nothing larger vouches for the largest bucket


def test_a_forecast_alone_never_vouches_nor_skips_measuring_off():
    """'off' unmeasured at batch 8 with a clear forecast (1.8): batch 8 itself measures 'off' once, and it vouches
    for batch 4-7 only once it measured the plan faster (a forecast is no measurement: at concurrency 8 on the bf16
    EPYC, plans forecast at 1.2-1.3x ran slower than no speculation)."""
    big = SpeculationGuard()
    big.predict(1.8)
    assert not guard_for({3: big}, 2).vouched
    assert "off" in _arms(big, forecast=1.8)
    assert big.best == "plan" and guard_for({3: big}, 2).vouched  # measured 12 against 10


def test_no_vouch_where_off_won_or_was_not_measured():
    assert not guard_for({5: _measured(plan=90.0, off=100.0)}, 4).vouched
    assert not guard_for({5: SpeculationGuard()}, 4).vouched  # neither arm measured, no forecast yet
    assert not guard_for({3: _measured(plan=110.0, off=100.0)}, 4).vouched  # a smaller bucket says nothing
    g = guard_for({5: _measured(plan=90.0, off=100.0)}, 4)
    assert "off" in _arms(g, forecast=1.05)  # unvouched with a marginal forecast: measured as before


def test_a_vouch_is_dropped_when_the_larger_bucket_flips():
    guards = {5: _measured(plan=110.0, off=100.0)}
    assert guard_for(guards, 2).vouched
    guards[5].rate = {"plan": 95.0, "off": 100.0}  # re-measured: now 'off' wins at batch 32
    assert not guard_for(guards, 2).vouched


def test_a_measured_loss_beats_a_vouch():
    """A vouched guard that has measured 'off' faster itself keeps 'off' (`sure` never overrides a measured loss)."""
    guards = {5: _measured(plan=110.0, off=100.0), 3: _measured(plan=80.0, off=100.0)}
    g = guard_for(guards, 3)
    assert g.vouched and not g.sure and g.best == "off"


def test_the_overlap_planner_uses_the_same_rule():
    p = LengthPlanner(4)
    p.guards[5] = _measured(plan=110.0, off=100.0)
    assert p.guard(3).vouched and not p.guard(5).vouched


def test_a_measured_win_with_a_clear_forecast_is_not_re_measured():
    """'off' measured once (the forecast was marginal then) and the plan won: while the forecast is a clear win the
    guard never spends another window without speculation; when the forecast turns marginal it re-measures again."""
    g = SpeculationGuard(window=4, explore_every=2)
    arms = _arms(g, forecast=1.1, steps=40)
    assert "off" in arms and g.best == "plan"
    assert "off" not in _arms(g, forecast=2.0, steps=200)
    assert "off" in _arms(g, forecast=1.0, steps=200)
