# SPDX-License-Identifier: Apache-2.0
"""Training defaults live in one place, `TrainConfig`: every `vllm-dflash train` option that sets a TrainConfig
field, and every keyword of `run_train` that does, defaults to that field's default; `train --help` shows each."""
from __future__ import annotations

import argparse
import dataclasses
import inspect

from vllm_dflash.train.config import TrainConfig

# `vllm-dflash train` option (its argparse dest) -> the TrainConfig field it sets. --precision sets autocast_bf16 by
# another vocabulary (auto / bf16 / fp32, resolved per device in run_train), so it is not compared here.
CLI_TO_FIELD = {
    "lr": "lr", "batch_size": "batch_size", "epochs": "num_epochs", "max_steps": "max_steps",
    "anchors": "anchors_per_seq", "gamma": "gamma", "run_steps": "run_steps", "run_minutes": "run_minutes",
    "time_budget_minutes": "time_budget_minutes", "diffusion_steps": "diffusion_steps", "hint_prob": "hint_prob",
    "eval_every": "eval_every", "ckpt_every": "ckpt_every", "log_every": "log_every",
    "standardize_features": "standardize_features", "kl_weight": "kl_weight", "kl_temperature": "kl_temperature",
    "eval_temperature": "eval_temperature",
}


def _train_parser() -> argparse.ArgumentParser:
    from vllm_dflash.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["train"]


def _defaults() -> dict[str, object]:
    return {f.name: f.default for f in dataclasses.fields(TrainConfig)}


def test_cli_train_defaults_are_train_config_defaults():
    """Each train option mapped to a TrainConfig field has that field's default (before, --batch-size, --eval-every,
    --ckpt-every and --log-every said 1, 1000, 500 and 50 where TrainConfig said 4, 200, 100 and 10)."""
    actions = {a.dest: a for a in _train_parser()._actions}
    defaults = _defaults()
    assert set(CLI_TO_FIELD) <= set(actions), sorted(set(CLI_TO_FIELD) - set(actions))
    wrong = {dest: (actions[dest].default, defaults[field]) for dest, field in CLI_TO_FIELD.items()
             if actions[dest].default != defaults[field]}
    assert not wrong, f"CLI default != TrainConfig default (cli, TrainConfig): {wrong}"


def test_every_train_option_named_like_a_field_is_compared():
    """A train option whose dest is a TrainConfig field's name is in the comparison above (so a new one is not
    missed)."""
    fields = set(_defaults())
    named = {a.dest for a in _train_parser()._actions if a.dest in fields}
    assert named <= set(CLI_TO_FIELD), sorted(named - set(CLI_TO_FIELD))


def test_run_train_keyword_defaults_are_train_config_defaults():
    """`run_train` (what the CLI calls, also called directly) defaults each TrainConfig keyword to the field's
    default."""
    from vllm_dflash.train.run import run_train

    params = inspect.signature(run_train).parameters
    defaults = _defaults()
    shared = set(params) & set(defaults)
    assert set(CLI_TO_FIELD.values()) <= shared, sorted(set(CLI_TO_FIELD.values()) - shared)
    wrong = {k: (params[k].default, defaults[k]) for k in shared if params[k].default != defaults[k]}
    assert not wrong, f"run_train default != TrainConfig default (run_train, TrainConfig): {wrong}"


def test_train_help_shows_the_train_config_defaults():
    """`vllm-dflash train --help` prints each compared option's default, and the TrainConfig values the help text
    quotes (warm-up share, checkpoint minutes, probe steps)."""
    p = _train_parser()
    text = " ".join(p.format_help().split())
    for a in p._actions:
        if a.dest in CLI_TO_FIELD and "default" not in (a.help or ""):
            assert f"(default: {a.default})" in text, a.dest
    cfg = TrainConfig()
    assert f"{cfg.warmup_ratio * 100:g}% warm-up" in text
    assert f"every {cfg.ckpt_minutes:g} minutes" in text
    assert f"after {cfg.probe_steps} steps" in text
