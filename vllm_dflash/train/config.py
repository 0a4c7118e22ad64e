# SPDX-License-Identifier: Apache-2.0
"""`TrainConfig`: every training setting of `BlockDiffusionTrainer` and its default, in one place (`vllm-dflash train`
reads its option defaults from these fields; tests/unit/test_train_defaults.py checks they agree)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainConfig:
    """The training settings and their defaults: `vllm-dflash train` and `run_train` take theirs from here (and the
    help shows them). `BlockDiffusionTrainer(..., **overrides)` sets any field."""

    lr: float = 6e-4  # peak; warm-up over warmup_ratio of the schedule, then cosine to 10 %
    warmup_ratio: float = 0.04
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    batch_size: int = 1  # sequences per optimizer step
    num_epochs: int = 1
    max_steps: int | None = None
    anchors_per_seq: int = 32
    gamma: float | None = None
    # the KL term (issue 54.5): loss = (1 - kl_weight) * CE(target's token) + kl_weight * KL(target || draft), the
    # target's next-token distribution over the draft vocabulary at kl_temperature (train/target_tail.py). 0: CE only
    kl_weight: float = 0.0
    kl_temperature: float = 1.0
    # held-out evaluation also estimates acceptance under sampling at this temperature (sum(min(p, q)) per slot, the
    # target's p rebuilt from the features; train/evaluation.py): the bar for drafts meant for sampled serving. 0: off
    eval_temperature: float = 0.7
    run_steps: int | None = None  # stop (and checkpoint) after this many steps in this invocation; resume continues
    run_minutes: float | None = None  # likewise after this much wall time
    # fit the schedule to a time budget: after `probe_steps` steps the lr schedule's length becomes the steps that
    # fit in this many minutes at the measured rate (evals and checkpoints reserve `budget_reserve` of it); the run
    # also stops when the budget is spent. For a lent GPU or a fixed slot: the cosine decay then really ends.
    time_budget_minutes: float | None = None
    probe_steps: int = 20
    budget_reserve: float = 0.15
    # the rate right after start-up understates the steady one (a lent H200 ran 1,210 of a fitted 1,210 steps in 62 %
    # of its budget), so the schedule is fitted once more when this share of the budget is spent
    refit_fraction: float = 0.25
    diffusion_steps: int = 1
    reveal_prob: float = 0.5  # with diffusion_steps > 1: share of blocks with a revealed clean prefix
    # hinted drafts (config.hint_ngram): share of blocks whose prompt-lookup hints are fed (where the lookup matches);
    # the rest stay [anchor, MASK ..], so the draft still drafts without hints. The loss covers hinted slots too: the
    # draft learns to keep right hints, fix wrong ones and extend them.
    hint_prob: float = 0.75
    eval_every: int = 1000  # held-out τ every this many steps (with an eval set)
    ckpt_every: int = 500  # checkpoint every this many steps (with an out_dir)
    ckpt_minutes: float = 5.0  # also checkpoint when this long has passed since the last one
    log_every: int = 50  # a training row every this many steps
    seed: int = 0
    autocast_bf16: bool | None = None  # None: on when the device has fast bf16
    # fc sees features / per-dimension RMS (folded into fc at export). Off by default: on SmolLM2 it did not raise
    # held-out τ over the full 1,188-step schedule (dev/LOG.md, session 4)
    standardize_features: bool = False
    standardize_sequences: int = 64  # sequences the RMS is measured on (new runs only)
