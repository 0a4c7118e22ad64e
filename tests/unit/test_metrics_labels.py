# SPDX-License-Identifier: Apache-2.0
"""Our series as Prometheus reads them (issue 63 item 2): vLLM's labels (`model_name`, `engine`) on every one, one
series per engine; the proposal source and the guard's arm as labels, not in the names; seconds, not milliseconds;
nothing exported as a zero for what an engine does not do (a series is declared where it applies, or appears when
set). The exposition is read back with prometheus_client's own parser (`serve.tau.parse_metrics`)."""
import json
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from vllm_dflash.adaptive.controller import AdaptiveController
from vllm_dflash.adaptive.lengths import LengthPlanner
from vllm_dflash.serve import metrics as M
from vllm_dflash.serve.tau import label_values, parse_metrics


def _config(model: str, engine: int):
    """The parts of a VllmConfig that `engine_labels` reads (data_parallel_index: the engine's DP rank)."""
    return SimpleNamespace(model_config=SimpleNamespace(served_model_name=model),
                           parallel_config=SimpleNamespace(data_parallel_index=engine, data_parallel_rank=0))


def _sink(model: str, engine: int) -> M.MetricsSink:
    sink = M.MetricsSink.disabled()
    sink.labels = M.engine_labels(_config(model, engine))
    return sink


def _export(tmp_path, *sinks) -> str:
    for i, s in enumerate(sinks):
        (tmp_path / f"proc-{i}.json").write_text(json.dumps({**s.snapshot(), "pid": 1}))  # pid 1: a live writer
    registry = CollectorRegistry()
    registry.register(M.DFlashCollector(tmp_path))
    return generate_latest(registry).decode()


def test_engine_labels_are_vllms():
    assert M.engine_labels(_config("target", 2)) == {"model_name": "target", "engine": "2"}
    old = SimpleNamespace(model_config=SimpleNamespace(served_model_name="m"),
                          parallel_config=SimpleNamespace(data_parallel_rank=1))
    assert M.engine_labels(old) == {"model_name": "m", "engine": "1"}  # a config without data_parallel_index


def test_series_carry_vllms_labels_one_per_engine(tmp_path):
    """Two engines (a worker each, one engine core for engine 0): each engine's processes merge into one series
    with its labels; the source is a label of one family; parse_metrics sums over the engines."""
    w0, w1, core0 = _sink("target", 0), _sink("target", 1), _sink("target", 0)
    for s, n in ((w0, 3), (w1, 5)):
        s.declare("draft_steps", "accepted_tokens_per_step")
        s.inc("draft_steps", n)
        s.inc("proposals", n, source="dflash")
        s.inc("proposals", 1, source="none")
        s.set("block_size", 8)
    core0.observe("accepted_tokens_per_step", 2.0, n=4)
    text = _export(tmp_path, w0, w1, core0)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    steps = {s.labels["engine"]: s.value for s in fams["vllm_dflash:draft_steps"].samples if s.name.endswith("_total")}
    assert steps == {"0": 3.0, "1": 5.0}
    assert all(s.labels["model_name"] == "target" for s in fams["vllm_dflash:draft_steps"].samples)
    props = {(s.labels["engine"], s.labels["source"]): s.value for s in fams["vllm_dflash:proposals"].samples
             if s.name.endswith("_total")}
    assert props == {("0", "dflash"): 3.0, ("0", "none"): 1.0, ("1", "dflash"): 5.0, ("1", "none"): 1.0}
    count = {s.labels["engine"]: s.value for s in fams["vllm_dflash:accepted_tokens_per_step"].samples
             if s.name.endswith("_count")}
    assert count == {"0": 4.0, "1": 0.0}  # engine 0: its core's observations merged with its worker's declaration
    assert 'vllm_dflash:draft_steps_total{engine="0",model_name="target"} 3.0' in text
    m = parse_metrics(text)
    assert m["vllm_dflash:draft_steps_total"] == 8.0
    assert label_values(m, "vllm_dflash:proposals_total", "source") == {"dflash": 8.0, "none": 2.0}
    assert "vllm_dflash:metrics_snapshots_skipped_total 0.0" in text  # the collector's own: no engine labels


