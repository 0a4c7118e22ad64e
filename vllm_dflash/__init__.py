# SPDX-License-Identifier: Apache-2.0
"""vllm_dflash: DFlash block-diffusion speculative decoding for vLLM 0.32.

Importing this package is cheap: heavy modules (torch models, vLLM internals) load on first use.
`register()` is the vLLM plugin entry point (group `vllm.general_plugins`); vLLM calls it in every
process (API server, engine core, workers), so it is lazy and idempotent.
"""
__version__ = "0.1.0"

_REGISTERED = False


def register() -> None:
    """vLLM general-plugin hook: our DFlash drafter for `method: "dflash"`, and nothing for any other engine.

    vLLM calls it in every process, DFlash or not; it never raises. It only hooks the front end's speculative-config
    step: configuring DFlash (our drafter) checks the vLLM internals the plugin relies on (integration/seam.py,
    docs/CONTRACTS.md) and applies the patches, which act in that engine only. On a mismatch no patch is applied and
    configuring DFlash fails with the problems and the fix. DFLASH_VLLM_EXTRAS=fixes|all opts every engine in to our
    vLLM fixes / CPU speed-ups; VLLM_PLUGINS without `vllm_dflash` switches the plugin off entirely.
    Speculative-config key "drafter": "vllm" keeps vLLM's built-in drafter; every setting: docs/CONFIGURATION.md."""
    global _REGISTERED
    if _REGISTERED:
        return
    _REGISTERED = True
    from vllm_dflash.integration.patches import register_plugin

    register_plugin()


_LAZY = {
    "DFlashConfig": "vllm_dflash.config",
    "DFlashDraftModel": "vllm_dflash.model",
    "ReferenceDecoder": "vllm_dflash.reference",
    "SamplingParams": "vllm_dflash.sampling",
    "BlockDiffusionTrainer": "vllm_dflash.train.trainer",
    "TrainConfig": "vllm_dflash.train.config",
    "TrajectoryDataset": "vllm_dflash.train.data",
    "prepare_target": "vllm_dflash.target",
}


def __getattr__(name: str):
    """Lazy public API (importing the package stays cheap for vLLM's plugin loader)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vllm_dflash' has no attribute {name!r}")
