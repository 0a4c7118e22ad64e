# SPDX-License-Identifier: Apache-2.0
"""The PromQL queries the docs print (README.md and docs/METRICS.md) and the Grafana dashboard's form of them
(examples/grafana-dflash.json), for the dashboard's unit test (tests/unit/test_metrics_dashboard.py) and the
Prometheus test (tests/e2e/test_prometheus.py).

A documented query is every line of a ```promql block that is not a comment, and every inline code span with a
`rate(<metric>` in it. A dashboard panel uses a documented query with `[$__rate_interval]` for `[1m]` and the
dashboard's `FILTER` on every series it selects (`dashboard_form`)."""
from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/METRICS.md")
DASHBOARD = ROOT / "examples" / "grafana-dflash.json"
FILTER = '{model_name=~"$model_name",engine=~"$engine"}'  # the dashboard's variables: one model, one engine or all
_BLOCK = re.compile(r"```promql\n(.*?)```", re.S)
_INLINE = re.compile(r"(?<!`)`([^`\n]*\brate\([a-z_:][^`\n]*)`(?!`)")
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\[1m\]")  # a series selected over the documented window


def documented_queries() -> list[str]:
    """Every PromQL query README.md and docs/METRICS.md print, in order, once each."""
    out: list[str] = []
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        for block in _BLOCK.findall(text):
            out += [ln.strip() for ln in block.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        out += _INLINE.findall(text)
    return list(dict.fromkeys(out))


def dashboard_form(query: str) -> str:
    """A documented query as the dashboard writes it: `[$__rate_interval]` and the dashboard's filter."""
    return _SELECTOR.sub(lambda m: m.group(1) + FILTER + "[$__rate_interval]", query)


def documented_form(expr: str) -> str:
    """`dashboard_form` undone."""
    return expr.replace(FILTER, "").replace("[$__rate_interval]", "[1m]")


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, expr) of every query target of every panel of examples/grafana-dflash.json."""
    board = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p.get("targets", [])]


def metric_names(query: str) -> set[str]:
    """The series names a query selects (documented form)."""
    return set(_SELECTOR.findall(query))
