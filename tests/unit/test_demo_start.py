# SPDX-License-Identifier: Apache-2.0
"""The demo talks while its servers start and compares with stock vLLM: start-up phases read from a `vllm serve` log,
the parallel-start decision, the wait loop (phase lines, pausing ready servers, stopping all on a failure) and the
demo's rows (stock baselines with the plugin excluded)."""
import io
from pathlib import Path

import pytest

from vllm_dflash.bench import demo
from vllm_dflash.serve.server import PLUGIN_NAME, START_PHASES, StartWatcher

# vLLM 0.32 start-up lines of a stock compiled server (abridged from a real log)
LOG = """(APIServer pid=1) INFO [api_utils.py:286] non-default args: {...}
(EngineCore pid=2) INFO [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='m'
(Worker pid=3) INFO [cpu_model_runner.py:68] Starting to load model m...
(Worker pid=3) INFO [cpu_model_runner.py:87] Warming up model for the compilation...
(Worker pid=3) INFO [decorators.py:743] [backbone] saved AOT compiled function to /c/torch_aot_compile/x/rank_0_0/model
(Worker pid=3) INFO [cpu_model_runner.py:91] Warming up done.
INFO:     Application startup complete.
"""


def test_start_phases_follow_the_log(tmp_path):
    """Each line moves the phase on in order; a partial last line waits for its end; a cache hit is noticed."""
    log = tmp_path / "s.log"
    w = StartWatcher(log)
    assert w.poll() == "starting processes"  # no log yet
    lines = LOG.splitlines(keepends=True)
    want = ["starting processes", "starting the engine", "loading weights", "compiling (torch.compile)",
            "warming up", "starting the API server", "ready"]
    with open(log, "w") as f:
        for line, phase in zip(lines, want, strict=True):
            f.write(line[:10])
            f.flush()
            w.poll()  # half a line: not judged yet
            f.write(line[10:])
            f.flush()
            assert w.poll() == phase
    assert not w.cached and [p for p, _ in START_PHASES] == want
    log.write_text("Initializing a V1 LLM engine\n[backbone] Directly load AOT compilation from path /c/x\n")
    w = StartWatcher(log)
    assert w.poll() == "warming up" and w.cached
    log.write_text(log.read_text() + "Starting to load model m\n")  # an earlier phase's line never moves it back
    assert w.poll() == "warming up"


def test_parallel_start_needs_memory_for_every_server():
    """Three servers start at once only with MemAvailable >= 3 x SERVER_GIB; unreadable meminfo: one at a time."""
    gib = 2**20  # kB per GiB
    assert demo.start_in_parallel(3, f"MemTotal: 1 kB\nMemAvailable: {int(3 * demo.SERVER_GIB * gib)} kB\n")
    assert not demo.start_in_parallel(3, f"MemAvailable: {int(3 * demo.SERVER_GIB * gib) - 1} kB\n")
    assert not demo.start_in_parallel(3, "garbage")


class FakeServer:
    def __init__(self, log_path, ready_after, lines, fail=False):
        self.log_path, self.ready_after, self.lines, self.fail = str(log_path), ready_after, lines, fail
        self.polls, self.paused, self.stopped = 0, False, False

    def ready(self):
        self.polls += 1
        with open(self.log_path, "a") as f:
            f.write("".join(self.lines[:1]))
        del self.lines[:1]
        if self.fail and self.polls == 2:
            raise RuntimeError("vllm serve exited with code 1 during start-up")
        return self.polls >= self.ready_after

    def pause(self):
        self.paused = True

    def stop(self):
        self.stopped = True


def test_wait_started_prints_phases_and_pauses_ready_servers(tmp_path, monkeypatch):
    """Parallel starts: a line per phase change per server with the time since launch, each server paused once ready,
    and the start-up seconds of each; a server that exits stops every server."""
    monkeypatch.setattr(demo.time, "sleep", lambda s: None)
    lines = LOG.splitlines(keepends=True)
    a = FakeServer(tmp_path / "a.log", 5, lines[1:4])  # its log is read before each health check
    b = FakeServer(tmp_path / "b.log", 7, lines[1:])
    out = io.StringIO()
    started = demo.wait_started({"a": a, "b": b}, 60, pause_ready=True, out=out)
    text = out.getvalue()
    assert set(started) == {"a", "b"} and a.paused and b.paused and not a.stopped
    assert "a: starting the engine" in text and "a: compiling (torch.compile)" in text and "a: ready" in text
    assert "b: warming up" in text and text.count("b: ready") == 1 and "] a:" in text
    c = FakeServer(tmp_path / "c.log", 9, [], fail=True)
    d = FakeServer(tmp_path / "d.log", 9, [])
    with pytest.raises(RuntimeError, match="exited"):
        demo.wait_started({"c": c, "d": d}, 60, pause_ready=True, out=io.StringIO())
    assert c.stopped and d.stopped


def test_demo_rows_are_stock_baselines_and_ours(tmp_path):
    """The demo's rows: stock vLLM without and with n-gram (the plugin excluded by VLLM_PLUGINS), then our drafter
    (the plugin loaded); the first row is the speedup's baseline."""
    (base, none_sc, none_env), (ngram, ngram_sc, ngram_env), (ours, ours_sc, ours_env) = \
        demo.demo_configs(Path(tmp_path), 8)
    assert base == demo.BASELINE and none_sc is None and ngram_sc["method"] == "ngram"
    for env in (none_env, ngram_env):
        assert PLUGIN_NAME not in env["VLLM_PLUGINS"].split(",")
    assert ours == demo.OURS == "ours" and ours_sc["method"] == "dflash" and ours_sc["num_speculative_tokens"] == 7
    assert "VLLM_PLUGINS" not in ours_env
