# SPDX-License-Identifier: Apache-2.0
"""A wrong-shape file in the metrics folder never breaks /metrics: the collector leaves it out, logs it once and
counts it in vllm_dflash:metrics_snapshots_skipped_total, and the good snapshots beside it are still exported.

Regression (issue 51 item 6, review M-1): only unreadable JSON was skipped; any other shape raised out of
`DFlashCollector.collect` (so `generate_latest` of the registry vLLM serves failed, vLLM's own metrics included), and a
histogram with another bucket count was silently cut to the shorter one. Issue 61 item 5 (review NEW-5): a counter
this version does not know, with a value that is not a number, passed the check and then raised in `merged`."""
import json
import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from vllm_dflash.serve import metrics as M

N_ACCEPT = len(M.HISTOGRAMS["accepted_tokens_per_step"][1])
GOOD_HIST = {"counts": [0] * N_ACCEPT, "sum": 0.0, "count": 0}

BAD = {
    "null": None,
    "list": [],
    "hist_is_list": {"hists": {"accepted_tokens_per_step": [1, 2, 3]}},
    "hist_without_sum": {"hists": {"accepted_tokens_per_step": {"counts": [0] * N_ACCEPT, "count": 0}}},
    "counter_is_text": {"counters": {"draft_steps": "5"}},
    "gauge_is_text": {"gauges": {"block_size": "x"}},
    "time_is_text": {"time": "late", "counters": {"draft_steps": 1}},
    "hist_wrong_bucket_count": {"hists": {"accepted_tokens_per_step": {"counts": [7], "sum": 7.0, "count": 7}}},
    "hists_not_object": {"hists": 3},
    "counter_is_bool": {"counters": {"draft_steps": True}},
    "unknown_counter_is_text": {"counters": {"a_newer_metric": "x"}},  # review-scripts/m1.py
    "unknown_counter_is_list": {"counters": {"a_newer_metric": [1]}},
    "unknown_gauge_is_text": {"gauges": {"a_newer_gauge": "x"}},
}


def _scrape(tmp_path, bad_text: str) -> tuple[str, list[str]]:
    (tmp_path / "proc-1.json").write_text(bad_text)  # pid 1 is alive: only its shape can exclude it
    good = M.MetricsSink.disabled()  # no folder of its own: written by hand below
    good.observe("accepted_tokens_per_step", 3.0, n=4)
    good.inc("draft_steps", 11)
    (tmp_path / "proc-2.json").write_text(json.dumps({**good.snapshot(), "pid": 1}))
    registry = CollectorRegistry()
    collector = M.DFlashCollector(tmp_path)
    registry.register(collector)
    warnings: list[str] = []

    class _Catch(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())

    handler = _Catch(level=logging.WARNING)
    M.logger.addHandler(handler)
    try:
        text = generate_latest(registry).decode()
        text = generate_latest(registry).decode()  # a second scrape: the same file is not counted again
    finally:
        M.logger.removeHandler(handler)
    return text, warnings


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_snapshot_is_skipped_and_counted(tmp_path, case):
    """generate_latest does not raise; the good snapshot's values are exported unchanged (nothing of the bad file is
    merged: histogram buckets all present); the skip is counted once and logged once."""
    text, warnings = _scrape(tmp_path, json.dumps(BAD[case]))
    assert "vllm_dflash:draft_steps_total 11.0" in text
    assert 'vllm_dflash:accepted_tokens_per_step_bucket{le="3.0"} 4.0' in text
    assert 'vllm_dflash:accepted_tokens_per_step_bucket{le="16.0"} 4.0' in text  # not cut to a shorter list
    assert "vllm_dflash:accepted_tokens_per_step_count 4.0" in text
    assert "vllm_dflash:metrics_snapshots_skipped_total 1.0" in text
    assert len(warnings) == 1 and "proc-1.json" in warnings[0]


@pytest.mark.parametrize("raw", ["{not json", "", "[1, 2"])
def test_an_unreadable_snapshot_is_skipped_and_counted(tmp_path, raw):
    text, _ = _scrape(tmp_path, raw)
    assert "vllm_dflash:draft_steps_total 11.0" in text
    assert "vllm_dflash:metrics_snapshots_skipped_total 1.0" in text


def test_a_valid_snapshot_passes_the_check():
    sink = M.MetricsSink.disabled()
    sink.observe("accepted_tokens_per_step", 2.0)
    assert M.snapshot_problem(sink.snapshot()) is None
    assert M.snapshot_problem({}) is None  # nothing to merge is not wrong
    newer = {"counters": {"a_newer_metric": 2}, "gauges": {"a_newer_gauge": 3.0}, "hists": {"a_newer_hist": [1]}}
    assert M.snapshot_problem(newer) is None  # names this version does not know: numbers, or a histogram of any shape
    assert "not a number" in M.snapshot_problem({"counters": {"a_newer_metric": "x"}})
    assert "bucket" in M.snapshot_problem({"hists": {"accepted_tokens_per_step": {**GOOD_HIST, "counts": [1]}}})


def test_merged_exports_only_known_names():
    m = M.merged([{"counters": {"a_newer_metric": 2, "draft_steps": 1}, "gauges": {"a_newer_gauge": 3.0},
                   "hists": {"a_newer_hist": [1]}}])
    assert m["counters"]["draft_steps"] == 1 and "a_newer_metric" not in m["counters"]
    assert "a_newer_gauge" not in m["gauges"] and "a_newer_hist" not in m["hists"]
