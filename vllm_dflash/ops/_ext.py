# SPDX-License-Identifier: Apache-2.0
"""Loads the csrc/ kernels once and says (once) why a faster path is off.

`vllm_dflash._C` (CPU C++, built by setup.py during the normal set-up) registers
`torch.ops.vllm_dflash.fused_context_kv{,_to_cache}` for CPU; `vllm_dflash._C_cuda` (built when nvcc and
a CUDA torch exist) adds the CUDA implementations of the same ops.
The setting kv_injection (auto | fused | reference; docs/CONFIGURATION.md) picks the path: inside vLLM our model
applies its engine's value with `kv_injection_mode`; elsewhere (tests, benchmarks) DFLASH_KV_INJECTION or auto."""
from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
from typing import Iterator

import torch

from vllm_dflash import settings

from vllm_dflash.utils import get_logger

logger = get_logger(__name__)


@functools.lru_cache(maxsize=None)
def _load(module: str) -> str | None:
    """None when loaded, else the reason it is unavailable."""
    try:
        importlib.import_module(module)
        return None
    except (ImportError, OSError) as e:
        return f"{module} not importable ({e}); rebuild with `pip install -e . --no-build-isolation` (scripts/setup.sh)"


@functools.lru_cache(maxsize=None)
def _warn_once(msg: str) -> None:
    logger.warning("vllm_dflash KV injection: %s -> PyTorch reference path", msg)


_MODE: contextvars.ContextVar[str | None] = contextvars.ContextVar("vllm_dflash_kv_injection", default=None)


@contextlib.contextmanager
def kv_injection_mode(value: str) -> Iterator[None]:
    """Use this KV-injection mode inside the block (an engine's setting), whatever the environment says."""
    token = _MODE.set(settings.parse_value("kv_injection", value))
    try:
        yield
    finally:
        _MODE.reset(token)


def mode() -> str:
    """auto | fused | reference: the innermost `kv_injection_mode`, else DFLASH_KV_INJECTION, else auto."""
    m = _MODE.get()
    if m is not None:
        return m
    return settings.env_default("kv_injection")


def fused_available(device: torch.device) -> bool:
    """Whether the fused op exists for `device`; logs once why not (unless the reference path was asked for)."""
    if mode() == "reference":
        return False
    why = _load("vllm_dflash._C")
    if why is None and device.type == "cuda":
        why = _load("vllm_dflash._C_cuda")
    elif why is None and device.type != "cpu":
        why = f"no fused kernel for device type {device.type!r}"
    if why is not None:
        if mode() == "fused":
            raise RuntimeError(f"kv_injection=fused (speculative_config.kv_injection or DFLASH_KV_INJECTION) but "
                               f"{why}. Fix: build the kernel, or use kv_injection 'auto' or 'reference'")
        _warn_once(why)
        return False
    return True
