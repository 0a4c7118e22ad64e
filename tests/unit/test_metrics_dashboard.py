# SPDX-License-Identifier: Apache-2.0
"""The Grafana dashboard (examples/grafana-dflash.json) is built on the documented queries (README.md,
docs/METRICS.md): every panel's query is one of them in the dashboard's form (`[$__rate_interval]`, the model and
engine filter), every documented query has a panel, and every series they select exists: ours in
serve/metric_names.py, vLLM's in the installed vLLM's source. That the queries return the bench's figures in a real
Prometheus is tests/e2e/test_prometheus.py (issue 63 item 2)."""
import importlib.util
import json
import re
from pathlib import Path

import pytest
from support.promql import DASHBOARD, dashboard_exprs, dashboard_form, documented_form, documented_queries, metric_names

from vllm_dflash.serve.metric_names import COUNTERS, GAUGES, HISTOGRAMS, PREFIX


def test_the_docs_print_queries():
    queries = documented_queries()
    assert len(queries) >= 8, queries
    assert "rate(vllm:generation_tokens_total[1m]) / rate(vllm_dflash:request_steps_total[1m])" in queries  # README


def test_every_panel_is_a_documented_query_and_every_query_has_a_panel():
    queries = documented_queries()
    exprs = dashboard_exprs()
    assert exprs
    for title, expr in exprs:
        assert documented_form(expr) in queries, (title, expr)
        assert dashboard_form(documented_form(expr)) == expr, (title, expr)  # the filter on every series
    assert set(queries) <= {documented_form(e) for _, e in exprs}, "a documented query has no panel"


def test_the_dashboard_declares_its_variables():
    board = json.loads(DASHBOARD.read_text())
    names = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "model_name", "engine"} <= names
    for p in board["panels"]:
        assert p["datasource"]["uid"] == "${datasource}" and p["title"] and p["gridPos"]
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])


def _ours(name: str) -> bool:
    base = name[len(PREFIX):]
    for suffix in ("_total", "_sum", "_count", "_bucket"):
        if base.endswith(suffix) and base[: -len(suffix)] in (COUNTERS if suffix == "_total" else HISTOGRAMS):
            return True
    return base in GAUGES


def _vllm_names() -> set[str]:
    """Every "vllm:..." name string in the installed vLLM's v1 sources (read as text: this tier imports no vLLM)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed")
    root = Path(next(iter(spec.submodule_search_locations))) / "v1"
    return {m for f in root.rglob("*.py") for m in re.findall(r'"(vllm:[a-z_]+)"', f.read_text(errors="replace"))}


def test_every_series_a_query_selects_exists():
    vllm = None
    for q in documented_queries():
        for name in metric_names(q):
            if name.startswith(PREFIX):
                assert _ours(name), (name, q)
            else:
                vllm = vllm if vllm is not None else _vllm_names()
                base = re.sub(r"_(total|sum|count|bucket)$", "", name)
                assert base in vllm, (name, q)
