# SPDX-License-Identifier: Apache-2.0
"""Packaging: the vLLM entry point resolves and register() is idempotent and version-guarded."""
import importlib.metadata as md
import subprocess
import sys

import pytest


def test_entry_points_resolve():
    eps = md.entry_points(group="vllm.general_plugins")
    ours = [e for e in eps if e.name == "vllm_dflash"]
    assert ours and ours[0].value == "vllm_dflash:register"
    assert callable(ours[0].load())
    scripts = [e for e in md.entry_points(group="console_scripts") if e.name == "vllm-dflash"]
    assert scripts and scripts[0].value == "vllm_dflash.cli:main"


def test_import_is_cheap():
    """Importing the package (what vLLM's plugin loader does first) must not import torch or vLLM."""
    code = "import sys, vllm_dflash; print('torch' in sys.modules, 'vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_register_idempotent_and_patches_in_place():
    code = """
import vllm_dflash
vllm_dflash.register(); vllm_dflash.register()
from vllm.v1.worker import gpu_model_runner as g
from vllm.v1.spec_decode.dflash import DFlashProposer
from vllm_dflash.integration.patches import PATCHES
assert g.DFlashProposer.__name__ == "DFlashProposerSwitch"
assert issubclass(__import__("vllm_dflash.integration.proposer", fromlist=["x"]).DFlashDrafter, DFlashProposer)
assert all(p.why and p.removal and p.symbol for p in PATCHES)
print("ok", len(PATCHES))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-2000:]


def test_version_guard(monkeypatch):
    import vllm

    from vllm_dflash.integration import patches

    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    monkeypatch.delenv("VLLM_DFLASH_SKIP_VERSION_CHECK", raising=False)
    with pytest.raises(patches.UnsupportedVLLMError, match="0.32"):
        patches._check_version()


def test_cli_help():
    out = subprocess.run([sys.executable, "-m", "vllm_dflash.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for cmd in ("prepare-target", "collect", "train", "eval", "demo", "bench"):
        assert cmd in out.stdout
