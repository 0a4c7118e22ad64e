# SPDX-License-Identifier: Apache-2.0
"""`vllm-dflash train`: build (or resume, or fine-tune) a draft for a target and train it on collected trajectories."""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import torch

# The known-targets table lives in vllm_dflash.config (the one place the library knows target families); both names
# stay importable from here.
from vllm_dflash.config import KNOWN_MASK_TOKEN_IDS, default_mask_token_id  # noqa: F401
from vllm_dflash.train.config import TrainConfig
from vllm_dflash.utils import get_logger

logger = get_logger(__name__)


def frequent_vocab(dataset, size: int, always: tuple[int, ...] = (), fill_from_prompts: bool = True) -> torch.Tensor:
    """The `size` most frequent response tokens plus `always` (e.g. eos), as sorted ids: the reduced draft
    vocabulary. Ties in frequency go to the smaller id. When the responses hold fewer than `size` distinct tokens,
    the most frequent prompt tokens fill the rest (data collected later will write some of them)."""
    resp: Counter = Counter()
    prompt: Counter = Counter()
    for s in dataset.items:
        resp.update(s.tokens[s.prompt_len:])
        if fill_from_prompts:
            prompt.update(s.tokens[: s.prompt_len])
    ranked = sorted(resp.items(), key=lambda kv: (-kv[1], kv[0]))
    ranked += sorted(((t, n) for t, n in prompt.items() if t not in resp), key=lambda kv: (-kv[1], kv[0]))
    return torch.tensor(sorted(set(always) | {t for t, _ in ranked[:size]}), dtype=torch.long)


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


def init_from_draft(path: str | Path, target, vocab_ids: torch.Tensor | None, num_layers: int | None = None):
    """Fine-tuning start: a trained draft's weights (layers, fc, norms) under a new reduced vocabulary. The output
    layer is the target's frozen lm_head restricted to `vocab_ids`, so the trained weights do not depend on it.

    num_layers above the source's grows the draft: the source's layers come first, and each new layer starts as the
    identity (its attention output and MLP down projections are zero, so the residual stream passes through): the
    grown draft drafts exactly as the source before its first step, and training adds depth from there."""
    from vllm_dflash.model import DFlashDraftModel

    src = DFlashDraftModel.from_pretrained(path, target=target)
    have = src.config.num_hidden_layers
    num_layers = have if num_layers is None else num_layers
    if num_layers < have:
        raise ValueError(f"--layers {num_layers}: fewer than the {have} layers of --init-draft {path}. Fix: --layers "
                         f"{have} or more (more grows the draft), or start a new draft without --init-draft")
    cfg = src.config.with_(draft_vocab_size=len(vocab_ids) if vocab_ids is not None else None,
                           num_hidden_layers=num_layers)
    draft = DFlashDraftModel(cfg)
    missing, unexpected = draft.load_state_dict(src.state_dict(), strict=False)
    new_prefixes = tuple(f"layers.{i}." for i in range(have, num_layers))
    if unexpected or any(not k.startswith(new_prefixes) for k in missing):
        raise RuntimeError(f"--init-draft {path}: weights do not fit (missing {missing}, unexpected {unexpected})")
    with torch.no_grad():
        for layer in draft.layers[have:]:
            for lin in (layer.self_attn.o_proj, layer.mlp.down_proj):
                lin.weight.zero_()
                if lin.bias is not None:
                    lin.bias.zero_()
    draft.bind_target(target.get_input_embeddings().weight.detach(), target.get_output_embeddings().weight.detach(),
                      vocab_ids)
    return draft


def _heldout_for_run(held, out_dir: Path):
    """The held-out sequences this run reports its τ curve on: fixed at the run's first start (the split can grow
    as collection folders grow; every sequence in the split stays out of training either way)."""
    from vllm_dflash.train.data import TrajectoryDataset

    f = out_dir / "heldout_ids.json"
    if not f.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps([s.id for s in held.items]))
        return held
    keep = set(json.loads(f.read_text()))
    fixed = TrajectoryDataset([])
    fixed.items = [s for s in held.items if s.id in keep]
    return fixed


_TRAIN = TrainConfig()  # run_train's training keywords default to TrainConfig's fields (one place for them)


