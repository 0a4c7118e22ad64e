# SPDX-License-Identifier: Apache-2.0
"""`StepTrace`: one JSON line per adaptive-drafting step, for seeing what the cost model and the guard decide on.

Switched on by the process setting `trace` (DFLASH_TRACE=<folder>): each engine process that runs an adaptive
controller appends to `<folder>/trace-<pid>.jsonl`. Records are buffered and written every `flush_every` steps and at
exit (a server stopped by a signal may lose the last few), so the cost on the engine's main thread is a dict, a list
append and a write every 32 steps. Off (the default) nothing is built: `open_trace()` returns None and the
controller skips every call."""
from __future__ import annotations

import atexit
import json
import os
import time
from pathlib import Path


class StepTrace:
    def __init__(self, path: Path, flush_every: int = 32):
        self.path, self.flush_every = path, flush_every
        self._buf: list[str] = []
        self._t0 = time.perf_counter()
        path.parent.mkdir(parents=True, exist_ok=True)
        atexit.register(self.flush)

    def record(self, **fields) -> None:
        """One step: `t` (seconds since the trace opened) is added; values must be JSON-able."""
        fields["t"] = round(time.perf_counter() - self._t0, 6)
        self._buf.append(json.dumps(fields, separators=(",", ":")))
        if len(self._buf) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if not self._buf:
            return
        with open(self.path, "a") as f:
            f.write("\n".join(self._buf) + "\n")
        self._buf.clear()


def open_trace() -> StepTrace | None:
    """The trace of this process when DFLASH_TRACE names a folder, else None."""
    from vllm_dflash import settings

    folder = settings.process_setting("trace")
    if not folder:
        return None
    return StepTrace(Path(folder).expanduser() / f"trace-{os.getpid()}.jsonl")


def read_trace(path) -> list[dict]:
    """Every record of a trace file, in order."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
