# SPDX-License-Identifier: Apache-2.0
"""Compile-check of the CUDA kernel (csrc/kv_injection_cuda.cu) with nvcc, on machines without a GPU.

The CPU torch wheel ships the c10/ATen CUDA headers but not the generated `cuda_cmake_macros.h`; a one-line
stand-in is written to a temporary include dir for this check only (a CUDA torch has the real one, and
setup.py builds the extension normally there). Runs the GPU equality test instead when a GPU exists
(tests/unit/test_kv_injection.py::test_cuda_kernel_equals_reference)."""
from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the repository


@pytest.mark.build  # about a minute of nvcc: not in the fast path (scripts/test.sh --unit)
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.timeout(600)
def test_cuda_kernel_compiles_with_nvcc(tmp_path):
    from torch.utils.cpp_extension import include_paths

    shim = tmp_path / "shim" / "c10" / "cuda" / "impl"
    shim.mkdir(parents=True)
    (shim / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    cmd = ["nvcc", "-std=c++20", "-O3", "-arch=sm_90", "-c", str(ROOT / "csrc" / "kv_injection_cuda.cu"),
           "-o", str(tmp_path / "kv_injection_cuda.o"), f"-I{tmp_path / 'shim'}",
           *[f"-I{p}" for p in include_paths()], f"-I{sysconfig.get_paths()['include']}",
           "-DTORCH_EXTENSION_NAME=_C_cuda", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=580)
    errors = [l for l in (r.stdout + r.stderr).splitlines() if " error" in l or "fatal" in l]
    assert r.returncode == 0 and not errors, "\n".join(errors[:20]) or r.stderr[-3000:]
    assert (tmp_path / "kv_injection_cuda.o").stat().st_size > 10_000
    # the Python module of the library (setup.py builds it beside the .cu with the host compiler)
    mod = subprocess.run(["g++", "-std=c++20", "-O3", "-fPIC", "-c", str(ROOT / "csrc" / "kv_injection_cuda_module.cpp"),
                          "-o", str(tmp_path / "module.o"), f"-I{sysconfig.get_paths()['include']}"],
                         capture_output=True, text=True, timeout=120)
    assert mod.returncode == 0, mod.stderr[-3000:]
    if shutil.which("nm"):  # the kernels' registration in one object, the module's entry point in the other
        syms = subprocess.run(["nm", "-C", str(tmp_path / "kv_injection_cuda.o")], capture_output=True, text=True).stdout
        assert "fused_context_kv_to_cache_cuda" in syms and "fused_context_kv_cuda" in syms
        init = subprocess.run(["nm", str(tmp_path / "module.o")], capture_output=True, text=True).stdout
        assert "T PyInit__C_cuda" in init, init
