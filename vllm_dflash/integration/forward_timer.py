# SPDX-License-Identifier: Apache-2.0
"""`ForwardTimer`: the wall time of the target model's forward and logits calls, for adaptive drafting's step-cost fit;
`StepTimer`: the drafter's own regions (draft forward, KV injection) into its metrics.

The drafter wraps the loaded target model instance's `forward` and `compute_logits` (not a vLLM class; the same seam
as patches/profile_forward.py, which may wrap `forward` too: the two nest) when it loads, and takes the time
accumulated since its last look once per step (`take`). Both grow with the step's query tokens: the runner computes
logits at every verified position of a speculating request, [n, vocab] through the lm_head (at concurrency 32 on a
2-core Xeon 4.1 ms of a 40 ms forward, 0.05 ms a query token), so a draft token's cost includes its logits row. On
CPU a call, eager or compiled, has finished when it returns, so a host clock measures it; on a GPU it would measure
the launch only, so the drafter does not time it there."""
from __future__ import annotations

import functools
import time

import torch


def time_forward_calls(model, on_done, clock=time.perf_counter, method: str = "forward") -> None:
    """Wrap `model.<method>` (default `forward`; this instance only) so that every call reports its wall time:
    on_done(seconds), also when the call raises. Shared by `ForwardTimer` and patches/profile_forward.py."""
    inner = getattr(model, method)

    @functools.wraps(inner)
    def timed(*args, **kwargs):
        t0 = clock()
        try:
            return inner(*args, **kwargs)
        finally:
            on_done(clock() - t0)

    setattr(model, method, timed)


class ForwardTimer:
    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self._seconds = 0.0  # forward time since the last `take`
        self._calls = 0

    def wrap(self, model) -> None:
        """Time every call of `model.forward` and `model.compute_logits` (this instance only; a model without
        `compute_logits` is timed on its forward alone)."""
        time_forward_calls(model, self._add, self.clock)
        if callable(getattr(model, "compute_logits", None)):
            time_forward_calls(model, self._add, self.clock, method="compute_logits")

    def _add(self, seconds: float) -> None:
        self._seconds += seconds
        self._calls += 1

    def take(self) -> float | None:
        """Seconds of forward and logits since the last call (None when neither ran: nothing to attribute)."""
        s, n = self._seconds, self._calls
        self._seconds, self._calls = 0.0, 0
        return s if n else None


class StepTimer:
    """Wall time of a region: perf_counter on CPU; CUDA events read back one step later on GPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._pending: list[tuple[str, object, object]] = []

    def start(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def stop(self, name: str, start, sink) -> None:  # sink: a MetricsSink
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self._pending.append((name, start, e))
        else:
            sink.observe(name, time.perf_counter() - start)

    def drain(self, sink) -> None:
        keep = []
        for name, s, e in self._pending:
            if e.query():  # non-blocking
                sink.observe(name, s.elapsed_time(e) / 1000.0)
            else:
                keep.append((name, s, e))
        self._pending = keep
