# SPDX-License-Identifier: Apache-2.0
"""The ledger's entry type (every module in this package defines one PATCH) and the error for an unsupported vLLM."""
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
