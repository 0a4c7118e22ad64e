# SPDX-License-Identifier: Apache-2.0
"""A fake clock for the adaptive controller in unit tests (`AdaptiveController(clock=...)`): each call is one step,
`dt` seconds after the last. `from support.clock import StepClock`."""
from __future__ import annotations


class StepClock:
    def __init__(self, dt: float = 0.04):
        self.t, self.dt = 0.0, dt

    def __call__(self) -> float:
        self.t += self.dt
        return self.t