def test_only_what_applies_is_exported(tmp_path):
    """A fixed-block worker: no adaptive series, no gauge it did not set, no histogram it did not declare."""
    w = _sink("target", 0)
    w.declare("draft_steps", "draft_forward_seconds", "kv_injection_seconds")
    w.set("block_size", 8)
    text = _export(tmp_path, w)
    names = {f.name for f in text_string_to_metric_families(text)}
    assert names == {"vllm_dflash:draft_steps", "vllm_dflash:draft_forward_seconds", "vllm_dflash:kv_injection_seconds",
                     "vllm_dflash:block_size", "vllm_dflash:metrics_snapshots_skipped"}
    assert 'vllm_dflash:draft_forward_seconds_count{engine="0",model_name="target"} 0.0' in text  # declared at 0


@pytest.mark.parametrize("mode,sources", [("both", {"dflash", "ngram", "merged"}), ("ngram", {"ngram"}),
                                          ("dflash", {"dflash"}), ("merged", {"merged"})])
def test_adaptive_drafting_declares_the_sources_its_mode_proposes(tmp_path, mode, sources):
    w = _sink("target", 0)
    AdaptiveController(4, mode=mode, metrics=w, cross_lookup=64 if mode == "both" else 0)
    counters = w.snapshot()["counters"]
    for family in ("drafted_tokens", "accepted_tokens"):
        assert {k.split("/")[1] for k in counters if k.startswith(family + "/")} == sources
    assert {k.split("/")[1] for k in counters if k.startswith("proposals/")} == sources | {"none"}
    assert ("cross_lookups" in counters) is (mode == "both")
    assert ("context_released" in counters) is (mode in ("both", "merged"))
    assert set(counters.values()) == {0.0} and "request_steps" in counters


def test_the_overlap_planner_declares_no_speculation_and_publishes_seconds(tmp_path):
    core = _sink("target", 0)
    p = LengthPlanner(4, metrics=core)
    assert core.snapshot()["counters"] == {"proposals/none": 0.0}
    assert core.snapshot()["gauges"] == {}  # nothing fitted or measured yet: no cost or guard gauge
    p.plan(["a", "b"])
    gauges = core.snapshot()["gauges"]
    assert gauges["cost_fixed_seconds"] == pytest.approx(p.cost.alpha)  # seconds, as the fit holds it
    assert not [k for k in gauges if k.endswith("_ms")]
    text = _export(tmp_path, core)
    assert 'vllm_dflash:cost_fixed_seconds{engine="0",model_name="target"}' in text


def test_the_guard_arm_is_a_label(tmp_path):
    w = _sink("target", 0)
    w.set("guard_tokens_per_second", 120.0, arm="plan")
    w.set("guard_tokens_per_second", 80.0, arm="off")
    m = parse_metrics(_export(tmp_path, w))
    assert label_values(m, "vllm_dflash:guard_tokens_per_second", "arm") == {"plan": 120.0, "off": 80.0}


def test_a_sink_refuses_unknown_names_and_labels():
    s = M.MetricsSink.disabled()
    with pytest.raises(KeyError):
        s.inc("proposals_dflash")  # the old name
    with pytest.raises(ValueError):
        s.inc("proposals")  # no source
    with pytest.raises(ValueError):
        s.inc("draft_steps", source="dflash")  # a label the family does not have
    with pytest.raises(KeyError):
        s.set("cost_fixed_ms", 1.0)
    with pytest.raises(KeyError):
        s.declare("no_such_metric")


def test_snapshot_labels_must_be_strings():
    assert "labels" in M.snapshot_problem({"labels": {"engine": 0}})
    assert "labels" in M.snapshot_problem({"labels": ["target"]})
    assert M.snapshot_problem({"labels": {"engine": "0", "model_name": "m"}}) is None


def test_merged_keeps_only_known_series():
    m = M.merged([{"counters": {"proposals/dflash": 2, "proposals": 1, "proposals/dflash/x": 3, "drafted_tokens/": 4},
                   "gauges": {"guard_tokens_per_second/plan": 5.0, "cost_fixed_ms": 6.0}}])
    assert m["counters"] == {"draft_steps": 0.0, "request_steps": 0.0, "cross_lookups": 0.0,
                             "context_dropped_steps": 0.0, "context_released": 0.0, "proposals/dflash": 2}
    assert m["gauges"] == {"guard_tokens_per_second/plan": 5.0}
    assert M.merged([], complete=False) == {"hists": {}, "counters": {}, "gauges": {}}
