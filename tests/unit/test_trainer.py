# SPDX-License-Identifier: Apache-2.0
import math

import pytest
import torch

from vllm_dflash.model import DFlashDraftModel
from support.testing import load_target, tiny_trajectories
from vllm_dflash.train.data import Sequence_, TrajectoryDataset, block_attention_mask, loss_weights, sample_anchors
from vllm_dflash.train.trainer import BlockDiffusionTrainer, _seed_of


def test_block_mask_matches_loop_built_mask():
    anchors, C, B = torch.tensor([3, 7, 8]), 12, 4
    got = block_attention_mask(anchors, C, B)
    want = torch.zeros(len(anchors) * B, C + len(anchors) * B, dtype=torch.bool)
    for i, a in enumerate(anchors.tolist()):
        for k in range(B):
            q = i * B + k
            for j in range(C):
                want[q, j] = j < a  # context strictly before the anchor
            for k2 in range(B):
                want[q, C + i * B + k2] = True  # own block, non-causal
    assert torch.equal(got, want)


def test_loss_weights():
    w = loss_weights(8)
    assert w.shape == (7,) and w[0] == 1.0
    assert torch.allclose(w, torch.exp(-torch.arange(7) / 4.0))
    assert torch.allclose(loss_weights(16), torch.exp(-torch.arange(15) / 7.0))


def test_anchors_stay_in_the_response():
    s = Sequence_("x", tuple(range(30)), prompt_len=10, greedy=True)
    a = sample_anchors(s, 100, 8, torch.Generator().manual_seed(0))
    assert a.min() >= 10 and a.max() <= 28 and len(a) == 19 and torch.equal(a, a.sort().values)


@pytest.fixture(scope="module")
def data(pair):
    tgt = load_target(pair / "target")
    recs = tiny_trajectories(tgt, 48, response_len=24, seed=5)
    return tgt, TrajectoryDataset(recs[:40]), TrajectoryDataset(recs[40:])


def _trainer(pair, tgt, out=None, **kw):
    torch.manual_seed(0)
    d = DFlashDraftModel.from_pretrained(pair / "draft-b8", target=tgt)
    d.init_weights(0.05)
    return BlockDiffusionTrainer(d, tgt, out_dir=out, lr=3e-3, anchors_per_seq=8, log_every=1, **kw)


def test_loss_decreases(pair, data):
    tgt, train, _ = data
    t = _trainer(pair, tgt)
    t.train(train, batch_size=8, num_epochs=4, progress=False)
    losses = [r["loss"] for r in t.state["history"] if "loss" in r]
    assert sum(losses[-3:]) / 3 < 0.6 * sum(losses[:3]) / 3


def test_resume_after_interruption_is_exact(pair, data, tmp_path):
    tgt, train, _ = data
    full = _trainer(pair, tgt, tmp_path / "full", ckpt_every=1000)
    full.train(train, batch_size=8, num_epochs=2, progress=False)
    # SIGTERM arrives during step 3: the trainer finishes the step, checkpoints and returns; a fresh
    # trainer (new process in real life) resumes from disk
    part = _trainer(pair, tgt, tmp_path / "part", ckpt_every=1000)
    log = part._log

    def log_and_maybe_interrupt(row):
        log(row)
        if row.get("step") == 3:
            part._on_signal(15, None)

    part._log = log_and_maybe_interrupt
    out = part.train(train, batch_size=8, num_epochs=2, progress=False)
    assert out["interrupted"] and out["step"] == 3
    resumed = _trainer(pair, tgt, tmp_path / "part", ckpt_every=1000)
    resumed.train(train, batch_size=8, num_epochs=2, progress=False)
    assert resumed.state["step"] == full.state["step"] == 10
    for (k, a), (_, b) in zip(full.draft.state_dict().items(), resumed.draft.state_dict().items()):
        assert torch.equal(a, b), k
    assert (tmp_path / "part" / "curves.png").exists() and (tmp_path / "part" / "log.jsonl").exists()


def test_evaluate_api(pair, data):
    tgt, _, held = data
    t = _trainer(pair, tgt)
    r = t.evaluate(held)
    assert {"acceptance_length", "per_position_acceptance", "speedup"} <= set(r)
    assert 1.0 <= r["acceptance_length"] <= 8 and math.isfinite(r["speedup"])


