# SPDX-License-Identifier: Apache-2.0
"""MetricsSink snapshots catch up with the last observation when the process goes idle, and the per-step flush does
no I/O on the serving thread.

Regression (found by benchmarks/soak.py): flushes were throttled to one per FLUSH_INTERVAL_S and a throttled flush
was dropped, so the observations of the last drafting steps before the server went idle never reached /metrics
(vllm_dflash:accepted_tokens_per_step_count fell behind vllm:spec_decode_num_drafts_total until the next request)."""
import threading
import time

from vllm_dflash.serve import metrics as M


def _count(directory) -> int:
    return M.merged(M.read_snapshots(directory))["hists"]["accepted_tokens_per_step"]["count"]


def _wait_for(directory, n: int) -> int:
    deadline = time.monotonic() + 6 * M.FLUSH_INTERVAL_S
    while _count(directory) != n and time.monotonic() < deadline:
        time.sleep(0.05)
    return _count(directory)


def test_last_observations_reach_the_snapshot_when_idle(tmp_path, monkeypatch):
    monkeypatch.setenv(M.ENV_DIR, str(tmp_path))
    sink = M.MetricsSink()
    for v in (1.0, 2.0, 3.0, 4.0):  # a burst of steps, then nothing
        sink.observe("accepted_tokens_per_step", v)
        sink.flush()
    assert _wait_for(tmp_path, 4) == 4, "the last observations never reached the snapshot"


def test_change_after_a_write_is_flushed_too(tmp_path, monkeypatch):
    monkeypatch.setenv(M.ENV_DIR, str(tmp_path))
    sink = M.MetricsSink()
    sink.observe("accepted_tokens_per_step", 1.0)
    sink.flush()
    assert _wait_for(tmp_path, 1) == 1
    sink.observe("accepted_tokens_per_step", 1.0)
    sink.flush()
    assert _wait_for(tmp_path, 2) == 2


def test_flush_does_no_io_on_the_calling_thread(tmp_path, monkeypatch):
    """The drafter flushes every step: the write happens on the flusher thread (force=True writes at once, here)."""
    monkeypatch.setenv(M.ENV_DIR, str(tmp_path))
    sink = M.MetricsSink()
    writers = []
    orig = sink._write
    monkeypatch.setattr(sink, "_write", lambda: (writers.append(threading.get_ident()), orig()))
    for _ in range(200):
        sink.observe("accepted_tokens_per_step", 1.0)
        sink.flush()
    assert threading.get_ident() not in writers
    assert _wait_for(tmp_path, 200) == 200 and writers and threading.get_ident() not in writers
    sink.flush(force=True)
    assert writers[-1] == threading.get_ident()


def test_no_directory_no_thread(monkeypatch):
    monkeypatch.delenv(M.ENV_DIR, raising=False)
    sink = M.MetricsSink()
    before = threading.active_count()
    sink.observe("accepted_tokens_per_step", 1.0)
    sink.flush()
    sink.flush()
    assert threading.active_count() == before


def test_a_dead_servers_snapshot_is_not_merged_and_is_pruned_at_start(tmp_path, monkeypatch):
    """A metrics folder fixed by the user (DFLASH_METRICS_DIR) outlives a server: the snapshot a previous server's
    worker left there must not add to the next server's counters. Real processes: a child writes a snapshot and
    exits; this live process writes one too."""
    import json
    import subprocess
    import sys

    monkeypatch.setenv(M.ENV_DIR, str(tmp_path))
    code = ("from vllm_dflash.serve import metrics as M; s = M.MetricsSink(); "
            "s.observe('accepted_tokens_per_step', 1.0, n=5); s.flush(force=True)")
    subprocess.run([sys.executable, "-c", code], check=True)  # the previous server's worker: wrote, then exited
    dead = list(tmp_path.glob("proc-*.json"))
    assert len(dead) == 1 and json.loads(dead[0].read_text())["hists"]["accepted_tokens_per_step"]["count"] == 5
    live = M.MetricsSink()
    live.observe("accepted_tokens_per_step", 1.0, n=2)
    live.flush(force=True)
    assert _count(tmp_path) == 2, "a dead process's snapshot was merged into /metrics"
    assert dead[0].exists(), "reading must not delete (only the owner prunes, once)"
    M.read_snapshots(tmp_path, prune=True)
    assert not dead[0].exists() and live.path.exists(), "pruning must remove the dead writer's file only"
