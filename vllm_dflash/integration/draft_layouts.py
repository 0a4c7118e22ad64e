# SPDX-License-Identifier: Apache-2.0
"""The checkpoint layouts vLLM 0.32's own `dflash` path loads, and what our drafter does with each: serve it, or
refuse it at start-up naming the key and the way out (vLLM's own drafter: `"drafter": "vllm"`).

Served:
- the published DFlash layout (ours, z-lab's): `DFlashDraftModel`, `dflash_config` {mask_token_id,
  target_layer_ids}, block_size, num_target_layers, the Qwen3 keys;
- the same with `dflash_config.causal` (or `is_causal`): every draft layer causal, as vLLM runs it (our drafter
  builds its attention metadata with vLLM's DFlashProposer, which reads the flag);
- the `speculators` layout (`speculators_model_type: "dflash"`, transformer_layer_config,
  aux_hidden_state_layer_ids, mask_token_id, draft_vocab_size), read as vLLM's transformers_utils/configs/
  speculators/algos.py `update_dflash` reads it: the transformer_layer_config's keys, dflash_config.target_layer_ids
  = aux ids - 1 (speculators counts the embedding as layer 0), dflash_config.causal = not sliding_window_non_causal
  (absent: non-causal; the speculators library writes false for dflash: causal), draft_vocab_size and
  target_hidden_size as they are. vLLM builds the same dict (model_type "speculators"), which our drafter reads in
  the worker; it records no num_target_layers (the layer ids are checked against the target alone) and drops
  block_size (read here for the start-up checks).
Refused: DFlash2 (`DFlash2DraftModel`, speculators type `dflash2`: grouped convolutions and a candidate selector,
which vLLM runs on its Model Runner V2 only), sliding-window layers (`layer_types`, `dflash_config.use_swa`),
attention sinks, `sample_from_anchor`, drafts without the target's features (`use_aux_hidden_state: false`), and
architectures vLLM builds with a model class of its own."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_dflash.config import ARCHITECTURE, DFlashConfig, DFlashConfigError

VLLM_DRAFTER = "serve it with vLLM's own DFlash drafter: add \"drafter\": \"vllm\" to the speculative config"
_DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def is_speculators(raw: Mapping[str, Any]) -> bool:
    """A `speculators` checkpoint (vLLM's HFConfigParser: a speculators_config and no model_type of its own)."""
    return "speculators_model_type" in raw or (raw.get("speculators_config") is not None and "model_type" not in raw)


def from_speculators(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A speculators config.json as the dict vLLM builds from it (algos.py update_dflash / update_dflash2), plus
    its block_size."""
    kind = raw.get("speculators_model_type")
    if kind not in ("dflash", "dflash2"):
        raise DFlashConfigError("speculators_model_type", f"{kind!r} is not a DFlash draft", "use a speculators "
                                "checkpoint of type dflash with method dflash, or the method of its own type")
    if not isinstance(raw.get("transformer_layer_config"), Mapping):
        raise DFlashConfigError("transformer_layer_config", "is missing from the speculators config.json",
                                "add the draft layers' config (vLLM needs it)")
    for key in ("aux_hidden_state_layer_ids", "mask_token_id"):
        if raw.get(key) is None:
            raise DFlashConfigError(key, "is missing from the speculators config.json", f"add {key} (vLLM needs it)")
    aux = [int(i) for i in raw["aux_hidden_state_layer_ids"]]
    dcfg = {"mask_token_id": raw["mask_token_id"], "target_layer_ids": [i - 1 for i in aux],
            "sample_from_anchor": raw.get("sample_from_anchor", False),
            "causal": not raw.get("sliding_window_non_causal", True)}
    if kind == "dflash2":
        dcfg.update({k: raw[k] for k in _DFLASH2_KEYS if raw.get(k) is not None})
    out = dict(raw.get("transformer_layer_config") or {})
    out.update(model_type="speculators", architectures=["DFlash2DraftModel" if kind == "dflash2" else ARCHITECTURE],
               draft_vocab_size=raw.get("draft_vocab_size"), eagle_aux_hidden_state_layer_ids=aux, dflash_config=dcfg)
    if raw.get("target_hidden_size") is not None:
        out["target_hidden_size"] = raw["target_hidden_size"]
    if raw.get("block_size") is not None:
        out["block_size"] = raw["block_size"]
    return out


def vllm_architectures(cfg: Mapping[str, Any]) -> list[str]:
    """The architecture names vLLM builds for `method: "dflash"` (transformers_utils/configs/eagle.py: a name is
    kept when it starts or ends with DFlash, else prefixed with DFlash)."""
    return [a if a.startswith("DFlash") or a.endswith("DFlash") or a == "LiLiCorrDraftModel" else f"DFlash{a}"
            for a in cfg.get("architectures") or []]


def _refusal(cfg: Mapping[str, Any], speculators: bool) -> tuple[str, str] | None:
    """(key, problem) of the first thing in a (read) config that our drafter does not serve, or None."""
    dcfg = cfg.get("dflash_config") or {}
    archs = vllm_architectures(cfg)
    if "DFlash2DraftModel" in archs:
        return ("speculators_model_type" if speculators else "architectures",
                "a DFlash2 draft (grouped convolutions and a candidate selector), which our drafter does not serve "
                "(vLLM runs DFlash2 on its Model Runner V2, which needs Triton)")
    if archs and archs != [ARCHITECTURE]:
        return "architectures", f"{cfg['architectures']} is built by vLLM's own model class ({archs[0]}), not ours"
    sample_key = "sample_from_anchor" if speculators else "dflash_config.sample_from_anchor"
    if dcfg.get("sample_from_anchor"):
        return sample_key, "true: the anchor's own slot drafts too, and our drafter drafts the mask slots only"
    layer_types = cfg.get("layer_types") or []
    if "sliding_attention" in layer_types or dcfg.get("use_swa"):
        key = "dflash_config.use_swa" if dcfg.get("use_swa") else (
            "transformer_layer_config.layer_types" if speculators else "layer_types")
        return key, "sliding-window draft layers, which our drafter does not serve"
    if dcfg.get("attention_sink_bias") or cfg.get("add_swa_attention_sink_bias"):
        return "dflash_config.attention_sink_bias", "attention sinks, which our drafter does not serve"
    if dcfg.get("use_aux_hidden_state", cfg.get("use_aux_hidden_state", True)) is False:
        return "dflash_config.use_aux_hidden_state", "false: a draft without the target's features"
    return None


def read(raw: Mapping[str, Any]) -> DFlashConfig:
    """A draft's config.json (any layout above) -> DFlashConfig, or DFlashConfigError naming the key and the fix
    (for a layout our drafter does not serve: vLLM's own drafter)."""
    speculators = is_speculators(raw)
    cfg = from_speculators(raw) if speculators else dict(raw)
    refused = _refusal(cfg, speculators)
    if refused is not None:
        raise DFlashConfigError(refused[0], refused[1], VLLM_DRAFTER)
    return DFlashConfig.from_hf_config(cfg)


def describe(raw: Mapping[str, Any]) -> str:
    """The layout, for the start-up log: 'speculators dflash layout' or 'published DFlash layout' (+ causal)."""
    speculators = is_speculators(raw)
    cfg = from_speculators(raw) if speculators else raw
    name = f"speculators {raw.get('speculators_model_type')}" if speculators else "published DFlash"
    causal = cfg.get("is_causal", (cfg.get("dflash_config") or {}).get("causal"))
    return f"{name} layout" + (", causal attention" if causal else "")
