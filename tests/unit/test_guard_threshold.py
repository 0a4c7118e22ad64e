# SPDX-License-Identifier: Apache-2.0
"""Setting guard_threshold: validated before serving, and it is the forecast (or measured lead) above which adaptive
drafting's guard, once it has measured the plan faster than 'no speculation', keeps speculating without measuring
'no speculation' again (both planners: the drafter's and the overlap scheduler's).
Also the bench's labelled copies (`NAME#LABEL`), the way to A/B such a setting in one run."""
from __future__ import annotations

import pytest

from vllm_dflash import settings as S
from vllm_dflash.adaptive.controller import AdaptiveController
from vllm_dflash.adaptive.lengths import LengthPlanner
from vllm_dflash.bench.configs import select
from vllm_dflash.config import DFlashConfigError


@pytest.mark.parametrize("raw, want", [(1, 1.0), ("1.1", 1.1), (2.5, 2.5)])
def test_accepts_speedups(raw, want):
    assert S.DFlashSettings(guard_threshold=raw).guard_threshold == want


@pytest.mark.parametrize("raw", [0.9, "0.5", "fast", True, float("inf"), float("nan")])
def test_rejects_with_the_fix(raw):
    with pytest.raises(DFlashConfigError, match=r"guard_threshold.*Fix: use a number >= 1"):
        S.DFlashSettings(guard_threshold=raw)


def test_spec_key_reaches_settings():
    spec = {"method": "dflash", "model": "d", "guard_threshold": 1.1}
    assert S.resolve(S.pop_spec_keys(spec), environ={}).guard_threshold == 1.1
    assert "guard_threshold" not in spec  # popped: vLLM never sees it


def _re_measures_off(threshold: float, forecast: float) -> bool:
    """Drive one guard through its first comparison (the plan 10 % faster than 'off') with `forecast`, then many
    windows of the plan: does it measure 'off' again?"""
    ctl = AdaptiveController(4, guard_threshold=threshold)
    g = ctl.guard
    arms = []
    for _ in range(20 * g.window):
        g.predict(forecast)
        arms.append(g.arm)
        g.record(11.0 if g.arm == "plan" else 10.0, 0.1)
    first = arms.index("off")  # measured once, whatever the threshold and the forecast
    again = [i for i, a in enumerate(arms) if a == "off" and i > first + 3 * g.window]
    assert g.best == "plan"
    return bool(again)


def test_controller_guards_use_the_threshold():
    # forecast 1.2 after a measured win: below the default 1.3 'off' is re-measured; with threshold 1.1 it is not
    assert _re_measures_off(1.3, 1.2)
    assert not _re_measures_off(1.1, 1.2)
    assert AdaptiveController(4, guard_threshold=1.1).guard.sure_speedup == 1.1


def test_length_planner_guards_use_the_threshold():
    assert LengthPlanner(4, guard_threshold=1.7).guard(3).sure_speedup == 1.7
    assert LengthPlanner(4).guard(0).sure_speedup == 1.3


def test_bench_labelled_copy_takes_its_own_overrides():
    base, copy = select(["none", "ours", "ours#g11"], ["ours#g11:guard_threshold=1.1"])[1:]
    assert copy.name == "ours#g11" and copy.spec_extra["guard_threshold"] == 1.1
    assert "guard_threshold" not in base.spec_extra
    with pytest.raises(ValueError, match="empty label"):
        select(["none", "ours#"])
