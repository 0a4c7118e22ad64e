# SPDX-License-Identifier: Apache-2.0
"""The house limits of issue 53, so that they hold after it: no module in vllm_dflash/ over 450 lines, thin entry
scripts in benchmarks/ (300 lines in all), user docs that fit on a screen (README <= 150 lines, docs/BENCHMARKS.md
<= 400, CHANGELOG <= 200, docs/ARCHITECTURE.md <= 120). Each test names the files over their limit."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_over_450_lines():
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "vllm_dflash").rglob("*.py"))
            if (n := _lines(p)) > 450}
    assert not long, long


def test_benchmarks_entry_scripts_are_thin():
    total = sum(_lines(p) for p in (ROOT / "benchmarks").glob("*.py"))
    assert total <= 300, total


def test_user_docs_fit():
    limits = {"README.md": 150, "docs/BENCHMARKS.md": 400, "CHANGELOG.md": 200, "docs/ARCHITECTURE.md": 120}
    over = {f: (_lines(ROOT / f), n) for f, n in limits.items() if _lines(ROOT / f) > n}
    assert not over, over
