# SPDX-License-Identifier: Apache-2.0
"""MetricsSink snapshots catch up with the last observation when the process goes idle.

Regression (found by benchmarks/soak.py): flushes are throttled to one per FLUSH_INTERVAL_S and a throttled flush
was dropped, so the observations of the last drafting steps before the server went idle never reached /metrics
(vllm_dflash:accepted_tokens_per_step_count fell behind vllm:spec_decode_num_drafts_total until the next request)."""
import threading
import time

from vllm_dflash.serve import metrics as M


def _count(directory) -> int:
    return M.merged(M.read_snapshots(directory))["hists"]["accepted_tokens_per_step"]["count"]


def test_throttled_flush_is_deferred_not_dropped(tmp_path, monkeypatch):
    monkeypatch.setenv(M.ENV_DIR, str(tmp_path))
    sink = M.MetricsSink()
    sink.observe("accepted_tokens_per_step", 1.0)
    sink.flush()
    for v in (2.0, 3.0, 4.0):  # inside the throttle window: nothing written yet
        sink.observe("accepted_tokens_per_step", v)
        sink.flush()
    assert _count(tmp_path) == 1
    deadline = time.monotonic() + 5 * M.FLUSH_INTERVAL_S
    while _count(tmp_path) != 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _count(tmp_path) == 4, "the last observations never reached the snapshot"


def test_change_after_deferred_snapshot_is_flushed_too(tmp_path, monkeypatch):
    monkeypatch.setenv(M.ENV_DIR, str(tmp_path))
    sink = M.MetricsSink()
    sink.observe("accepted_tokens_per_step", 1.0)
    sink.flush()
    sink.observe("accepted_tokens_per_step", 1.0)
    sink.flush()  # deferred
    time.sleep(1.5 * M.FLUSH_INTERVAL_S)  # the deferred flush ran
    assert _count(tmp_path) == 2
    sink.observe("accepted_tokens_per_step", 1.0)
    sink.flush()  # throttled again (the deferred flush was recent): deferred once more
    time.sleep(1.5 * M.FLUSH_INTERVAL_S)
    assert _count(tmp_path) == 3


def test_no_directory_no_thread(monkeypatch):
    monkeypatch.delenv(M.ENV_DIR, raising=False)
    sink = M.MetricsSink()
    before = threading.active_count()
    sink.observe("accepted_tokens_per_step", 1.0)
    sink.flush()
    sink.flush()
    assert threading.active_count() == before
