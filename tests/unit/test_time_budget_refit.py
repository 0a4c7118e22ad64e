# SPDX-License-Identifier: Apache-2.0
"""--time-budget-minutes when the step rate rises after start-up (as on a lent H200, where the first fit used only
62 % of the budget): the schedule is fitted a second time, at `refit_fraction` of the budget, from the steady rate."""
import pytest
import torch

from support.testing import load_target, tiny_trajectories
from vllm_dflash.model import DFlashDraftModel
from vllm_dflash.train.data import TrajectoryDataset
from vllm_dflash.train.trainer import BlockDiffusionTrainer


@pytest.fixture(scope="module")
def tgt(pair):
    return load_target(pair / "target")


def _run(pair, tgt, tmp_path, monkeypatch, refit_fraction):
    import vllm_dflash.train.trainer as trainer_mod

    clock = {"t": 0.0, "steps": 0}
    monkeypatch.setattr(trainer_mod.time, "perf_counter", lambda: clock["t"])
    torch.manual_seed(0)
    d = DFlashDraftModel.from_pretrained(pair / "draft-b8", target=tgt)
    d.init_weights(0.05)
    t = BlockDiffusionTrainer(d, tgt, out_dir=tmp_path, lr=3e-3, anchors_per_seq=8, log_every=1, ckpt_every=1000,
                              autocast_bf16=False, time_budget_minutes=1.0, probe_steps=4, budget_reserve=0.15,
                              refit_fraction=refit_fraction)
    real_loss = t._batch_loss

    def step(*a, **kw):  # the first 7 steps take 2 s (start-up), every later one 1 s
        clock["steps"] += 1
        clock["t"] += 2.0 if clock["steps"] <= 7 else 1.0
        return real_loss(*a, **kw)

    t._batch_loss = step
    return t.train(TrajectoryDataset(tiny_trajectories(tgt, 8, response_len=20, seed=7)), batch_size=1,
                   num_epochs=10_000, progress=False), t


def test_a_faster_steady_rate_lengthens_the_schedule_to_fill_the_budget(pair, tgt, tmp_path, monkeypatch):
    """First fit at step 7 (t = 14 s, probe rate 0.5 steps/s): 7 + 0.5 * (51 - 14) = 25 steps. The refit at step 11
    (t = 18 s >= 25 % of 60 s, 4 steps after the fit): 1 step/s over the last 4, so 11 + (51 - 18) = 44 steps, and the
    run ends there at t = 51 s with the cosine at its floor."""
    out, t = _run(pair, tgt, tmp_path / "refit", monkeypatch, refit_fraction=0.25)
    assert t.state["horizon"] == out["total_steps"] == out["step"] == 44, out
    rows = [r for r in t.state["history"] if "loss" in r]
    assert rows[-1]["lr"] == pytest.approx(0.1 * 3e-3)


def test_without_the_refit_the_first_fit_stands(pair, tgt, tmp_path, monkeypatch):
    """refit_fraction > 1 never refits: the start-up rate's 25 steps, the behaviour the refit corrects."""
    out, t = _run(pair, tgt, tmp_path / "once", monkeypatch, refit_fraction=2.0)
    assert out["step"] == 25, out
