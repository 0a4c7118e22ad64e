# SPDX-License-Identifier: Apache-2.0
"""Patch: the V1 runner's DFlashProposer module global becomes our drafter switch (integration/proposer.py)."""
from __future__ import annotations

from vllm_dflash.integration.patches.base import Patch


def apply() -> None:
    from vllm_dflash.integration.proposer import install

    install()


PATCH = Patch(
    symbol="vllm.v1.worker.gpu_model_runner.DFlashProposer (module global)",
    why="The V1 runner builds its drafter from this module global and checks isinstance against it. "
        "We bind a switch class: building it returns our DFlashDrafter (or vLLM's with the setting "
        "drafter=vllm); isinstance accepts both. No runner code is copied.",
    removal="when vLLM offers a drafter/proposer plugin hook for V1 (or we move to the V2 speculator API)",
    apply=apply,
)
