# SPDX-License-Identifier: Apache-2.0
"""The compile-cache key covers our CPU linear routing (integration/patches/aot_compile_load.py `with_routing`).

Regression (issue 61 item 5, review NEW-4): with the compile cache loading on CPU, vLLM's key
(`aot_compile_hash_factors`) missed DFLASH_CPU_GEMM_F32 / DFLASH_CPU_GEMV / DFLASH_VLLM_EXTRAS, which decide whether a
linear layer runs vLLM's oneDNN closure or our packed-weight op: a start could load a graph traced for the other.
vLLM's factors are stood in for by a constant list here (the real key: tests/vllm/test_vllm_compile_cache.py)."""
from types import SimpleNamespace

import pytest

from vllm_dflash.integration.patches.aot_compile_load import with_routing
from vllm_dflash.ops.gemm_f32 import gemm_f32_supported
from vllm_dflash.ops.gemv import gemv_supported

VLLM_FACTORS = ["env", "config"]
key = with_routing(lambda vllm_config: list(VLLM_FACTORS))


def _config(dflash: bool = True, device: str = "cpu") -> SimpleNamespace:
    spec = SimpleNamespace(method="dflash") if dflash else None
    return SimpleNamespace(speculative_config=spec, additional_config={"dflash": {"drafter": "ours"}},
                           device_config=SimpleNamespace(device_type=device))


@pytest.fixture
def env(monkeypatch):
    for name in ("DFLASH_CPU_GEMM_F32", "DFLASH_CPU_GEMV", "DFLASH_VLLM_EXTRAS"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv("VLLM_" + name, raising=False)

    def set_env(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(f"DFLASH_{name.upper()}", value)

    return set_env


@pytest.mark.skipif(not gemm_f32_supported(), reason="the fp32 GEMM needs avx2 and fma (and the built extension)")
def test_fp32_routing_changes_the_key(env):
    env(cpu_gemm_f32="all")
    ours = key(_config())
    assert ours[:2] == VLLM_FACTORS and len(ours) == 3, ours
    env(cpu_gemm_f32="8")
    assert key(_config()) != ours  # another row limit: another graph constant
    env(cpu_gemm_f32="off")
    assert key(_config()) == VLLM_FACTORS  # every layer on vLLM's GEMM: vLLM's key unchanged


@pytest.mark.skipif(not gemm_f32_supported(), reason="the fp32 GEMM needs avx2 and fma (and the built extension)")
def test_vllm_extras_decides_for_engines_without_our_drafter(env):
    env(cpu_gemm_f32="all")
    assert key(_config(dflash=False)) == VLLM_FACTORS  # the plugin leaves such an engine alone
    env(vllm_extras="fixes")
    assert key(_config(dflash=False)) == VLLM_FACTORS  # fixes only: no GEMM of ours
    env(vllm_extras="all")
    assert key(_config(dflash=False)) == key(_config()) != VLLM_FACTORS


@pytest.mark.skipif(not gemv_supported(), reason="the bf16 GEMV needs avx512_bf16 (and the built extension)")
def test_bf16_routing_changes_the_key(env):
    env(cpu_gemm_f32="off")
    assert key(_config()) == VLLM_FACTORS  # cpu_gemv is off by default
    env(cpu_gemm_f32="off", cpu_gemv="4")
    four = key(_config())
    env(cpu_gemv="8")
    assert VLLM_FACTORS != four != key(_config()) != VLLM_FACTORS


def test_no_factor_off_cpu(env):
    env(cpu_gemm_f32="all", cpu_gemv="8")
    assert key(_config(device="cuda")) == VLLM_FACTORS
