# SPDX-License-Identifier: Apache-2.0
"""`ForwardTimer`: the wall time of the target model's forward calls, for adaptive drafting's step-cost fit.

The drafter wraps the loaded target model instance's `forward` (not a vLLM class; the same seam as
patches/profile_forward.py, which may wrap it too: the two nest) when it loads, and takes the time accumulated since
its last look once per step (`take`). On CPU a forward, eager or compiled, has finished when it returns, so a host
clock measures it; on a GPU it would measure the launch only, so the drafter does not time it there."""
from __future__ import annotations

import functools
import time


def time_forward_calls(model, on_done, clock=time.perf_counter) -> None:
    """Wrap `model.forward` (this instance only) so that every call reports its wall time: on_done(seconds), also when
    the forward raises. Shared by `ForwardTimer` and patches/profile_forward.py."""
    inner = model.forward

    @functools.wraps(inner)
    def forward(*args, **kwargs):
        t0 = clock()
        try:
            return inner(*args, **kwargs)
        finally:
            on_done(clock() - t0)

    model.forward = forward


class ForwardTimer:
    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self._seconds = 0.0  # forward time since the last `take`
        self._calls = 0

    def wrap(self, model) -> None:
        """Time every call of `model.forward` (this instance only)."""
        time_forward_calls(model, self._add, self.clock)

    def _add(self, seconds: float) -> None:
        self._seconds += seconds
        self._calls += 1

    def take(self) -> float | None:
        """Seconds of forward since the last call (None when no forward ran: nothing to attribute)."""
        s, n = self._seconds, self._calls
        self._seconds, self._calls = 0.0, 0
        return s if n else None
