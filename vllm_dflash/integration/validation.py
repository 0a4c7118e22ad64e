# SPDX-License-Identifier: Apache-2.0
"""Start-up validation of a DFlash speculative config, before any engine process starts.

Called from the patched `EngineArgs.create_speculative_config` (so `LLM(...)` raises and `vllm serve`
exits non-zero with the message) and again by the drafter in the worker. Every error names the
field and the fix (DFlashConfigError). The draft is a local folder or a Hugging Face Hub id (integration/hub.py), in
any layout vLLM's own `dflash` path loads; a layout our drafter does not serve is refused here, naming vLLM's own
drafter as the way out (integration/draft_layouts.py): the engine never starts on another drafter unasked."""
from __future__ import annotations

from typing import Any

from vllm_dflash.config import SUPPORTED_BLOCK_SIZES, WEIGHTS_NAME, DFlashConfig, DFlashConfigError, read_config_json
from vllm_dflash.integration import draft_layouts, hub
from vllm_dflash.utils import get_logger

logger = get_logger(__name__)


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


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def valid_tp_sizes(heads: int, kv_heads: int) -> list[int]:
    """Tensor-parallel sizes a (draft) model with these head counts can be sharded over."""
    return [t for t in _divisors(heads) if (kv_heads % t == 0 if kv_heads >= t else t % kv_heads == 0)]


def check_tensor_parallel(cfg: DFlashConfig, tp_size: int, draft_tp_size: int | None = None) -> None:
    """The draft can be sharded over `tp_size` ranks (vLLM's rules, qwen3_dflash.py: q heads divide by TP; KV heads
    divide by TP or TP by them, replicated then), and it runs in the target's TP group (DFlashConfigError naming the
    field and the fix). Our drafter's draft layers are vLLM's parallel layers, which shard over the global TP group
    whatever `draft_tensor_parallel_size` says, so a different draft TP size is refused rather than ignored."""
    tp = int(tp_size or 1)
    if draft_tp_size is not None and int(draft_tp_size) != tp:
        raise DFlashConfigError(
            "speculative_config.draft_tensor_parallel_size",
            f"{draft_tp_size} with tensor_parallel_size={tp}: our DFlash drafter runs in the target's tensor-parallel "
            "group (its attention heads are sharded like the target's)",
            f"omit draft_tensor_parallel_size or set it to {tp}; or {draft_layouts.VLLM_DRAFTER} (vLLM accepts 1 or "
            "the target's size)")
    if tp <= 1:
        return
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    if heads % tp:
        raise DFlashConfigError(
            "num_attention_heads (draft config.json)",
            f"the draft's {heads} attention heads do not divide by tensor_parallel_size={tp} (each rank holds "
            f"heads / TP of them)",
            f"serve with a tensor_parallel_size in {valid_tp_sizes(heads, kv)}, or use a draft whose "
            f"num_attention_heads divides by {tp}")
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        raise DFlashConfigError(
            "num_key_value_heads (draft config.json)",
            f"the draft's {kv} KV heads cannot be split over tensor_parallel_size={tp} (they must divide by it, or "
            f"it by them: then each rank holds a replica)",
            f"serve with a tensor_parallel_size in {valid_tp_sizes(heads, kv)}, or use a "
            f"draft whose num_key_value_heads divides by {tp}")


def validate_dflash_spec(spec: dict[str, Any], target_hf_config: Any, tp_size: int | None = None) -> DFlashConfig:
    """Check a speculative-config dict (method dflash) against the target (and, given the target's
    tensor_parallel_size, that the draft can be sharded like it). Returns the parsed draft config."""
    model = spec.get("model")
    if not model:
        raise DFlashConfigError("speculative_config.model", "is missing",
                                "pass the DFlash draft (a local folder or a Hugging Face Hub id) as 'model'")
    src = hub.resolve(str(model), spec.get("revision"))
    raw = read_config_json(src.folder, hub.FIELD)
    cfg = draft_layouts.read(raw)
    if hub.weights_known_missing(src):
        offline = "" if src.repo_id is None else " (HF_HUB_OFFLINE is set: nothing can be downloaded)"
        raise DFlashConfigError(hub.FIELD, f"no {WEIGHTS_NAME} in {src.describe()}{offline}",
                                f"download the whole repository (`hf download {src.repo_id}`)" if src.repo_id else
                                "save the draft with DFlashDraftModel.save_pretrained (or copy its weights there)")
    if src.repo_id is not None or draft_layouts.is_speculators(raw):
        logger.info("vllm_dflash: draft %s (%s): served by our drafter", src.describe(), draft_layouts.describe(raw))
    cfg.check_target(target_hf_config)
    if not cfg.use_target_features:
        raise DFlashConfigError("dflash_config.use_target_features", "is false: this draft is the no-target-features "
                                "training baseline, not a serving draft", "serve a draft trained with target features")
    if cfg.block_size not in SUPPORTED_BLOCK_SIZES:
        raise DFlashConfigError("block_size", f"{cfg.block_size} is not supported for serving by our drafter",
                                f"use a draft with block_size in {SUPPORTED_BLOCK_SIZES}, or "
                                f"{draft_layouts.VLLM_DRAFTER}")
    k = spec.get("num_speculative_tokens")
    if k is not None:
        cfg.check_num_speculative_tokens(int(k))
    sizes = attention_head_sizes()
    if sizes is not None and cfg.head_dim not in sizes:
        raise DFlashConfigError("head_dim", f"{cfg.head_dim} is not supported by this platform's attention backend "
                                f"(supported: {sizes})", "use a draft whose head_dim the backend supports")
    if tp_size is not None:
        check_tensor_parallel(cfg, tp_size, spec.get("draft_tensor_parallel_size"))
    return cfg
