# SPDX-License-Identifier: Apache-2.0
"""Patch: our speculative-config keys become validated settings in vLLM's additional_config; the draft is validated
against the target before any engine process starts."""
from __future__ import annotations

from vllm_dflash import settings
from vllm_dflash.integration.patches.base import Patch
from vllm_dflash.utils import get_logger

logger = get_logger(__name__)


def apply() -> None:
    from vllm.engine.arg_utils import EngineArgs

    from vllm_dflash.integration.validation import validate_dflash_spec

    orig = EngineArgs.create_speculative_config
    if getattr(orig, "_vllm_dflash_patched", False):
        return

    def create_speculative_config(self, target_model_config, target_parallel_config):
        spec = self.speculative_config
        if isinstance(spec, dict):
            spec = {k.replace("-", "_"): v for k, v in spec.items()}
            method = spec.get("method") or ("dflash" if "dflash" in str(spec.get("model", "")).lower() else None)
            if method == "dflash":
                # our keys -> validated settings (key > additional_config["dflash"] > DFLASH_* env > default) in
                # vLLM's own additional_config, which reaches the engine core and every worker; a new dict, so
                # a caller's dict shared between LLM(...) calls is never changed
                ours = settings.resolve(settings.pop_spec_keys(spec),
                                        settings.additional_config_section(self.additional_config))
                self.additional_config = settings.with_settings(self.additional_config, ours)
                if ours.drafter == "ours":
                    cfg = validate_dflash_spec(spec, target_model_config.hf_config,
                                               tp_size=getattr(target_parallel_config, "tensor_parallel_size", None))
                    spec.setdefault("num_speculative_tokens", cfg.block_size - 1)
                    keep_prefix_block(spec)
            self.speculative_config = spec
        return orig(self, target_model_config, target_parallel_config)

    create_speculative_config._vllm_dflash_patched = True
    EngineArgs.create_speculative_config = create_speculative_config


def keep_prefix_block(spec: dict) -> None:
    """Prefix caching with our drafter keeps every cached block (vLLM's own `disable_eagle_block_drop`, default
    True for our drafter; a user's explicit value wins).

    vLLM drops the last matched prefix-cache block for every hidden-state drafter ('eagle-like', dflash included)
    and recomputes it: an EAGLE draft's KV at position i needs token i+1, so the cached draft KV of the last block
    is incomplete. A DFlash draft's context K/V at position i is a function of the target's hidden state at i
    alone, injected in the step that computes position i; the draft's own block queries only ever write slots the
    target has not computed yet. So a full cached block holds exact draft K/V and recomputing it is pure cost: a
    128-token block per request on CPU, which made our prefill up to 3x slower than no speculation on repeated
    prompts. tests/vllm/test_vllm_prefix_cache.py checks outputs and acceptance with warm blocks."""
    if "disable_eagle_block_drop" not in spec:
        spec["disable_eagle_block_drop"] = True
        logger.info("vllm_dflash: prefix caching keeps every cached block with our DFlash drafter (draft context K/V "
                    "depend only on their own position, so cached blocks are exact; vLLM's warning about EAGLE "
                    "block dropping does not apply). speculative_config.disable_eagle_block_drop=false restores "
                    "vLLM's rule")


PATCH = Patch(
    symbol="vllm.engine.arg_utils.EngineArgs.create_speculative_config",
    why="vLLM's SpeculativeConfig forbids unknown keys; we strip ours (adaptive, diffusion_steps, "
        "confidence_threshold, overlap, kv_injection, drafter), resolve them into vLLM's own "
        "additional_config['dflash'] (settings.py), and validate the DFlash draft against the target before "
        "any engine process starts (clear error, non-zero exit).",
    removal="when SpeculativeConfig accepts plugin-owned extra keys and a pre-engine validation hook",
    apply=apply,
)
