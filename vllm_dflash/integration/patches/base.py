# SPDX-License-Identifier: Apache-2.0
"""The ledger's entry type (every module in this package defines one PATCH), the error for an unsupported vLLM, and
the test every wrapper asks first: is this engine configured for our DFlash drafter?"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Patch:
    symbol: str  # the vLLM symbol replaced or wrapped
    why: str
    removal: str  # when the patch can go
    apply: Callable[[], None]


class UnsupportedVLLMError(RuntimeError):
    pass


def dflash_engine(vllm_config) -> bool:
    """An engine whose speculative config is `method: "dflash"` with our drafter (setting `drafter`, resolved by the
    front end into `additional_config["dflash"]`). A setting that does not parse counts as ours: the drafter then
    reports it."""
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None or getattr(spec, "method", None) != "dflash":
        return False
    from vllm_dflash import settings
    from vllm_dflash.config import DFlashConfigError

    try:
        return settings.from_vllm_config(vllm_config).drafter == "ours"
    except DFlashConfigError:
        return True
