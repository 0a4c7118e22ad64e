# SPDX-License-Identifier: Apache-2.0
"""`BlockDiffusionTrainer`: the DFlash training objective on CPU (or GPU), resumable to the step.

Per sequence: target features of `target_layer_ids` for every position (target frozen); random anchor
positions inside the response (resampled every epoch); blocks [anchor, MASK x (B-1)] at positions
a..a+B-1 attending to context < a and to their own block only (block mask); cross-entropy on block
positions 1..B-1 against the tokens at a+1..a+B-1, weighted exp(-(k-1)/γ), prompt tokens never
labels. Embedding and lm_head are the target's (frozen); a reduced draft vocabulary restricts the
output layer to the most frequent response tokens (saved with its d2t map, loadable by vLLM).

Exact resume: data order and anchors derive from (seed, epoch, index); a checkpoint holds weights,
optimizer, scheduler, RNG states, epoch and position, and is written atomically (train/checkpoint.py).
Settings and their defaults: `TrainConfig` (train/config.py); held-out τ: train/evaluation.py.
"""
from __future__ import annotations

import hashlib
import json
import math
import signal
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from vllm_dflash.adaptive.ngram import anchor_hints
from vllm_dflash.model import DFlashDraftModel
from vllm_dflash.train import checkpoint, evaluation
from vllm_dflash.train.checkpoint import restore_feature_scale  # noqa: F401 (re-exported)
from vllm_dflash.train.config import TrainConfig
from vllm_dflash.train.data import (TrajectoryDataset, block_attention_mask, loss_weights, sample_anchors)
from vllm_dflash.train.features import TargetFeatures
from vllm_dflash.utils import get_logger

logger = get_logger(__name__)


EVAL_KEYS = ("acceptance_length", "per_position_acceptance", "tokens_per_forward", "sampled")  # logged as eval_*


def _seed_of(*parts: Any) -> int:
    return int(hashlib.sha1(":".join(map(str, parts)).encode()).hexdigest()[:12], 16)


