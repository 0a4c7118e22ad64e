# SPDX-License-Identifier: Apache-2.0
"""Packaging without vLLM: the entry points resolve, importing the package is cheap, the CLI answers --help.
register() (idempotent, version-guarded) imports vLLM: tests/vllm/test_vllm_package.py."""
import importlib.metadata as md
import subprocess
import sys


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


def test_cli_help():
    out = subprocess.run([sys.executable, "-m", "vllm_dflash.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for cmd in ("prepare-target", "collect", "train", "eval", "demo", "bench"):
        assert cmd in out.stdout
