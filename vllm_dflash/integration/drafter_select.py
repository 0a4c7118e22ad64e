# SPDX-License-Identifier: Apache-2.0
"""Which DFlash drafter vLLM builds for `method: "dflash"`: ours (default) or vLLM's built-in one.

The per-deployment setting `drafter` ("ours" | "vllm"; speculative-config key, or DFLASH_DRAFTER as the default),
read from the engine's vllm_config (so one process can compare both on the same checkpoint)."""
from __future__ import annotations

from vllm_dflash import settings

ENV = settings.env_name("drafter")


def selected_drafter(vllm_config=None) -> str:
    """This engine's drafter (vllm_config.additional_config["dflash"]); without a config: environment / default."""
    return settings.from_vllm_config(vllm_config).drafter