class BlockDiffusionTrainer:
    def __init__(self, draft_model: DFlashDraftModel, target_model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer | None = None, block_size: int | None = None,
                 diffusion_steps: int | None = None, out_dir: str | Path | None = None,
                 config: TrainConfig | None = None, feature_cache: str | Path | None = None, **overrides: Any):
        self.cfg = config or TrainConfig()
        for k, v in overrides.items():
            if not hasattr(self.cfg, k):
                raise TypeError(f"BlockDiffusionTrainer: unknown setting {k!r}")
            setattr(self.cfg, k, v)
        if diffusion_steps is not None:
            self.cfg.diffusion_steps = diffusion_steps
        self.draft = draft_model
        self.block_size = block_size or draft_model.config.block_size
        if self.block_size < 2:
            raise ValueError(f"block_size: {self.block_size} < 2. Fix: use 2 or more (8 or 16 typical)")
        self.device = next(draft_model.parameters()).device
        self.target = target_model
        if not draft_model.is_bound:
            draft_model.bind_target(target_model.get_input_embeddings().weight.detach().float(),
                                    target_model.get_output_embeddings().weight.detach().float())
        bf16 = self.cfg.autocast_bf16
        if bf16 is None:
            from vllm_dflash.utils import cpu_has_bf16

            bf16 = self.device.type == "cuda" or cpu_has_bf16()
        self.autocast = bf16
        self.features = TargetFeatures(target_model, draft_model.config.target_layer_ids, feature_cache, autocast_bf16=bf16)
        params = [p for p in draft_model.parameters() if p.requires_grad]
        self.optimizer = optimizer or torch.optim.AdamW(params, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay,
                                                        betas=(0.9, 0.95))
        self.scheduler = None
        self.out_dir = Path(out_dir) if out_dir else None
        self.weights = loss_weights(self.block_size, self.cfg.gamma).to(self.device)
        # target id -> draft id (-1: outside a reduced vocabulary, excluded from the loss)
        V = draft_model.config.vocab_size
        self.t2d = torch.full((V,), -1, dtype=torch.long, device=self.device)
        self.t2d[draft_model.draft_to_target.to(self.device)] = torch.arange(len(draft_model.draft_to_target), device=self.device)
        self.tail = None
        if self.cfg.kl_weight:
            if not 0 < self.cfg.kl_weight <= 1 or self.cfg.kl_temperature <= 0:
                raise ValueError(f"kl_weight {self.cfg.kl_weight}, kl_temperature {self.cfg.kl_temperature}. Fix: a "
                                 "kl_weight in (0, 1] (0 turns the KL term off) and a kl_temperature above 0")
            self.tail = self._make_tail()
        self.state = {"step": 0, "epoch": 0, "pos": 0, "history": []}
        self._stop = False

    # ------------------------------------------------------------------ objective
    def _batch_loss(self, seqs: list, epoch: int, index0: int) -> tuple[torch.Tensor, dict[str, float]]:
        d, B, dev = self.draft, self.block_size, self.device
        cfg = d.config
        N = len(seqs)
        S = max(len(s.tokens) for s in seqs)
        feats = self.features(seqs, dev, torch.float32)  # [N, S, F]
        anchors, A = [], 0
        gens = []
        for i, s in enumerate(seqs):
            g = torch.Generator().manual_seed(_seed_of(self.cfg.seed, epoch, index0 + i))
            gens.append(g)
            a = sample_anchors(s, self.cfg.anchors_per_seq, B, g)
            anchors.append(a)
            A = max(A, len(a))
        A = max(A, 1)
        toks = torch.zeros(N, S + B, dtype=torch.long)
        lens = torch.tensor([len(s.tokens) for s in seqs])
        for i, s in enumerate(seqs):
            toks[i, : len(s.tokens)] = torch.tensor(s.tokens)
        anc = torch.zeros(N, A, dtype=torch.long)
        anc_valid = torch.zeros(N, A, dtype=torch.bool)
        for i, a in enumerate(anchors):
            anc[i, : len(a)] = a
            anc_valid[i, : len(a)] = True
        k = torch.arange(B)
        pos = anc[:, :, None] + k  # [N, A, B]
        labels = torch.gather(toks, 1, pos.view(N, -1).clamp(max=S + B - 1)).view(N, A, B)[:, :, 1:]  # [N, A, B-1]
        lab_valid = (pos[:, :, 1:] < lens[:, None, None]) & anc_valid[:, :, None]
        ids = torch.full((N, A, B), cfg.mask_token_id, dtype=torch.long)
        ids[:, :, 0] = torch.gather(toks, 1, anc)
        if cfg.hint_ngram is not None:  # [anchor, h1 .. hm, MASK ..]: the lookup over each anchor's own context
            for i, (s, a) in enumerate(zip(seqs, anchors)):
                if not len(a):
                    continue
                h = torch.from_numpy(anchor_hints(np.asarray(s.tokens), a.numpy(), B - 1, *cfg.hint_ngram))
                use = (torch.rand(len(a), generator=gens[i]) < self.cfg.hint_prob)[:, None] & (h >= 0)
                ids[i, : len(a), 1:] = torch.where(use, h, ids[i, : len(a), 1:])
        revealed = torch.zeros(N, A, B - 1, dtype=torch.bool)
        if self.cfg.diffusion_steps > 1 and B > 2:
            for i in range(N):  # clean prefix of r tokens on a share of blocks (multi-step denoising inputs)
                use = torch.rand(A, generator=gens[i]) < self.cfg.reveal_prob
                r = torch.randint(1, B - 1, (A,), generator=gens[i]) * use
                revealed[i] = k[None, : B - 1] < r[:, None]
            ids[:, :, 1:] = torch.where(revealed & lab_valid, labels, ids[:, :, 1:])
        mask = torch.stack([block_attention_mask(anc[i], S, B) for i in range(N)])  # [N, A*B, S + A*B]
        # padded anchor slots: let them see their own block only (no NaN rows); their loss is masked
        ctx_pos = torch.arange(S)[None].expand(N, S)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=self.autocast):
            ctx = d.fuse(feats)
            ctx_kv = d.context_kv(ctx, ctx_pos.to(dev))
            hidden = d(d.embed(ids.view(N, A * B).to(dev)), pos.view(N, A * B).to(dev), ctx_kv, mask.to(dev))
            h = hidden.view(N, A, B, -1)[:, :, 1:]  # [N, A, B-1, H] same-position prediction
            logits = d.logits(h).float()  # [N, A, B-1, V_draft]
        tgt = self.t2d[labels.to(dev)]
        valid = lab_valid.to(dev) & (tgt >= 0) & ~revealed.to(dev)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.clamp(min=0).reshape(-1),
                             reduction="none").view_as(tgt)
        w = self.weights[None, None, :] * valid
        extra = {}
        per_slot = ce
        if self.cfg.kl_weight:
            kl = self._kl(feats, pos, logits)  # [N, A, B-1]
            per_slot = (1 - self.cfg.kl_weight) * ce + self.cfg.kl_weight * kl
            extra["kl"] = float((kl.detach() * w).sum() / w.sum().clamp(min=1e-6))
        loss = (per_slot * w).sum() / w.sum().clamp(min=1e-6)
        with torch.no_grad():
            acc = ((logits.argmax(-1) == tgt) & valid).sum() / valid.sum().clamp(min=1)
        return loss, {"loss": float(loss.detach()), "acc": float(acc), "tokens": int(valid.sum()),
                      "blocks": int(anc_valid.sum()),
                      "oov": float(((tgt < 0) & lab_valid.to(dev)).sum() / lab_valid.sum().clamp(min=1)), **extra}

    def _make_tail(self):
        """The target above the deepest feature layer (target_tail.py); self.deepest: that layer's feature slice."""
        from vllm_dflash.train.target_tail import TargetTail

        ids = list(self.draft.config.target_layer_ids)
        self.deepest = ids.index(max(ids))
        return TargetTail(self.target, max(ids), self.draft.draft_to_target)

    def _kl(self, feats: torch.Tensor, pos: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """[N, A, B-1] KL(target || draft) per slot; feats [N, S, F], pos [N, A, B], logits [N, A, B-1, V_draft].
        Slot k predicts the token at anchor + k: the target does so from its final hidden state at anchor + k - 1."""
        from vllm_dflash.train.target_tail import kl_to_target

        N, S, _ = feats.shape
        H = feats.shape[-1] // len(self.draft.config.target_layer_ids)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            final = self.tail.final_hidden(feats[..., self.deepest * H:(self.deepest + 1) * H])  # [N, S, H]
        at = pos[:, :, :-1].clamp(max=S - 1).to(feats.device)  # [N, A, B-1]
        h = torch.gather(final, 1, at.reshape(N, -1, 1).expand(-1, -1, final.shape[-1]))  # [N, A*(B-1), H]
        p_logits = self.tail.logits(h).view(*logits.shape)  # [N, A, B-1, V_draft]
        return kl_to_target(p_logits, logits, self.cfg.kl_temperature)

    # ------------------------------------------------------------------ training
    def _make_scheduler(self, total_steps: int) -> None:
        self.horizon = total_steps  # the schedule's length; a time budget can shorten it once the rate is known

        def lr_at(step: int) -> float:
            warm = max(1, int(self.cfg.warmup_ratio * self.horizon))
            if step < warm:
                return (step + 1) / warm
            prog = min(1.0, (step - warm) / max(1, self.horizon - warm))
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * prog))  # cosine down to 10%

        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_at)

    def total_steps(self, num_sequences: int) -> int:
        """Steps the run will take: the lr schedule is computed against this, the loop stops at it."""
        cfg = self.cfg
        by_epochs = math.ceil(num_sequences / cfg.batch_size) * cfg.num_epochs
        return min(cfg.max_steps, by_epochs) if cfg.max_steps else by_epochs

    @staticmethod
    def data_fingerprint(dataset: TrajectoryDataset) -> str:
        return hashlib.sha1("\n".join(f"{s.id}:{len(s.tokens)}" for s in dataset.items).encode()).hexdigest()[:16]

    def _fit_horizon(self, cap: int, step: int, rate: float, left_s: float, bar) -> int:
        """The lr schedule's length for a time budget: the steps that fit in `left_s` at `rate` steps/s (at most `cap`,
        at least one more step); held-out τ every eighth of it."""
        cfg = self.cfg
        total = self.horizon = max(step + 1, min(cap, step + int(rate * left_s)))
        cfg.eval_every = max(cfg.probe_steps, total // 8)
        logger.info("time budget %.1f min: %.1f steps/s -> schedule of %d steps, held-out τ every %d",
                    cfg.time_budget_minutes, rate, total, cfg.eval_every)
        bar.total = total
        bar.refresh()
        return total

    def train(self, dataset: TrajectoryDataset, batch_size: int | None = None, num_epochs: int | None = None,
              eval_dataset: TrajectoryDataset | None = None, eval_every: int | None = None,
              max_steps: int | None = None, progress: bool = True, resume: bool = True) -> dict[str, Any]:
        """Train to `total_steps` (epochs or max_steps, whichever ends first), checkpointing as configured.

        Resumable to the step. If the dataset changed since the checkpoint (a collection folder grew), the
        interrupted epoch is closed and the next one runs over the new data. `run_steps` / `run_minutes` end
        this invocation early (checkpointed, `paused` in the result): a wrapper re-reads the data and resumes."""
        from tqdm import tqdm

        cfg = self.cfg
        cfg.batch_size = batch_size or cfg.batch_size
        cfg.num_epochs = num_epochs or cfg.num_epochs
        cfg.eval_every = eval_every or cfg.eval_every
        cfg.max_steps = max_steps if max_steps is not None else cfg.max_steps
        total = self.total_steps(len(dataset))
        self._make_scheduler(total)
        fingerprint = self.data_fingerprint(dataset)
        if resume and self.out_dir and (self.out_dir / "checkpoint" / "trainer_state.pt").exists():
            self.load_checkpoint(self.out_dir / "checkpoint")
            logger.info("resumed from step %d (epoch %d, position %d)", self.state["step"], self.state["epoch"], self.state["pos"])
            if self.state.get("data", fingerprint) != fingerprint and self.state["pos"] > 0:
                logger.info("training data changed (%d sequences now): epoch %d starts over them",
                            len(dataset), self.state["epoch"] + 1)
                self.state["epoch"] += 1
                self.state["pos"] = 0
        self.state["data"] = fingerprint
        step0 = self.state["step"]
        if self.state["step"] == 0 and cfg.standardize_features and "feature_inv_scale" not in self.state \
                and self.draft.config.use_target_features:
            self._standardize(dataset)
        old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        for s in old:
            signal.signal(s, self._on_signal)
        bar = tqdm(total=total, initial=self.state["step"], desc="train", unit="step", disable=not progress, dynamic_ncols=True)
        t_last, tok_acc, blk_acc = time.perf_counter(), 0, 0
        wall0, t_start = float(self.state.get("wall_s", 0.0)), time.perf_counter()  # wall time summed over resumes
        t_ckpt, paused = t_start, False
        if cfg.time_budget_minutes is not None and "horizon" in self.state:
            self.horizon = total = min(total, self.state["horizon"])  # a resumed budgeted run keeps its schedule
        t_probe, fit_at, cap = None, None, total  # cap: the epochs' / --max-steps' length, never exceeded
        if eval_dataset is not None and len(eval_dataset) and self.state["step"] == 0 and not self.state["history"]:
            # the curve's first point: a fine-tune's starting τ on this run's held-out set (the bar to beat)
            ev = self.evaluate(eval_dataset, estimate_speedup=False)
            self._log({"step": 0, "eval_sequences": len(eval_dataset),
                       **{f"eval_{k}": v for k, v in ev.items() if k in EVAL_KEYS}})
            t_start = t_last = time.perf_counter()
        try:
            while self.state["step"] < total and self.state["epoch"] < cfg.num_epochs and not self._stop and not paused:
                e = self.state["epoch"]
                perm = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(_seed_of(cfg.seed, "epoch", e)))
                while self.state["pos"] < len(dataset) and self.state["step"] < total and not self._stop and not paused:
                    p0 = self.state["pos"]
                    idx = perm[p0: p0 + cfg.batch_size].tolist()
                    self.draft.train()
                    loss, info = self._batch_loss([dataset[i] for i in idx], e, p0)
                    self.optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    gnorm = torch.nn.utils.clip_grad_norm_(self.draft.parameters(), cfg.grad_clip)
                    self.optimizer.step()
                    self.scheduler.step()
                    self.state["pos"] = p0 + len(idx)
                    self.state["step"] += 1
                    self.state["wall_s"] = wall0 + time.perf_counter() - t_start
                    tok_acc += info["tokens"]
                    blk_acc += info["blocks"]
                    step = self.state["step"]
                    if cfg.time_budget_minutes is not None and "horizon" not in self.state:
                        if step - step0 == 3:  # rate from steps 4.., past warm-up costs (allocator, autotuning)
                            t_probe = time.perf_counter()
                        elif t_probe is not None and step - step0 == 3 + cfg.probe_steps:
                            rate = cfg.probe_steps / (time.perf_counter() - t_probe)
                            left = 60 * cfg.time_budget_minutes * (1 - cfg.budget_reserve) - (time.perf_counter() - t_start)
                            total = self._fit_horizon(cap, step, rate, left, bar)
                            self.state["horizon"] = total
                            fit_at = (step, time.perf_counter())
                    elif fit_at is not None and step - fit_at[0] >= cfg.probe_steps and \
                            time.perf_counter() - t_start >= 60 * cfg.time_budget_minutes * cfg.refit_fraction:
                        now = time.perf_counter()  # the steady rate, evals and checkpoints since the first fit included
                        rate = (step - fit_at[0]) / max(now - fit_at[1], 1e-9)
                        left = 60 * cfg.time_budget_minutes * (1 - cfg.budget_reserve) - (now - t_start)
                        total = self.state["horizon"] = self._fit_horizon(cap, step, rate, left, bar)
                        fit_at = None
                    bar.update(1)
                    if step % cfg.log_every == 0 or step == total:
                        dt = max(time.perf_counter() - t_last, 1e-9)
                        self._log({"step": step, "epoch": e, "loss": info["loss"], "acc": info["acc"],
                                   "lr": self.scheduler.get_last_lr()[0], "grad_norm": float(gnorm),
                                   "blocks_per_s": round(blk_acc / dt, 1), "label_tokens_per_s": round(tok_acc / dt, 1),
                                   "oov": info["oov"], "wall_s": round(self.state["wall_s"], 1),
                                   **({"kl": info["kl"]} if "kl" in info else {})})
                        bar.set_postfix(loss=f"{info['loss']:.3f}", acc=f"{info['acc']:.2f}", blk_s=f"{blk_acc / dt:.0f}")
                        t_last, tok_acc, blk_acc = time.perf_counter(), 0, 0
                    if eval_dataset is not None and len(eval_dataset) and step % cfg.eval_every == 0:
                        ev = self.evaluate(eval_dataset, estimate_speedup=False)
                        self._log({"step": step, "eval_sequences": len(eval_dataset),
                                   **{f"eval_{k}": v for k, v in ev.items() if k in EVAL_KEYS}})
                        best = self.state.get("best_eval")
                        if self.out_dir and (best is None or ev["acceptance_length"] > best["acceptance_length"]):
                            self.state["best_eval"] = {"step": step, "acceptance_length": ev["acceptance_length"]}
                            self.export(self.out_dir / "best")  # the serving draft with the best held-out τ so far
                        t_last, tok_acc, blk_acc = time.perf_counter(), 0, 0  # throughput counts training only
                    now = time.perf_counter()
                    paused = (cfg.run_steps is not None and step - step0 >= cfg.run_steps) or \
                        (cfg.run_minutes is not None and now - t_start >= 60 * cfg.run_minutes) or \
                        (cfg.time_budget_minutes is not None and now - t_start >= 60 * cfg.time_budget_minutes)
                    if self.out_dir and not paused and (step % cfg.ckpt_every == 0 or now - t_ckpt >= 60 * cfg.ckpt_minutes):
                        self.save_checkpoint()
                        t_ckpt = t_last = time.perf_counter()
                        tok_acc = blk_acc = 0
                if self.state["pos"] >= len(dataset):
                    self.state["epoch"] += 1
                    self.state["pos"] = 0
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            bar.close()
            if self.out_dir:
                self.save_checkpoint()
                self.plot()
        return {"step": self.state["step"], "epoch": self.state["epoch"], "total_steps": total,
                "interrupted": self._stop, "paused": paused and not self._stop}

    @torch.no_grad()
    def _standardize(self, dataset: TrajectoryDataset) -> None:
        """Per-dimension RMS of the target features over the first `standardize_sequences` sequences ->
        draft.feature_inv_scale (kept in the trainer state; folded into fc at export)."""
        n = min(len(dataset), self.cfg.standardize_sequences)
        if n == 0:
            return
        sq, count = None, 0
        for i in range(0, n, 8):
            seqs = [dataset[j] for j in range(i, min(n, i + 8))]
            f = self.features(seqs, self.device, torch.float32)  # [N, S, F], zero-padded
            valid = torch.zeros(f.shape[:2], dtype=torch.bool, device=f.device)
            for k, s in enumerate(seqs):
                valid[k, : len(s.tokens)] = True
            x = f[valid]  # [tokens, F]
            sq = x.pow(2).sum(0) if sq is None else sq + x.pow(2).sum(0)
            count += x.shape[0]
        inv = 1.0 / (sq / max(count, 1)).sqrt().clamp(min=1e-3)
        self.draft.feature_inv_scale.copy_(inv)
        self.state["feature_inv_scale"] = inv.cpu().tolist()
        logger.info("feature standardisation: per-dimension RMS over %d tokens: median %.3g, max %.3g", count,
                    float((1 / inv).median()), float((1 / inv).max()))

    def _on_signal(self, signum, frame) -> None:
        logger.warning("signal %d: stopping after this step and checkpointing", signum)
        self._stop = True

    def _log(self, row: dict[str, Any]) -> None:
        self.state["history"].append(row)
        if self.out_dir:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            with open(self.out_dir / "log.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self, eval_dataset: TrajectoryDataset, estimate_speedup: bool = True) -> dict[str, Any]:
        """Teacher-forced replay of the greedy loop on greedy target trajectories: exact τ for those contexts, and
        tokens per target forward of every drafting method (`evaluation.evaluate_draft`); estimate_speedup: also
        the reference-loop speed-up that τ implies on this device (`estimate_speedup`)."""
        out = evaluation.evaluate_draft(self.draft, self.block_size, eval_dataset, self._draft_all,
                                        self._sampled_acceptance if self.cfg.eval_temperature else None)
        if estimate_speedup:
            out.update(self.estimate_speedup(out["acceptance_length"]))
        return out

    def _draft_all(self, s, anchors: torch.Tensor, hints: torch.Tensor | None = None, chunk: int = 64,
                   second_choice: bool = False):
        """Greedy draft blocks at every anchor of sequence s (`evaluation.draft_all_anchors`)."""
        return evaluation.draft_all_anchors(self.draft, self.features, self.block_size, self.device, s, anchors, hints,
                                            chunk, second_choice)

    def _sampled_acceptance(self, s, anchors: torch.Tensor) -> torch.Tensor:
        """[A, B-1] sampled acceptance per slot at cfg.eval_temperature (`evaluation.sampled_acceptance_of`)."""
        if self.tail is None:
            self.tail = self._make_tail()
        return evaluation.sampled_acceptance_of(self.draft, self.features, self.tail, self.block_size, self.device,
                                                self.cfg.eval_temperature, s, anchors)

    def estimate_speedup(self, tau: float, context: int = 256, reps: int = 3) -> dict[str, float]:
        """Reference-loop speedup implied by τ (`evaluation.estimate_speedup`)."""
        return evaluation.estimate_speedup(self.draft, self.target, self.block_size, self.device, tau, context, reps)


    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str | Path | None = None) -> Path:
        """Write the checkpoint folder (default: <out_dir>/checkpoint), atomically (train/checkpoint.py)."""
        return checkpoint.save_checkpoint(Path(path) if path else self.out_dir / "checkpoint", self.draft,
                                          self.optimizer, self.scheduler, self.state, asdict(self.cfg))

    def load_checkpoint(self, path: str | Path) -> None:
        """Resume from a checkpoint folder: weights, optimizer, scheduler, RNG and trainer state."""
        self.state = checkpoint.load_checkpoint(path, self.draft, self.optimizer, self.scheduler, self.device)

    def export(self, path: str | Path) -> Path:
        """The draft in serving format (bf16 safetensors + config.json)."""
        return self.draft.save_pretrained(path, dtype=torch.bfloat16)

    def plot(self) -> Path | None:
        if not self.out_dir or not self.state["history"]:
            return None
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return None
        h = self.state["history"]
        tr = [r for r in h if "loss" in r]
        ev = [r for r in h if "eval_acceptance_length" in r]
        fig, ax = plt.subplots(1, 2, figsize=(11, 4))
        ax[0].plot([r["step"] for r in tr], [r["loss"] for r in tr])
        ax[0].set(title="training loss (weighted CE)", xlabel="step", ylabel="loss")
        ax[1].plot([r["step"] for r in ev], [r["eval_acceptance_length"] for r in ev], marker="o")
        ax[1].set(title="held-out acceptance length τ (block %d)" % self.block_size, xlabel="step", ylabel="τ")
        for a in ax:
            a.grid(alpha=0.3)
        fig.tight_layout()
        out = self.out_dir / "curves.png"
        fig.savefig(out, dpi=110)
        plt.close(fig)
        return out
