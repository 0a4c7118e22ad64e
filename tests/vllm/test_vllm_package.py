# SPDX-License-Identifier: Apache-2.0
"""Packaging with vLLM imported: register() is idempotent, patches in place, and on another vLLM disables DFlash only
(split from tests/unit/test_package.py, which never imports vLLM)."""
import os
import subprocess
import sys


def test_register_idempotent_and_patches_in_place():
    code = """
import vllm_dflash
vllm_dflash.register(); vllm_dflash.register()
from vllm.v1.worker import gpu_model_runner as g
from vllm.v1.spec_decode.dflash import DFlashProposer
from vllm_dflash.integration.patches import PATCHES, SEAM_PROBLEMS
assert not SEAM_PROBLEMS, SEAM_PROBLEMS  # the seam holds on the installed vLLM: every patch applied
assert g.DFlashProposer.__name__ == "DFlashProposerSwitch"
assert issubclass(__import__("vllm_dflash.integration.proposer", fromlist=["x"]).DFlashDrafter, DFlashProposer)
assert all(p.why and p.removal and p.symbol for p in PATCHES)
print("ok", len(PATCHES))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-2000:]


def test_version_guard():
    """On another vLLM version the real entry point never raises (vLLM calls it for every use): no patch applied, one
    warning, vLLM without DFlash untouched (also through vLLM's own plugin loading in EngineArgs), and configuring
    DFlash fails before any engine with the problems and the fix. Stand-in configs: no model is loaded."""
    code = """
import vllm
vllm.__version__ = "0.33.0"
import vllm_dflash
vllm_dflash.register()
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.worker import gpu_model_runner as g
from vllm_dflash.integration.patches import SEAM_PROBLEMS, UnsupportedVLLMError
assert g.DFlashProposer.__name__ == "DFlashProposer", g.DFlashProposer  # no patch applied
assert len(SEAM_PROBLEMS) == 1 and "0.33.0" in SEAM_PROBLEMS[0], SEAM_PROBLEMS
assert EngineArgs(model="m").create_speculative_config(None, None) is None  # plain vLLM
for kw in ({"speculative_config": {"method": "dflash", "model": "d"}}, {"spec_method": "dflash", "spec_model": "d"}):
    try:
        EngineArgs(model="m", **kw).create_speculative_config(None, None)
        raise SystemExit("DFlash was not refused")
    except UnsupportedVLLMError as e:
        msg = str(e)
assert "0.33.0" in msg and "install vllm 0.32.x" in msg and "VLLM_PLUGINS" in msg, msg
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if not k.endswith("SKIP_VERSION_CHECK") and k != "VLLM_PLUGINS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), (out.stdout[-1000:], out.stderr[-3000:])
    warnings = [line for line in out.stderr.splitlines() if "DFlash is disabled" in line]
    assert len(warnings) == 1, out.stderr[-3000:]  # one warning, although vLLM loads the plugin again
