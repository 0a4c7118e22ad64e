# SPDX-License-Identifier: Apache-2.0
"""`StepTrace`: one JSON line per adaptive-drafting step, for seeing what the cost model and the guard decide on.

Switched on by the process setting `trace` (DFLASH_TRACE=<folder>): each engine process that runs an adaptive
controller appends to `<folder>/trace-<pid>.jsonl`. Records are buffered and written every `flush_every` steps and at
exit (a server stopped by a signal may lose the last few), so the cost on the engine's main thread is a dict, a list
append and a write every 32 steps. Off (the default) nothing is built: `open_trace()` returns None and the
controller skips every call.

The trace must never stop serving: an error while writing it (full disk, folder removed, permissions) turns it off
with one warning and drops the buffered records. A file that reaches `trace_max_mb` (DFLASH_TRACE_MAX_MB) is renamed
to `<name>.1` (replacing the one before) and a new one is started, so a trace takes at most twice that on disk."""
from __future__ import annotations

import atexit
import json
import os
import time
from pathlib import Path

from vllm_dflash.utils import get_logger

logger = get_logger(__name__)


class StepTrace:
    def __init__(self, path: Path, flush_every: int = 32, max_bytes: int = 64 << 20):
        self.path, self.flush_every, self.max_bytes = path, flush_every, max_bytes
        self.enabled = True  # False after a write error: every later call does nothing
        self._buf: list[str] = []
        self._t0 = time.perf_counter()
        path.parent.mkdir(parents=True, exist_ok=True)
        atexit.register(self.flush)

    def record(self, **fields) -> None:
        """One step: `t` (seconds since the trace opened) is added; values must be JSON-able."""
        if not self.enabled:
            return
        fields["t"] = round(time.perf_counter() - self._t0, 6)
        try:
            self._buf.append(json.dumps(fields, separators=(",", ":")))
        except (TypeError, ValueError) as e:
            self._turn_off(e)
            return
        if len(self._buf) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if not self.enabled or not self._buf:
            return
        text = "\n".join(self._buf) + "\n"
        self._buf.clear()
        try:
            if self.path.exists() and self.path.stat().st_size + len(text) > self.max_bytes:
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            with open(self.path, "a") as f:
                f.write(text)
        except OSError as e:
            self._turn_off(e)

    def _turn_off(self, error: Exception) -> None:
        self.enabled = False
        self._buf.clear()
        logger.warning("vllm_dflash: the step trace %s is off from now on: %s: %s (serving goes on; fix the folder "
                       "and restart to trace again)", self.path, type(error).__name__, error)


def open_trace() -> StepTrace | None:
    """The trace of this process when DFLASH_TRACE names a folder, else None (also when the folder cannot be made:
    one warning, serving goes on)."""
    from vllm_dflash import settings

    folder = settings.process_setting("trace")
    if not folder:
        return None
    path = Path(folder).expanduser() / f"trace-{os.getpid()}.jsonl"
    max_bytes = int(settings.process_setting("trace_max_mb") * (1 << 20))
    try:
        return StepTrace(path, max_bytes=max_bytes)
    except OSError as e:
        logger.warning("vllm_dflash: no step trace (DFLASH_TRACE=%s): %s: %s", folder, type(e).__name__, e)
        return None


def read_trace(path) -> list[dict]:
    """Every record of a trace file, in order."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def trace_step(ctl, plan, **step) -> None:
    """One record of an `AdaptiveController`'s `trace`: the step just verified and this step's plan (`step`: query
    and produced tokens q / out, the cost sample dt, the target forward fwd and the draft forward's time blk in it,
    decode, extra prefill tokens, the planning time plan_s, planned: the plan weighed drafts (not skipped under a
    measured 'off' or by `IdlePlanBackoff`, idle_skip)), the
    decision (guard arm and rates, forecast, sources, lengths) and the step-cost fit."""
    g = ctl.guard
    by_source: dict[str, int] = {}
    for s, k in zip(plan.sources, plan.ks):
        if k > 0:
            by_source[s] = by_source.get(s, 0) + 1
    ctl.trace.record(
        B=len(plan.req_ids), **step, bucket=ctl._bucket, arm=g.arm, best=g.best, plan_rate=g.rate["plan"],
        off_rate=g.rate["off"], forecast=g.forecast, matched=int(sum(len(t) > 0 for t in plan.lookups)),
        drafted=int(sum(plan.ks)), sources=by_source, block=plan.needs_block,
        cost=[ctl.cost.alpha, ctl.cost.beta, ctl.cost.delta, ctl.cost.gamma])
