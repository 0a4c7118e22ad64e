# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures for every tier (tests/unit, tests/vllm, tests/e2e): tiny random target/draft pairs built once per
session (seconds, no downloads), the trained tiny pair in tests/assets. Puts tests/ on sys.path so that every tier
imports the shared support package as `support` (support.testing, support.vllm_helpers)."""
import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Under pytest-xdist (scripts/test.sh runs one worker per core) every worker's engines bind their OpenMP threads to
# the worker's own core. vLLM's "auto" binding would put every worker's engine on the same core and leave the other
# idle. A test that sets its own layout (the TP tests' "0|1") still overrides this.
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...
if _XDIST_WORKER.startswith("gw") and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(int(_XDIST_WORKER[2:]) % (os.cpu_count() or 1))


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    from support.testing import build_tiny_draft, build_tiny_target

    root = tmp_path_factory.mktemp("tiny")
    build_tiny_target(root / "target")
    for b in (4, 8, 16):
        build_tiny_draft(root / f"draft-b{b}", root / "target", block_size=b)
    return root


@pytest.fixture(scope="session")
def tiny_target(tiny_dir):
    from support.testing import load_target

    return load_target(tiny_dir / "target")


ASSETS = TESTS / "assets" / "tiny-pair"


@pytest.fixture(scope="session")
def pair() -> Path:
    """Tiny target + trained DFlash drafts (tests/assets/tiny-pair, built by scripts/make_test_assets.py)."""
    assert (ASSETS / "target" / "config.json").exists(), "run scripts/make_test_assets.py"
    return ASSETS


@pytest.fixture(autouse=True)
def _no_leaked_metrics_dir():
    """A test that loads our plugin in this process (vLLM's `load_general_plugins`) makes pytest the owner of a metrics
    folder and exports DFLASH_METRICS_DIR. Servers and engines that later tests start would inherit it and merge the
    earlier runs' snapshots into their counters. Restore the variables after every test."""
    from vllm_dflash.settings import deprecated_env_name, env_name

    names = (env_name("metrics_dir"), deprecated_env_name("metrics_dir"))
    before = {n: os.environ.get(n) for n in names}
    yield
    for n, v in before.items():
        if v is None:
            os.environ.pop(n, None)
        else:
            os.environ[n] = v


def pytest_collection_modifyitems(config, items):
    """The nvcc compile check (marker `build`, ~100 s in one file) first: under pytest-xdist a file goes to one worker,
    and run last it kept that worker busy alone for its whole length. Stable: the order is otherwise unchanged."""
    items.sort(key=lambda item: item.get_closest_marker("build") is None)
