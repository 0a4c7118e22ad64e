# SPDX-License-Identifier: Apache-2.0
"""Packaging with vLLM imported: register() is idempotent, patches in place and is version-guarded (split from
tests/unit/test_package.py, which never imports vLLM)."""
import subprocess
import sys

import pytest


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
