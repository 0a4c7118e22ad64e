# SPDX-License-Identifier: Apache-2.0
"""Loads the csrc/ kernels once and says (once) why a faster path is off.

`vllm_dflash._C` (CPU C++, built by setup.py during the normal set-up) registers
`torch.ops.vllm_dflash.fused_context_kv{,_to_cache}` for CPU; `vllm_dflash._C_cuda` (built when nvcc and
a CUDA torch exist) adds the CUDA implementations of the same ops.
VLLM_DFLASH_KV_INJECTION=reference forces the PyTorch path (debugging / comparisons)."""
from __future__ import annotations

import functools
import importlib
import os

import torch

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


def mode() -> str:
    m = os.environ.get("VLLM_DFLASH_KV_INJECTION", "auto")
    if m not in ("auto", "fused", "reference"):
        raise ValueError(f"VLLM_DFLASH_KV_INJECTION={m!r}: expected auto, fused or reference")
    return m


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
            raise RuntimeError(f"VLLM_DFLASH_KV_INJECTION=fused but {why}")
        _warn_once(why)
        return False
    return True