def run_train(*, data: str, out: str, target: str | None = None, num_layers: int | None = None, block_size: int = 8,
              draft_vocab_size: int | None = 8192, mask_token_id: int | None = None,
              batch_size: int = _TRAIN.batch_size, num_epochs: int = _TRAIN.num_epochs,
              max_steps: int | None = _TRAIN.max_steps, lr: float = _TRAIN.lr,
              anchors_per_seq: int = _TRAIN.anchors_per_seq, max_len: int = 640, eval_every: int = _TRAIN.eval_every,
              ckpt_every: int = _TRAIN.ckpt_every, log_every: int = _TRAIN.log_every,
              diffusion_steps: int = _TRAIN.diffusion_steps, feature_cache: str | None = None,
              threads: int | None = None, init_from_target: bool = False, init_draft: str | None = None,
              use_target_features: bool = True, standardize_features: bool = _TRAIN.standardize_features,
              train_fraction: float = 1.0, greedy_only: bool = True, precision: str = "auto",
              run_steps: int | None = _TRAIN.run_steps, run_minutes: float | None = _TRAIN.run_minutes,
              device: str = "auto", time_budget_minutes: float | None = _TRAIN.time_budget_minutes,
              hint_ngram: tuple[int, int] | None = None, hint_prob: float = _TRAIN.hint_prob,
              gamma: float | None = _TRAIN.gamma, kl_weight: float = _TRAIN.kl_weight,
              kl_temperature: float = _TRAIN.kl_temperature,
              eval_temperature: float = _TRAIN.eval_temperature) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from vllm_dflash.config import DFlashConfig
    from vllm_dflash.model import DFlashDraftModel
    from vllm_dflash.target import resolve_target
    from vllm_dflash.train.data import TrajectoryDataset
    from vllm_dflash.train.trainer import BlockDiffusionTrainer
    from vllm_dflash.utils import default_dtype

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if not threads and device.startswith("cuda"):
        # The host side of a GPU step is many small ops: with torch's default (every core) several runs on one
        # machine oversubscribe it and OpenMP spin-waits. Measured on an H200 with 16 cores, three runs side by
        # side: 2.4-2.7 s per step at the default, 0.07-0.12 s with 4 threads each (one run alone: 0.07 s).
        threads = min(4, os.cpu_count() or 1)
    if threads:
        torch.set_num_threads(threads)
    if precision not in ("auto", "bf16", "fp32"):
        raise ValueError(f"precision {precision!r}: expected auto, bf16 or fp32")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: this torch sees no CUDA GPU. Fix: --device cpu (or auto)")
    if device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"--device {device!r}: expected auto, cpu or cuda[:N]")
    dev = torch.device(device)
    autocast = {"auto": dev.type == "cuda" or default_dtype() == "bfloat16", "bf16": True, "fp32": False}[precision]
    tpath = resolve_target(target)
    ckpt = Path(out) / "checkpoint"
    resume = (ckpt / "config.json").exists()
    if resume:  # the checkpoint fixes the mask: a different --mask-token-id is named, never ignored
        saved_mask = DFlashConfig.from_pretrained(ckpt).mask_token_id
        if mask_token_id is not None and mask_token_id != saved_mask:
            raise ValueError(f"--mask-token-id {mask_token_id} differs from the mask of the run being resumed "
                             f"({saved_mask}, {ckpt}). Fix: drop --mask-token-id, or start a new run (--out)")
    elif not init_draft and mask_token_id is None:
        # before anything heavy is loaded: a target outside the known table needs --mask-token-id (never a guess)
        mask_token_id = default_mask_token_id(json.loads((tpath / "config.json").read_text()))
    tgt = AutoModelForCausalLM.from_pretrained(str(tpath), dtype=torch.float32).eval().to(dev)
    ds = TrajectoryDataset.from_dir(data, max_len=max_len)
    train, held = ds.split()
    n_sampled = 0
    if greedy_only:  # sampled trajectories' labels are noise for a greedy draft (audit: ~16 % differ from greedy)
        n_sampled = len(train) - len(train.greedy_only())
        train = train.greedy_only()
    if train_fraction < 1.0:  # data-scaling runs: a fixed share of the training split, same held-out set
        train = train.fraction(train_fraction)
    out_dir = Path(out)
    held_run = _heldout_for_run(held, out_dir)
    logger.info("data: %d train sequences (%d response tokens), %d held-out greedy sequences (%d in this run's "
                "curve), %d sampled dropped, %d skipped", len(train), train.num_response_tokens(), len(held),
                len(held_run), n_sampled, ds.skipped)
    if not 0.0 <= hint_prob <= 1.0:
        raise ValueError(f"--hint-prob {hint_prob}: expected a share in [0, 1]")
    if resume:  # the draft architecture comes from the checkpoint
        draft = DFlashDraftModel.from_pretrained(ckpt, target=tgt)
        if hint_ngram is not None and tuple(hint_ngram) != draft.config.hint_ngram:
            raise ValueError(f"--hints {list(hint_ngram)} differs from the run being resumed (hint_ngram "
                             f"{draft.config.hint_ngram}, {ckpt}). Fix: drop --hints, or start a new run (--out)")
    else:
        vocab_ids = None
        if draft_vocab_size:
            vocab_ids = frequent_vocab(train, draft_vocab_size, always=(tgt.config.eos_token_id,))
        if init_draft:
            draft = init_from_draft(init_draft, tgt, vocab_ids, num_layers)
            if mask_token_id is not None and mask_token_id != draft.config.mask_token_id:
                raise ValueError(f"--mask-token-id {mask_token_id} differs from the mask of --init-draft "
                                 f"({draft.config.mask_token_id}). Fix: drop --mask-token-id")
            if hint_ngram is not None:  # a plain draft fine-tuned into a hinted one
                draft.config = draft.config.with_(hint_ngram=tuple(hint_ngram))
            logger.info("draft initialised from %s (fine-tuning%s)", init_draft,
                        f", hinted with n-grams {list(draft.config.hint_ngram)}" if draft.config.hint_ngram else "")
        else:
            cfg = DFlashConfig.for_target(tgt.config.to_dict(), num_layers=num_layers or 1, block_size=block_size,
                                          mask_token_id=mask_token_id, draft_vocab_size=draft_vocab_size
                                          ).with_(use_target_features=use_target_features, hint_ngram=hint_ngram)
            if vocab_ids is not None:
                cfg = cfg.with_(draft_vocab_size=len(vocab_ids))
            draft = DFlashDraftModel(cfg)
            draft.bind_target(tgt.get_input_embeddings().weight.detach(), tgt.get_output_embeddings().weight.detach(),
                              vocab_ids)
            tnorm = getattr(getattr(tgt, "model", None), "norm", None)
            if tnorm is not None and tnorm.weight.shape == draft.norm.weight.shape:
                # start from the target's final-norm scale: the shared lm_head expects it (initial CE ~9, not ~58)
                with torch.no_grad():
                    draft.norm.weight.copy_(tnorm.weight.float())
            if init_from_target:
                logger.info("draft layers initialised from the target's last %d layer(s): %d tensors copied",
                            len(draft.layers), init_layers_from_target(draft, tgt))
    draft = draft.to(dev)
    mask = draft.config.mask_token_id
    n_mask = sum(s.tokens[s.prompt_len:].count(mask) for s in train.items)  # tuple.count: ~ms per million tokens
    if n_mask:
        logger.warning("the target wrote the mask token %d %d times in the training responses: the draft cannot tell a "
                       "masked position from that real token. Fix: a new run with --mask-token-id <a token id the "
                       "target never reads or writes> (docs/MASK_TOKEN.md)", mask, n_mask)
    logger.info("draft: %d layers, block %d, %.1fM trainable parameters, draft vocabulary %s, mask %d, %s",
                draft.config.num_hidden_layers, draft.config.block_size, draft.num_parameters() / 1e6,
                draft.config.draft_vocab_size or "full", draft.config.mask_token_id,
                "bf16 autocast" if autocast else "fp32")
    trainer = BlockDiffusionTrainer(draft, tgt, out_dir=out_dir, lr=lr, anchors_per_seq=anchors_per_seq,
                                    ckpt_every=ckpt_every, log_every=log_every, diffusion_steps=diffusion_steps,
                                    feature_cache=feature_cache, standardize_features=standardize_features,
                                    autocast_bf16=autocast, run_steps=run_steps, run_minutes=run_minutes,
                                    time_budget_minutes=time_budget_minutes, hint_prob=hint_prob,
                                    gamma=gamma, kl_weight=kl_weight, kl_temperature=kl_temperature,
                                    eval_temperature=eval_temperature)
    result = trainer.train(train, batch_size=batch_size, num_epochs=num_epochs, eval_dataset=held_run,
                           eval_every=eval_every, max_steps=max_steps)
    # the speed-up estimate times the reference loop on this device: meaningful for CPU serving only
    report = trainer.evaluate(held, estimate_speedup=dev.type == "cpu") if len(held) else {}
    report["sequences"] = len(held)
    trainer.export(out_dir / "draft")
    (out_dir / "report.json").write_text(json.dumps({"train": result, "eval": report}, indent=1))
    return {"train": result, "eval": report, "draft": str(out_dir / "draft")}
