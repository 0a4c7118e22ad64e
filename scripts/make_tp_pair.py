#!/usr/bin/env python
"""Build a tiny target + DFlash draft pair whose head counts divide by 2 (4 q / 2 kv heads) for
tensor-parallel tests (TP=2). Same recipe as scripts/make_test_assets.py (a 'mostly repeating' Qwen3 target
and a 1-layer draft trained on its greedy trajectories) but with num_attention_heads=4,
num_key_value_heads=2; only one draft (block 8). Deterministic; ~1-2 minutes on 2 busy cores.

Usage: python scripts/make_tp_pair.py [OUT]   (default /tmp/tp-pair). Imports the builders; edits nothing."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch


def _builders():
    try:  # the tiny-model builders: vllm_dflash.testing before the tests re-layout, tests/support/testing.py after
        from vllm_dflash.testing import build_tiny_draft, build_tiny_target, load_target, tiny_trajectories
    except ImportError:  # pragma: no cover - fallback for the new layout
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from support.testing import build_tiny_draft, build_tiny_target, load_target, tiny_trajectories  # type: ignore
    return build_tiny_draft, build_tiny_target, load_target, tiny_trajectories


def build_tp_pair(out: Path, *, heads: int = 4, kv_heads: int = 2, block_size: int = 8, trajectories: int = 512,
                  epochs: int = 4) -> dict:
    """target/ + draft/ under `out`; returns the held-out report. Skips work when out/DONE exists."""
    from vllm_dflash.config import DFlashConfig
    from vllm_dflash.model import DFlashDraftModel
    from vllm_dflash.train.data import TrajectoryDataset
    from vllm_dflash.train.trainer import BlockDiffusionTrainer

    out = Path(out)
    if (out / "DONE").exists():
        return json.loads((out / "DONE").read_text())
    build_tiny_draft, build_tiny_target, load_target, tiny_trajectories = _builders()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    shutil.rmtree(out, ignore_errors=True)
    build_tiny_target(out / "target", predictable=0.25, num_layers=2, num_heads=heads, num_kv_heads=kv_heads)
    build_tiny_draft(out / "draft-untrained", out / "target", block_size=block_size)
    tgt = load_target(out / "target")
    recs = tiny_trajectories(tgt, trajectories, response_len=40)
    train, held = TrajectoryDataset(recs[:-32]), TrajectoryDataset(recs[-32:])
    draft = DFlashDraftModel.from_pretrained(out / "draft-untrained", target=tgt)
    trainer = BlockDiffusionTrainer(draft, tgt, lr=3e-3, anchors_per_seq=16, log_every=20, diffusion_steps=2)
    trainer.train(train, batch_size=16, num_epochs=epochs, progress=False)
    report = trainer.evaluate(held, estimate_speedup=False)
    trainer.export(out / "draft")
    cfg = json.loads((out / "draft" / "config.json").read_text())
    cfg["block_size"] = block_size
    (out / "draft" / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    DFlashConfig.from_pretrained(out / "draft")  # validates
    shutil.rmtree(out / "draft-untrained")
    report = {k: v for k, v in report.items() if isinstance(v, (int, float, str))}
    (out / "DONE").write_text(json.dumps(report))
    return report


if __name__ == "__main__":
    print(json.dumps(build_tp_pair(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/tp-pair"))))