def test_init_from_target_and_no_feature_baseline(pair, data, tmp_path):
    """--init-from-target copies the target's last layer; the no-target-features baseline ignores the features,
    round-trips its flag, and is refused for serving."""
    from vllm_dflash.config import DFlashConfig, DFlashConfigError
    from vllm_dflash.integration.validation import validate_dflash_spec
    from vllm_dflash.train.run import init_layers_from_target

    tgt, _, _ = data
    d = DFlashDraftModel.from_pretrained(pair / "draft-b8", target=tgt)
    assert init_layers_from_target(d, tgt) >= 9  # q/k/v/o, gate/up/down, two norms
    last = tgt.model.layers[-1]
    assert torch.equal(d.layers[0].self_attn.q_proj.weight, last.self_attn.q_proj.weight.to(d.layers[0].self_attn.q_proj.weight.dtype))
    assert torch.equal(d.layers[0].mlp.down_proj.weight, last.mlp.down_proj.weight.to(d.layers[0].mlp.down_proj.weight.dtype))

    base = DFlashDraftModel(d.config.with_(use_target_features=False))
    feats = torch.randn(2, 5, d.fc.in_features)
    assert torch.count_nonzero(base.fuse(feats)) == 0 and torch.count_nonzero(d.fuse(feats)) > 0
    cfg = DFlashConfig.from_hf_config(base.config.to_hf_config())
    assert cfg.use_target_features is False and "use_target_features" not in d.config.to_hf_config()["dflash_config"]
    base.bind_target(tgt.get_input_embeddings().weight.detach(), tgt.get_output_embeddings().weight.detach())
    out = base.save_pretrained(tmp_path / "nofeat")
    with pytest.raises(DFlashConfigError, match="use_target_features"):
        validate_dflash_spec({"model": str(out)}, tgt.config)


def test_feature_cache_refuses_other_layers(pair, data, tmp_path):
    from vllm_dflash.train.features import TargetFeatures

    tgt, _, _ = data
    TargetFeatures(tgt, (0, 1), tmp_path / "f")
    TargetFeatures(tgt, (0, 1), tmp_path / "f")  # same layers: fine
    with pytest.raises(ValueError, match="another --feature-cache"):
        TargetFeatures(tgt, (1,), tmp_path / "f")


def test_feature_standardisation_is_folded_at_export(pair, data, tmp_path):
    """With standardize_features, training standardises the features (fc sees x / rms); the exported draft folds the scale into fc, so a loader
    that feeds raw features (vLLM, from_pretrained) computes the same context."""
    tgt, train, _ = data
    t = _trainer(pair, tgt, out=tmp_path / "run", standardize_features=True)
    t.train(train, batch_size=8, num_epochs=1, max_steps=2, progress=False)
    inv = t.draft.feature_inv_scale
    assert not torch.allclose(inv, torch.ones_like(inv)) and "feature_inv_scale" in t.state
    feats = t.features([train[0]], t.device, torch.float32)[0]
    ref = t.draft.fuse(feats)
    out = t.export(tmp_path / "draft")
    served = DFlashDraftModel.from_pretrained(out, target=tgt)
    assert torch.allclose(served.feature_inv_scale, torch.ones_like(inv))
    assert torch.allclose(served.fuse(feats), ref, atol=3e-2, rtol=3e-2)  # bf16 export
    # the checkpoint keeps fc unfolded and the scale in the trainer state: a resumed trainer sees the same context
    t2 = _trainer(pair, tgt, out=tmp_path / "run")
    t2.load_checkpoint(tmp_path / "run" / "checkpoint")
    assert torch.equal(t2.draft.feature_inv_scale, inv) and torch.allclose(t2.draft.fuse(feats), ref, atol=1e-5)


def test_train_fraction_is_a_deterministic_subset():
    from vllm_dflash.train.data import TrajectoryDataset

    recs = [{"id": f"s{i}", "prompt_ids": [1, 2], "response_ids": [3, 4, 5, 6, 7]} for i in range(400)]
    ds = TrajectoryDataset(recs)
    half = ds.fraction(0.5)
    assert 150 < len(half) < 250 and [s.id for s in half.items] == [s.id for s in ds.fraction(0.5).items]
    assert {s.id for s in ds.fraction(0.25).items} <= {s.id for s in half.items}  # nested shares
    with pytest.raises(ValueError, match="train fraction"):
        ds.fraction(0.0)


