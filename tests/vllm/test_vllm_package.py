# SPDX-License-Identifier: Apache-2.0
"""Packaging with vLLM imported: register() is idempotent and applies nothing by itself (the walls), the patches go in
place once DFlash is configured, and on another vLLM only DFlash is disabled (split from tests/unit/test_package.py,
which never imports vLLM)."""
import os
import subprocess
import sys


def test_register_idempotent_and_patches_in_place():
    code = """
import sys
import vllm_dflash
vllm_dflash.register(); vllm_dflash.register()
from vllm_dflash.integration import patches
from vllm_dflash.integration.patches import PATCHES, SEAM_PROBLEMS
assert not patches._APPLIED and "vllm.v1.worker.gpu_model_runner" not in sys.modules  # nothing until DFlash
assert patches.activate() == []  # what configuring DFlash does: the seam holds on the installed vLLM
assert not SEAM_PROBLEMS, SEAM_PROBLEMS  # every patch applied
from vllm.v1.worker import gpu_model_runner as g
from vllm.v1.spec_decode.dflash import DFlashProposer
assert g.DFlashProposer.__name__ == "DFlashProposerSwitch"
assert issubclass(__import__("vllm_dflash.integration.proposer", fromlist=["x"]).DFlashDrafter, DFlashProposer)
assert all(p.why and p.removal and p.symbol for p in PATCHES)
print("ok", len(PATCHES))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-2000:]


def test_version_guard():
    """On another vLLM version the real entry point never raises (vLLM calls it for every use) and checks nothing
    until DFlash is configured: vLLM without DFlash untouched (also through vLLM's own plugin loading in EngineArgs);
    configuring DFlash runs the check, applies no patch, warns once and fails before any engine with the problems and
    the fix. Stand-in configs: no model is loaded."""
    code = """
import vllm
vllm.__version__ = "0.33.0"
import vllm_dflash
vllm_dflash.register()
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.worker import gpu_model_runner as g
from vllm_dflash.integration.patches import SEAM_PROBLEMS, UnsupportedVLLMError
assert not SEAM_PROBLEMS  # not checked yet: nothing asked for DFlash
assert EngineArgs(model="m").create_speculative_config(None, None) is None  # plain vLLM
for kw in ({"speculative_config": {"method": "dflash", "model": "d"}}, {"spec_method": "dflash", "spec_model": "d"}):
    try:
        EngineArgs(model="m", **kw).create_speculative_config(None, None)
        raise SystemExit("DFlash was not refused")
    except UnsupportedVLLMError as e:
        msg = str(e)
assert "0.33.0" in msg and "install vllm 0.32.x" in msg and "VLLM_PLUGINS" in msg, msg
assert g.DFlashProposer.__name__ == "DFlashProposer", g.DFlashProposer  # no patch applied
assert len(SEAM_PROBLEMS) == 1 and "0.33.0" in SEAM_PROBLEMS[0], SEAM_PROBLEMS
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if not k.endswith("SKIP_VERSION_CHECK") and k != "VLLM_PLUGINS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), (out.stdout[-1000:], out.stderr[-3000:])
    warnings = [line for line in out.stderr.splitlines() if "DFlash is disabled" in line]
    assert len(warnings) == 1, out.stderr[-3000:]  # one warning, although vLLM loads the plugin again
