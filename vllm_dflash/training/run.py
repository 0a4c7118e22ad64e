# SPDX-License-Identifier: Apache-2.0
"""`vllm-dflash train`: build (or resume) a draft for a target and train it on collected trajectories."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from vllm_dflash.utils import get_logger

logger = get_logger(__name__)


def frequent_vocab(dataset, size: int, always: tuple[int, ...] = ()) -> torch.Tensor:
    """The `size` most frequent response tokens (sorted ids), plus `always` (e.g. eos): the reduced draft vocabulary."""
    c = Counter()
    for s in dataset.items:
        c.update(s.tokens[s.prompt_len:])
    ids = set(always) | {t for t, _ in c.most_common(size)}
    ids = sorted(ids)[: max(size, len(always))]
    return torch.tensor(ids, dtype=torch.long)


def init_layers_from_target(draft, target) -> int:
    """Copy the target's LAST decoder layers into the draft's layers (same-named, same-shaped tensors: attention
    and MLP projections, both layer norms; the draft's q/k norms stay at 1). Returns the number of tensors copied."""
    t_layers = getattr(getattr(target, "model", target), "layers")
    n = len(draft.layers)
    copied = 0
    with torch.no_grad():
        for d_layer, t_layer in zip(draft.layers, list(t_layers)[-n:]):
            t_params = dict(t_layer.named_parameters())
            for name, p in d_layer.named_parameters():
                src = t_params.get(name)
                if src is not None and src.shape == p.shape:
                    p.copy_(src.to(p.dtype))
                    copied += 1
    return copied


def run_train(*, data: str, out: str, target: str | None = None, num_layers: int = 1, block_size: int = 8,
              draft_vocab_size: int | None = 8192, mask_token_id: int = 16, batch_size: int = 4, num_epochs: int = 1,
              max_steps: int | None = None, lr: float = 6e-4, anchors_per_seq: int = 32, max_len: int = 640,
              eval_every: int = 200, ckpt_every: int = 50, diffusion_steps: int = 1, feature_cache: str | None = None,
              threads: int | None = None, init_from_target: bool = False,
              use_target_features: bool = True, standardize_features: bool = False,
              train_fraction: float = 1.0) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from vllm_dflash.config import DFlashConfig
    from vllm_dflash.model import DFlashDraftModel
    from vllm_dflash.target import resolve_target
    from vllm_dflash.training.data import TrajectoryDataset
    from vllm_dflash.training.trainer import BlockDiffusionTrainer

    if threads:
        torch.set_num_threads(threads)
    tpath = resolve_target(target)
    tgt = AutoModelForCausalLM.from_pretrained(str(tpath), dtype=torch.float32).eval()
    ds = TrajectoryDataset.from_dir(data, max_len=max_len)
    train, held = ds.split()
    if train_fraction < 1.0:  # data-scaling runs: a fixed share of the training split, same held-out set
        train = train.fraction(train_fraction)
    logger.info("data: %d train sequences (%d response tokens), %d held-out greedy sequences, %d skipped",
                len(train), train.num_response_tokens(), len(held), ds.skipped)
    out_dir = Path(out)
    ckpt = out_dir / "checkpoint"
    if (ckpt / "config.json").exists():  # resume: the draft architecture comes from the checkpoint
        draft = DFlashDraftModel.from_pretrained(ckpt, target=tgt)
    else:
        cfg = DFlashConfig.for_target(tgt.config.to_dict(), num_layers=num_layers, block_size=block_size,
                                      mask_token_id=mask_token_id, draft_vocab_size=draft_vocab_size
                                      ).with_(use_target_features=use_target_features)
        draft = DFlashDraftModel(cfg)
        vocab_ids = None
        if draft_vocab_size:
            vocab_ids = frequent_vocab(train, draft_vocab_size, always=(tgt.config.eos_token_id,))
            draft = DFlashDraftModel(cfg.with_(draft_vocab_size=len(vocab_ids)))
        draft.bind_target(tgt.get_input_embeddings().weight.detach(), tgt.get_output_embeddings().weight.detach(), vocab_ids)
        tnorm = getattr(getattr(tgt, "model", None), "norm", None)
        if tnorm is not None and tnorm.weight.shape == draft.norm.weight.shape:
            # start from the target's final-norm scale: the shared lm_head expects it (initial CE ~9, not ~58)
            with torch.no_grad():
                draft.norm.weight.copy_(tnorm.weight.float())
        if init_from_target:
            logger.info("draft layers initialised from the target's last %d layer(s): %d tensors copied",
                        len(draft.layers), init_layers_from_target(draft, tgt))
    logger.info("draft: %d layers, block %d, %.1fM trainable parameters, draft vocabulary %s",
                draft.config.num_hidden_layers, draft.config.block_size, draft.num_parameters() / 1e6,
                draft.config.draft_vocab_size or "full")
    trainer = BlockDiffusionTrainer(draft, tgt, out_dir=out_dir, lr=lr, anchors_per_seq=anchors_per_seq,
                                    ckpt_every=ckpt_every, diffusion_steps=diffusion_steps, feature_cache=feature_cache,
                                    standardize_features=standardize_features)
    result = trainer.train(train, batch_size=batch_size, num_epochs=num_epochs, eval_dataset=held,
                           eval_every=eval_every, max_steps=max_steps)
    report = trainer.evaluate(held) if len(held) else {}
    trainer.export(out_dir / "draft")
    (out_dir / "report.json").write_text(json.dumps({"train": result, "eval": report}, indent=1))
    return {"train": result, "eval": report, "draft": str(out_dir / "draft")}