def test_hinted_blocks_feed_each_anchors_own_lookup(pair, data, tmp_path):
    """A hinted draft (config.hint_ngram): with hint_prob 1 every block whose context has a prompt-lookup match is
    [anchor, h1 .. hm, MASK ..] with exactly anchor_hints' tokens, computed from the context up to the anchor only;
    evaluation replays dflash / lookup / merged / hinted / hinted_merged; the setting survives a checkpoint."""
    import numpy as np

    from vllm_dflash.adaptive.ngram import anchor_hints

    tgt, train, held = data
    t = _trainer(pair, tgt, tmp_path / "run", hint_prob=1.0)
    t.draft.config = t.draft.config.with_(hint_ngram=(2, 4))
    seen = []
    embed = t.draft.embed
    t.draft.embed = lambda ids: (seen.append(ids.clone()), embed(ids))[1]
    t._batch_loss(train.items[:2], epoch=0, index0=0)
    B, mask = t.block_size, t.draft.config.mask_token_id
    ids = seen[0].view(2, -1, B)
    hinted = 0
    for i, s in enumerate(train.items[:2]):
        a = ids[i, :, 0]
        anchors = sample_anchors(s, t.cfg.anchors_per_seq, B, torch.Generator().manual_seed(_seed_of(t.cfg.seed, 0, i)))
        assert torch.equal(torch.tensor(s.tokens)[anchors], a[: len(anchors)])  # the same anchors as the batch
        want = torch.from_numpy(anchor_hints(np.asarray(s.tokens), anchors.numpy(), B - 1, 2, 4))
        got = ids[i, : len(anchors), 1:]
        assert torch.equal(torch.where(want >= 0, want, torch.full_like(want, mask)), got)
        hinted += int((want >= 0).any(1).sum())
    assert hinted > 0  # the greedy tiny trajectories repeat themselves: some anchors have a match
    r = t.evaluate(held, estimate_speedup=False)
    tpf = r["tokens_per_forward"]
    assert set(tpf) == {"dflash", "lookup", "merged", "hinted", "hinted_merged"}
    assert all(1.0 <= v <= B for v in tpf.values())
    assert tpf["merged"] >= tpf["lookup"]  # the block only fills slots the lookup left empty
    t.save_checkpoint()
    assert DFlashDraftModel.from_pretrained(tmp_path / "run" / "checkpoint", target=tgt).config.hint_ngram == (2, 4)


def test_evaluate_counts_slot1_second_choice(pair, data, monkeypatch):
    """r (issue 54.6): among the plain block's slot-1 misses on the replayed walk, the share whose second choice is
    the target's token. With drafts forced (first choice always wrong, so the walk visits all 19 anchors), a second
    choice right at every other anchor gives r = 10/19, and a second choice never right gives 0."""
    import functools

    tgt, _, held = data
    t = _trainer(pair, tgt)
    ds = TrajectoryDataset([{"id": "x", "prompt_ids": list(range(100, 110)), "response_ids": list(range(110, 130))}])
    # response tokens 110..129: anchors 10..28

    def forced(seq, anchors, hints=None, chunk=64, second_choice=False, right_every=2):
        nxt = torch.tensor(seq.tokens)[anchors + 1]  # [A] the token each anchor's slot 1 must guess
        first = torch.full((len(anchors), t.block_size - 1), 7)  # [A, B-1], never right
        second = first.clone()
        hit = torch.arange(len(anchors)) % right_every == 0
        second[hit, 0] = nxt[hit]
        return (first, second) if second_choice else first

    monkeypatch.setattr(t, "_draft_all", forced)
    r = t.evaluate(ds, estimate_speedup=False)["slot1_second_choice"]
    assert r["misses"] == 19 and r["caught"] == 10 and r["r"] == pytest.approx(10 / 19)
    monkeypatch.setattr(t, "_draft_all", functools.partial(forced, right_every=10**6))
    r = t.evaluate(ds, estimate_speedup=False)["slot1_second_choice"]
    assert r["misses"] == 19 and r["caught"] == 1  # anchor 0 only (0 % 10**6 == 0)


class _Payload:
    """Unpickling this calls os.mkdir(marker): proof that a checkpoint ran code when loaded."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return os.mkdir, (self.marker,)


def test_a_checkpoint_with_a_pickle_payload_is_refused(pair, data, tmp_path):
    """Export and resume load trainer_state.pt with weights_only=True: the real layout (optimizer, scheduler, state,
    config, RNG) still loads, and a file that unpickles to a call (here os.mkdir) is refused before the call runs.
    Regression (issue 51 item 8): weights_only=False ran the payload when exporting or resuming a run folder."""
    import pickle

    from vllm_dflash.train.export import export_draft

    tgt, train, _ = data
    t = _trainer(pair, tgt, out=tmp_path / "run")
    t.train(train, batch_size=8, num_epochs=1, max_steps=1, progress=False)
    ckpt = tmp_path / "run" / "checkpoint"
    assert export_draft(tmp_path / "run", tmp_path / "draft", target=str(pair / "target"))["step"] == 1
    _trainer(pair, tgt, out=tmp_path / "run").load_checkpoint(ckpt)

    marker = tmp_path / "payload_ran"
    st = torch.load(ckpt / "trainer_state.pt", weights_only=True)
    st["state"]["history"].append(_Payload(marker))
    torch.save(st, ckpt / "trainer_state.pt")
    with pytest.raises(pickle.UnpicklingError):
        export_draft(tmp_path / "run", tmp_path / "draft2", target=str(pair / "target"))
    with pytest.raises(pickle.UnpicklingError):
        _trainer(pair, tgt, out=tmp_path / "run").load_checkpoint(ckpt)
    assert not marker.exists(), "loading the checkpoint ran its code"
