# SPDX-License-Identifier: Apache-2.0
"""Driving adaptive drafting's guard (`SpeculationGuard`) in unit tests: `from support.guard import compare`."""
from __future__ import annotations


def compare(g, before: float, other: float, after: float) -> None:
    """One flanked comparison of a guard with window 1 (one `record` = one window; tokens/s given directly, over 1 s):
    a window of the running arm, one of the other arm, then the running arm again."""
    running = g.arm
    g.record(before, 1.0)
    assert g.arm != running, "the guard should be measuring the other arm now"
    g.record(other, 1.0)
    assert g.arm == running, "the flank should be a window of the running arm"
    g.record(after, 1.0)
