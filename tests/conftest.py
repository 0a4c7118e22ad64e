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
def _no_leaked_plugin_env():
    """A test that configures DFlash in this process (an engine config built in-process) makes pytest the owner of a
    metrics folder and exports DFLASH_METRICS_DIR (the process marker DFLASH_PLUGIN_ACTIVE is set only while a
    DFlash engine starts its processes, and restored after); a test of the collector sets DFLASH_VLLM_EXTRAS. Servers, engines and probes that later tests start would inherit them: the
    earlier runs' snapshots merged into their counters, and the patches applied in processes that never asked for
    DFlash (the walls). Every plugin variable (DFLASH_*, VLLM_DFLASH_*) is restored after every test."""
    def plugin_env() -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if k.startswith(("DFLASH_", "VLLM_DFLASH_"))}

    before = plugin_env()
    yield
    for name in set(plugin_env()) - set(before):
        os.environ.pop(name, None)
    os.environ.update(before)


# The longest test files, longest first (seconds per file in CI, 3 workers on 2 cores: the mixed-source soak check
# about 370, the TP tests, collection and test_vllm_patches 200-340, the served, soak, compile-cache and engine tests
# 100-250 each). Under pytest-xdist a file goes to one worker (scripts/test.sh: --dist loadfile --no-loadscope-reorder,
# so files are handed out in collection order): started first, the long files run beside each other and the short ones
# fill the gaps. Handed out last (xdist's default orders files by how many tests they hold, which put these few-test
# files at the end), one of them ran alone on one worker for minutes.
LONGEST_FIRST = (
    # ranked from stop 65's CI run (--durations, 3 workers on 2 cores): a file's longest tests summed
    "e2e/test_mixed_served.py", "vllm/test_tp.py", "e2e/test_collect.py", "vllm/test_vllm_patches.py",
    "vllm/test_vllm_compile_cache.py", "e2e/test_calibration_served.py", "vllm/test_vllm_serve.py", "e2e/test_soak.py",
    "vllm/test_vllm_drafter.py", "vllm/test_draft_layouts.py", "e2e/test_prometheus.py", "vllm/test_vllm_cpu_gemv.py",
    "vllm/test_vllm_sampling_mixed.py", "e2e/test_wheel_install.py", "vllm/test_vllm_adaptive.py",
    "vllm/test_vllm_position_range.py", "vllm/test_vllm_lora.py", "e2e/test_soak_features_served.py",
    "e2e/test_vllm_bench_serve.py", "e2e/test_eval_cli.py", "vllm/test_vllm_gemm_f32.py",
    "vllm/test_vllm_deferred_injection.py", "vllm/test_walls_one_process.py", "vllm/test_vllm_sampling.py",
    "vllm/test_vllm_cross_lookup.py", "vllm/test_walls.py", "e2e/test_exactness_served.py", "vllm/test_vllm_profile.py",
    "vllm/test_vllm_hinted.py",
)


_LONG_RANK = {rel: i for i, rel in enumerate(LONGEST_FIRST)}


def _run_order(item) -> tuple[int, int]:
    """The nvcc compile check (marker `build`, ~100 s in one file) first, then LONGEST_FIRST, then the rest."""
    if item.get_closest_marker("build") is not None:
        return (0, 0)
    path = item.path.resolve()
    rel = path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else ""
    return (1, _LONG_RANK[rel]) if rel in _LONG_RANK else (2, 0)


def pytest_collection_modifyitems(config, items):
    """Long files first (see LONGEST_FIRST). Stable: the order inside a file and among the rest is unchanged."""
    items.sort(key=_run_order)
