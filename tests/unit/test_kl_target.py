# SPDX-License-Identifier: Apache-2.0
"""The KL term of training (TrainConfig.kl_weight, train/target_tail.py): the target's distribution rebuilt from the
cached features equals a full forward's, the KL is the textbook one, and training with it lowers it."""
from __future__ import annotations

import pytest
import torch

from support.testing import load_target, tiny_trajectories
from vllm_dflash.model import DFlashDraftModel
from vllm_dflash.train.data import TrajectoryDataset
from vllm_dflash.train.target_tail import TargetTail, kl_to_target
from vllm_dflash.train.trainer import BlockDiffusionTrainer


@pytest.fixture(scope="module")
def tgt(pair):
    return load_target(pair / "target")


def test_the_tail_from_a_middle_layer_gives_the_full_forwards_logits(tgt):
    """Layers above `deepest`, the final norm and the output rows applied to layer `deepest`'s output (what the
    feature cache stores) == the target's own logits, at every position of right-padded sequences of two lengths."""
    n_layers = len(tgt.model.layers)
    deepest = n_layers - 2  # one layer left to run
    rows = torch.tensor([0, 3, 5, 17, 40])
    tail = TargetTail(tgt, deepest, rows)
    ids = torch.randint(0, tgt.config.vocab_size, (2, 12))
    with torch.no_grad():
        out = tgt(input_ids=ids, output_hidden_states=True)
    got = tail.logits(tail.final_hidden(out.hidden_states[deepest + 1]))  # [2, 12, 5]
    torch.testing.assert_close(got, out.logits[..., rows].float(), rtol=1e-4, atol=1e-4)
    short = tail.logits(tail.final_hidden(out.hidden_states[deepest + 1][:1, :7]))  # a shorter sequence: causal
    torch.testing.assert_close(short, got[:1, :7], rtol=1e-4, atol=1e-4)


def test_kl_is_kl_and_zero_on_equal_distributions():
    p, q = torch.randn(4, 3, 9), torch.randn(4, 3, 9)
    want = torch.nn.functional.kl_div(torch.log_softmax(q, -1), torch.log_softmax(p, -1), log_target=True,
                                      reduction="none").sum(-1)
    torch.testing.assert_close(kl_to_target(p, q), want)
    assert kl_to_target(p, p).abs().max() < 1e-6 and (kl_to_target(p, q) > 0).all()
    torch.testing.assert_close(kl_to_target(p, q, 2.0), kl_to_target(p / 2, q / 2))


def test_bad_kl_settings_are_refused(pair, tgt):
    d = DFlashDraftModel.from_pretrained(pair / "draft-b8", target=tgt)
    with pytest.raises(ValueError, match="kl_weight"):
        BlockDiffusionTrainer(d, tgt, kl_weight=1.5)
    with pytest.raises(ValueError, match="kl_temperature"):
        BlockDiffusionTrainer(d, tgt, kl_weight=0.5, kl_temperature=0.0)


def test_training_with_the_kl_term_lowers_it(pair, tgt):
    """kl_weight 1: the loss is the KL alone (logged as `kl`), and a few epochs on tiny trajectories lower it."""
    torch.manual_seed(0)
    recs = tiny_trajectories(tgt, 24, response_len=24, seed=5)
    d = DFlashDraftModel.from_pretrained(pair / "draft-b8", target=tgt)
    d.init_weights(0.05)
    t = BlockDiffusionTrainer(d, tgt, lr=3e-3, anchors_per_seq=8, log_every=1, kl_weight=1.0, autocast_bf16=False)
    t.train(TrajectoryDataset(recs), batch_size=8, num_epochs=4, progress=False)
    rows = [r for r in t.state["history"] if "loss" in r]
    assert all(abs(r["loss"] - r["kl"]) < 1e-4 for r in rows)  # weight 1: the loss is the KL
    assert sum(r["kl"] for r in rows[-3:]) < 0.8 * sum(r["kl"] for r in rows[:3])


def test_sampled_acceptance_is_sum_of_min_and_one_when_the_draft_is_the_target():
    from vllm_dflash.train.target_tail import sampled_acceptance

    logits = torch.randn(3, 5, 11)
    p = torch.softmax(logits / 0.7, -1)
    torch.testing.assert_close(sampled_acceptance(p, logits, 0.7), torch.ones(3, 5))  # q == p
    q_logits = torch.randn(3, 5, 11)
    want = torch.minimum(p, torch.softmax(q_logits / 0.7, -1)).sum(-1)
    torch.testing.assert_close(sampled_acceptance(p, q_logits, 0.7), want)
    assert (want < 1).all()


def test_held_out_evaluation_estimates_sampled_acceptance(pair, tgt):
    """evaluate() reports `sampled`: per-slot sum(min(p, q)) at eval_temperature over every anchor (teacher-forced),
    and the expected accepted length 1 + sum_k prod_{j<=k} alpha_j; with eval_temperature 0 it is not computed.
    Checked against a direct computation for one anchor: the target's own next-token distribution from a full
    forward, the draft's block logits."""
    from vllm_dflash.train import evaluation

    torch.manual_seed(0)
    recs = tiny_trajectories(tgt, 2, response_len=12, seed=3)
    ds = TrajectoryDataset(recs)
    d = DFlashDraftModel.from_pretrained(pair / "draft-b8", target=tgt)
    d.init_weights(0.05)
    t = BlockDiffusionTrainer(d, tgt, autocast_bf16=False, eval_temperature=0.7)
    r = t.evaluate(ds, estimate_speedup=False)["sampled"]
    B = t.block_size
    assert len(r["per_position_acceptance"]) == B - 1 and all(0 <= a <= 1 for a in r["per_position_acceptance"])
    assert 1.0 <= r["acceptance_length"] <= B
    # one anchor by hand: slot 1 at the sequence's first response position
    s = ds.items[0]
    a = torch.tensor([s.prompt_len])
    alpha = t._sampled_acceptance(s, a)  # [1, B-1]
    with torch.no_grad():
        full = tgt(input_ids=torch.tensor([s.tokens])).logits[0, s.prompt_len].float()  # predicts token a + 1
    p = torch.softmax(full / 0.7, -1)[d.draft_to_target]
    with torch.no_grad():
        _, q = evaluation.draft_all_anchors(d, t.features, B, t.device, s, a, logits=True)
    want = torch.minimum(p, torch.softmax(q[0, 0] / 0.7, -1)).sum()
    assert float(alpha[0, 0]) == pytest.approx(float(want), abs=1e-4)
    t.cfg.eval_temperature = 0.0
    assert "sampled" not in t.evaluate(ds, estimate_speedup=False)
