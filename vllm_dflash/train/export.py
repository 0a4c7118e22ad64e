# SPDX-License-Identifier: Apache-2.0
"""A training run's latest checkpoint -> a serving draft folder (bf16 config.json + model.safetensors)."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def export_draft(run: str | Path, out: str | Path, target: str | None = None) -> dict[str, Any]:
    """Export `run`/checkpoint (the --out folder of `vllm-dflash train`) to `out`; the feature scale the trainer
    learned is folded into fc. -> {"draft": out, "step", "epoch", "position"} of the exported checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM

    from vllm_dflash.model import DFlashDraftModel
    from vllm_dflash.target import resolve_target
    from vllm_dflash.train.checkpoint import restore_feature_scale

    ckpt = Path(run) / "checkpoint"
    if not (ckpt / "config.json").is_file():
        raise SystemExit(f"export: {ckpt} has no config.json. Fix: pass the --out folder of `vllm-dflash train`")
    tgt = AutoModelForCausalLM.from_pretrained(str(resolve_target(target)), dtype=torch.float32)
    draft = DFlashDraftModel.from_pretrained(ckpt, target=tgt)
    state = torch.load(ckpt / "trainer_state.pt", weights_only=True)["state"]  # plain data: a pickle runs no code
    restore_feature_scale(draft, state)  # folded into fc by save_pretrained
    saved = draft.save_pretrained(out, dtype=torch.bfloat16)
    return {"draft": str(saved), "step": state["step"], "epoch": state["epoch"], "position": state["pos"]}
