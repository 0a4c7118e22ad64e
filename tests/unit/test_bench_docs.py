# SPDX-License-Identifier: Apache-2.0
"""docs/BENCHMARKS.md and dev/BENCHMARKS-history.md are what dev/make_bench_docs.py renders from the result files,
the user-facing one stays short, and the user docs' size limits hold (issue 53)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_benchmark_docs_are_current():
    """`python dev/make_bench_docs.py --check` passes: neither generated file differs from its result files."""
    r = subprocess.run([sys.executable, "dev/make_bench_docs.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_user_docs_fit_their_limits():
    """README.md <= 150 lines, docs/BENCHMARKS.md <= 400, CHANGELOG.md <= 200, docs/ARCHITECTURE.md <= 120, and the
    README keeps the spot where stock-vLLM results go."""
    limits = {"README.md": 150, "docs/BENCHMARKS.md": 400, "CHANGELOG.md": 200, "docs/ARCHITECTURE.md": 120}
    for name, limit in limits.items():
        n = len((ROOT / name).read_text().splitlines())
        assert n <= limit, f"{name} has {n} lines, over {limit}. Fix: move detail to dev/ or docs/"
    assert "<!-- results: stock -->" in (ROOT / "README.md").read_text()
