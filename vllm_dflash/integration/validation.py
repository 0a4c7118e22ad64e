# SPDX-License-Identifier: Apache-2.0
"""Start-up validation of a DFlash speculative config, before any engine process starts.

Called from the patched `EngineArgs.create_speculative_config` (so `LLM(...)` raises and `vllm serve`
exits non-zero with the message) and again by the drafter in the worker. Every error names the
field and the fix (DFlashConfigError)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vllm_dflash.config import SUPPORTED_BLOCK_SIZES, WEIGHTS_NAME, DFlashConfig, DFlashConfigError

# Our extra speculative-config keys: stripped before vLLM's (strict) SpeculativeConfig sees them and
# passed to the drafter through the environment (inherited by the engine and worker processes).
PLUGIN_KEYS = {"diffusion_steps": "VLLM_DFLASH_DIFFUSION_STEPS",
               "confidence_threshold": "VLLM_DFLASH_CONFIDENCE_THRESHOLD",
               "adaptive": "VLLM_DFLASH_ADAPTIVE"}
ADAPTIVE_VALUES = (True, False, "both", "dflash", "ngram", "merged")
# Defaults when neither the speculative config nor the user's environment sets a key. Adaptive drafting (DFlash,
# prompt lookup or the two merged, 0..k tokens per request-step) measured at or above the fixed block at every
# concurrency (README, Benchmarks), so a user who writes only {"method": "dflash", "model": ...} gets it;
# "adaptive": false gives the paper's fixed block.
PLUGIN_DEFAULTS = {"adaptive": "true"}


# The user's own environment before any speculative config touched it: a config without our key must not
# inherit the value a previous LLM(...) in the same process set.
_USER_ENV = {env: os.environ.get(env) for env in PLUGIN_KEYS.values()}


def pop_plugin_keys(spec: dict[str, Any]) -> dict[str, Any]:
    """Remove our keys from a speculative-config dict, validate them, and publish them as env vars for the engine
    and worker processes (precedence: the config's key > the user's own env var > PLUGIN_DEFAULTS > the drafter's
    default)."""
    ours = {k: spec.pop(k) for k in list(spec) if k in PLUGIN_KEYS}
    if "diffusion_steps" in ours:
        v = ours["diffusion_steps"]
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise DFlashConfigError("speculative_config.diffusion_steps", f"got {v!r}", "use an integer >= 1")
    if "confidence_threshold" in ours:
        v = ours["confidence_threshold"]
        if not isinstance(v, (int, float)) or not 0.0 < float(v) <= 1.0:
            raise DFlashConfigError("speculative_config.confidence_threshold", f"got {v!r}", "use a number in (0, 1]")
    if "adaptive" in ours and ours["adaptive"] not in ADAPTIVE_VALUES:
        raise DFlashConfigError("speculative_config.adaptive", f"got {ours['adaptive']!r}",
                                "use true (DFlash, prompt lookup or the two merged), false, 'dflash', 'ngram' or "
                                "'merged'")
    for key, env in PLUGIN_KEYS.items():
        if key in ours:
            os.environ[env] = str(ours[key]).lower()
        elif _USER_ENV[env] is None and key in PLUGIN_DEFAULTS:
            os.environ[env] = PLUGIN_DEFAULTS[key]
        elif _USER_ENV[env] is None:
            os.environ.pop(env, None)
        else:
            os.environ[env] = _USER_ENV[env]
    return ours


def attention_head_sizes() -> list[int] | None:
    """Head sizes the platform's attention backend supports (None = unknown / no restriction checked)."""
    try:
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

            return list(CPUAttentionBackend.get_supported_head_sizes())
    except Exception:  # noqa: BLE001 - best effort; the backend re-checks later
        return None
    return None


def validate_dflash_spec(spec: dict[str, Any], target_hf_config: Any) -> DFlashConfig:
    """Check a speculative-config dict (method dflash) against the target. Returns the parsed draft config."""
    model = spec.get("model")
    if not model:
        raise DFlashConfigError("speculative_config.model", "is missing", "pass the DFlash draft folder as 'model'")
    path = Path(model)
    if not path.exists():
        raise DFlashConfigError("speculative_config.model", f"draft folder {model!r} does not exist",
                                "pass a local folder with config.json and model.safetensors")
    cfg = DFlashConfig.from_pretrained(path)
    if not any(path.glob("*.safetensors")):
        raise DFlashConfigError("speculative_config.model", f"no {WEIGHTS_NAME} in {model!r}",
                                "save the draft with DFlashDraftModel.save_pretrained (or copy its weights there)")
    cfg.check_target(target_hf_config)
    if not cfg.use_target_features:
        raise DFlashConfigError("dflash_config.use_target_features", "is false: this draft is the no-target-features "
                                "training baseline, not a serving draft", "serve a draft trained with target features")
    if cfg.block_size not in SUPPORTED_BLOCK_SIZES:
        raise DFlashConfigError("block_size", f"{cfg.block_size} is not supported for serving",
                                f"use a draft with block_size in {SUPPORTED_BLOCK_SIZES}")
    k = spec.get("num_speculative_tokens")
    if k is not None:
        cfg.check_num_speculative_tokens(int(k))
    sizes = attention_head_sizes()
    if sizes is not None and cfg.head_dim not in sizes:
        raise DFlashConfigError("head_dim", f"{cfg.head_dim} is not supported by this platform's attention backend "
                                f"(supported: {sizes})", "use a draft whose head_dim the backend supports")
    return cfg
