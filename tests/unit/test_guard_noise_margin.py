# SPDX-License-Identifier: Apache-2.0
"""Adaptive drafting's guard (`SpeculationGuard`) judges 'plan' against 'off' with hysteresis sized from the noise:
the arm that is not the winner must lead it by the spread of the two flanking windows (at least `min_margin`).
Each test drives one flanked comparison A B A with window 1 (one step = one window) and tokens/s set directly."""
import pytest

from support.guard import compare as _compare

from vllm_dflash.adaptive.policy import SpeculationGuard


def _guard(**kw) -> SpeculationGuard:
    # no forecast ever 'sure': 'off' is measured; each comparison alone decides (confirm=False): these tests isolate
    # the margin rule, tests/unit/test_guard_confirm.py the confirming second comparison
    return SpeculationGuard(window=1, sure_speedup=float("inf"), confirm=False, **kw)


def test_a_lead_inside_the_flank_spread_keeps_the_plan():
    """plan 100, off 103, plan 92: off leads the plan's mean (96) by 7 %, but the two plan windows differ by 8 %
    (8 / 96): noise, so the plan keeps running. Before this rule any lead turned speculation off."""
    g = _guard()
    _compare(g, 100, 103, 92)
    assert g.rate == {"plan": 96, "off": 103}
    assert g.margin == pytest.approx(8 / 96)
    assert g.best == "plan" and g.arm == "plan"


def test_a_lead_beyond_the_spread_turns_speculation_off():
    """plan 100, off 130, plan 98: a 31 % lead against a 2 % spread is real."""
    g = _guard()
    _compare(g, 100, 130, 98)
    assert g.best == "off" and g.arm == "off"


def test_steady_flanks_use_the_minimum_margin():
    """Flanks equal (spread 0): the margin is `min_margin`, so a lead of 1 % keeps the plan and 3 % does not."""
    g = _guard(min_margin=0.02)
    _compare(g, 100, 101, 100)
    assert g.margin == 0.02 and g.best == "plan"
    g2 = _guard(min_margin=0.02)
    _compare(g2, 100, 103, 100)
    assert g2.best == "off"


def test_the_hysteresis_holds_in_both_directions():
    """Once 'off' won, the plan must lead it by the margin to come back: 'off' windows of 128 and 125 (mean 126.5,
    spread 2.4 %) around a plan window of 129 (2 % ahead) keep 'off'; a plan window of 140 brings the plan back."""
    g = _guard(explore_every=1)
    _compare(g, 100, 130, 98)
    assert g.arm == "off"
    g.record(128, 1.0)  # off's EMA window; the gap is 1 window, so the next window explores the plan
    assert g.arm == "plan"
    g.record(129, 1.0)
    assert g.arm == "off"
    g.record(125, 1.0)
    assert g.margin == pytest.approx(3 / 126.5)
    assert g.best == "off" and g.arm == "off"
    _compare(g, 126, 140, 126)  # the next comparison, after `gap` windows of 'off'
    assert g.best == "plan" and g.arm == "plan"


def test_setting_guard_margin_reaches_both_planners_and_a_fixed_margin_ignores_the_spread():
    """guard_margin: "noise" (default) or a fixed share; a fixed 0 is the old rule (any lead takes over). Both
    planners (the drafter's controller and the overlap scheduler's) build their guards with it."""
    from vllm_dflash import settings as S
    from vllm_dflash.adaptive.controller import AdaptiveController
    from vllm_dflash.adaptive.lengths import LengthPlanner

    assert S.DFlashSettings().guard_margin == "noise"
    assert S.resolve({"guard_margin": "0.05"}).guard_margin == 0.05
    for bad in (-0.1, "lots", float("inf"), True):
        with pytest.raises(ValueError, match="guard_margin"):
            S.resolve({"guard_margin": bad})
    assert AdaptiveController(7, guard_margin=0.0).guard.noise_margin is False
    assert LengthPlanner(7, guard_margin=0.0).guard(0).min_margin == 0.0
    assert LengthPlanner(7).guard(0).noise_margin is True
    g = _guard(min_margin=0.0, noise_margin=False)
    _compare(g, 100, 103, 92)  # the case the noise margin keeps on the plan
    assert g.margin == 0.0 and g.best == "off"
