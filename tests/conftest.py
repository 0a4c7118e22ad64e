# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures: tiny random target/draft pairs built once per session (seconds, no downloads)."""
import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    from vllm_dflash.testing import build_tiny_draft, build_tiny_target

    root = tmp_path_factory.mktemp("tiny")
    build_tiny_target(root / "target")
    for b in (4, 8, 16):
        build_tiny_draft(root / f"draft-b{b}", root / "target", block_size=b)
    return root


@pytest.fixture(scope="session")
def tiny_target(tiny_dir):
    from vllm_dflash.testing import load_target

    return load_target(tiny_dir / "target")


ASSETS = Path(__file__).parent / "assets" / "tiny-pair"


@pytest.fixture(scope="session")
def pair() -> Path:
    """Tiny target + trained DFlash drafts (tests/assets/tiny-pair, built by scripts/make_test_assets.py)."""
    assert (ASSETS / "target" / "config.json").exists(), "run scripts/make_test_assets.py"
    return ASSETS
