# SPDX-License-Identifier: Apache-2.0
"""Adaptive drafting's guard (`SpeculationGuard`) changes its winner only on two flanked comparisons in a row (the
second one run at once, judged on the mean of both), and stops re-measuring 'off' once the plan was measured
`sure_speedup` times as fast. Window 1 (one step = one window), tokens/s set directly."""
from support.guard import compare as _compare

from vllm_dflash.adaptive.policy import SpeculationGuard


def _guard(**kw) -> SpeculationGuard:
    kw.setdefault("sure_speedup", float("inf"))  # no forecast or measurement is ever 'sure': 'off' is measured
    return SpeculationGuard(window=1, **kw)


def test_one_slow_comparison_does_not_turn_speculation_off():
    """plan 100, off 130, plan 100 says 'off' by 30 %; the comparison run at once reads plan 100, off 70. On the
    mean of both (plan 100, off 100) the plan keeps running, and during the second comparison the winner stays the
    plan, so the drafter keeps the requests' draft context (it drops it only where 'off' is the winner)."""
    g = _guard()
    _compare(g, 100, 130, 100)
    assert g.arm == "off", "the change of winner should be confirmed by a second comparison at once"
    assert g.best == "plan" and g.rate == {"plan": 100, "off": None}, "nothing changes before it is confirmed"
    g.record(70, 1.0)
    assert g.arm == "plan"
    g.record(100, 1.0)
    assert g.rate == {"plan": 100, "off": 100}
    assert g.best == "plan" and g.arm == "plan"


def test_a_real_loss_is_confirmed_and_turns_speculation_off():
    """Two comparisons in a row with 'off' 30 % ahead: 'off' wins on their mean."""
    g = _guard()
    _compare(g, 100, 130, 98)
    assert g.best == "plan"
    g.record(131, 1.0)
    g.record(100, 1.0)
    assert g.rate["off"] == 130.5 and g.best == "off" and g.arm == "off"


def test_coming_back_to_the_plan_is_confirmed_too():
    """Once 'off' won, one comparison where the plan leads is repeated before the plan runs again."""
    g = _guard(explore_every=1)
    _compare(g, 100, 130, 98)
    g.record(131, 1.0)
    g.record(100, 1.0)
    assert g.best == "off"
    g.record(130, 1.0)  # a window of 'off'; the gap is 1 window, so the next one explores the plan
    assert g.arm == "plan"
    g.record(160, 1.0)
    g.record(130, 1.0)  # the plan led by 23 %: not yet
    assert g.best == "off" and g.arm == "plan", "the plan's lead should be measured once more"
    g.record(100, 1.0)  # the plan's second window: 100
    g.record(130, 1.0)  # mean: plan 130, off 130
    assert g.best == "off" and g.arm == "off"


def test_without_confirmation_one_comparison_decides():
    """confirm=False: the previous rule, each flanked comparison decides alone."""
    g = _guard(confirm=False)
    _compare(g, 100, 130, 100)
    assert g.best == "off" and g.arm == "off"


def test_a_measured_clear_win_is_not_re_measured():
    """No forecast at all: the plan measured 1.5x as fast as 'off' (at least sure_speedup 1.3) keeps running, where a
    lead of 1.2x gets 'off' re-measured after `gap` windows."""
    clear = _guard(sure_speedup=1.3, explore_every=2)
    _compare(clear, 150, 100, 150)
    assert clear.best == "plan" and clear.sure
    arms = []
    for _ in range(20):
        clear.record(150, 1.0)
        arms.append(clear.arm)
    assert arms == ["plan"] * 20
    unsure = _guard(sure_speedup=1.3, explore_every=2)
    _compare(unsure, 120, 100, 120)
    assert unsure.best == "plan" and not unsure.sure
    arms = []
    for _ in range(20):
        unsure.record(120, 1.0)
        arms.append(unsure.arm)
    assert "off" in arms


def test_setting_guard_confirm_reaches_both_planners():
    """guard_confirm: true (default) or false, validated with the fix named; both planners (the drafter's controller
    and the overlap scheduler's) build their guards with it."""
    import pytest

    from vllm_dflash import settings as S
    from vllm_dflash.adaptive.controller import AdaptiveController
    from vllm_dflash.adaptive.lengths import LengthPlanner

    assert S.DFlashSettings().guard_confirm is True
    assert S.resolve({"guard_confirm": "false"}).guard_confirm is False
    with pytest.raises(ValueError, match="guard_confirm"):
        S.resolve({"guard_confirm": "sometimes"})
    assert AdaptiveController(7).guard.confirm is True
    assert AdaptiveController(7, guard_confirm=False).guard.confirm is False
    assert LengthPlanner(7, guard_confirm=False).guard(0).confirm is False
    assert LengthPlanner(7).guard(0).confirm is True
