# SPDX-License-Identifier: Apache-2.0
"""A training run's checkpoint folder: the draft's weights (float32, fc unfolded) beside trainer_state.pt (optimizer,
scheduler, trainer state, config, RNG state), written atomically: a crash leaves the old checkpoint or the new one.
`BlockDiffusionTrainer` saves and resumes through these; `vllm-dflash export` (train/export.py) reads one."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

from vllm_dflash.model import DFlashDraftModel


def restore_feature_scale(draft: DFlashDraftModel, state: dict[str, Any]) -> None:
    """A training checkpoint keeps fc unfolded and the feature standardisation in its trainer state: put it back
    on the draft (so fuse() and an export's fold see it)."""
    if "feature_inv_scale" in state:
        draft.feature_inv_scale.copy_(torch.tensor(state["feature_inv_scale"]))


def save_checkpoint(path: Path, draft: DFlashDraftModel, optimizer: torch.optim.Optimizer, scheduler,
                    state: dict[str, Any], config: dict[str, Any]) -> Path:
    """Write the checkpoint folder `path` (through path.tmp, then swapped in place of the old one). -> path."""
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    draft.save_pretrained(tmp, dtype=torch.float32, fold_feature_scale=False)
    torch.save({"optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict() if scheduler else None,
                "state": state, "config": config,
                "rng": {"torch": torch.get_rng_state()}}, tmp / "trainer_state.pt")
    old = path.with_name(path.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
    return path


def load_checkpoint(path: str | Path, draft: DFlashDraftModel, optimizer: torch.optim.Optimizer, scheduler,
                    device: torch.device) -> dict[str, Any]:
    """Load a checkpoint folder into the draft (its trained weights; lm_head and d2t stay the bound target's), the
    optimizer and the scheduler (when both have one), and torch's RNG. -> the trainer state it holds."""
    from safetensors.torch import load_file

    path = Path(path)
    sd = load_file(str(path / "model.safetensors"))
    sd = {k: v for k, v in sd.items() if k not in ("lm_head.weight", "d2t")}
    draft.load_state_dict({k: v.to(device) for k, v in sd.items()}, strict=False)
    st = torch.load(path / "trainer_state.pt", weights_only=True)  # tensors and plain data only: runs no code
    optimizer.load_state_dict(st["optimizer"])
    if scheduler is not None and st["scheduler"] is not None:
        scheduler.load_state_dict(st["scheduler"])
    state = st["state"]
    restore_feature_scale(draft, state)
    torch.set_rng_state(st["rng"]["torch"])
    return state
