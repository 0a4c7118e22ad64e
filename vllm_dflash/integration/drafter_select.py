# SPDX-License-Identifier: Apache-2.0
"""Which DFlash drafter vLLM builds for `method: "dflash"`: ours (default) or vLLM's built-in one.

VLLM_DFLASH_DRAFTER=ours|vllm, read when the model runner builds its drafter (so one process can
compare both on the same checkpoint)."""
from __future__ import annotations

import os

ENV = "VLLM_DFLASH_DRAFTER"


def selected_drafter() -> str:
    value = os.environ.get(ENV, "ours").strip().lower()
    if value not in ("ours", "vllm"):
        raise ValueError(f"{ENV}={value!r}. Fix: set it to 'ours' (vllm_dflash's drafter) or 'vllm' (built-in)")
    return value
