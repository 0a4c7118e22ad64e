# SPDX-License-Identifier: Apache-2.0
"""The trainer fixes of the training audit (../shared/reference/training-audit.md §2): output-layer matmul, vocabulary
truncation, feature-cache keys, greedy-only data, the 1 x 32 bf16 recipe as CLI defaults, several data folders, the
mask-token default, blocks/s in the log, and pausing / resuming over grown data."""
import gzip
import json

import pytest
import torch

from vllm_dflash.model import DFlashDraftModel
from support.testing import load_target, tiny_trajectories
from vllm_dflash.train.data import Sequence_, TrajectoryDataset, heldout_hash
from vllm_dflash.train.run import KNOWN_MASK_TOKEN_IDS, default_mask_token_id, frequent_vocab
from vllm_dflash.train.features import TargetFeatures
from vllm_dflash.train.trainer import BlockDiffusionTrainer


@pytest.fixture(scope="module")
def tgt(pair):
    return load_target(pair / "target")


@pytest.fixture(scope="module")
def recs(tgt):
    return tiny_trajectories(tgt, 24, response_len=20, seed=7)


def _write_collection(folder, records):
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / "part-00000.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return folder


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logits_equal_the_old_formula_on_strided_slices(pair, tgt, dtype):
    d = DFlashDraftModel.from_pretrained(pair / "draft-b8", target=tgt)
    hidden = torch.randn(2, 3, 8, d.config.hidden_size).to(dtype)
    h = hidden[:, :, 1:]  # the non-contiguous slice the trainer and draft_block pass
    assert not h.is_contiguous()
    old = h @ d.lm_head_weight.to(dtype).t()
    new = d.logits(h)
    assert new.shape == old.shape and new.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(new, old, atol=tol, rtol=tol)


def test_frequent_vocab_drops_the_least_frequent_not_the_largest_ids():
    seqs = [Sequence_("a", (0, 900, 900, 900, 5, 5, 7), 1, True)]  # 900 x3, 5 x2, 7 x1 (0 is the prompt)
    ds = TrajectoryDataset([])
    ds.items = seqs
    assert frequent_vocab(ds, 2).tolist() == [5, 900]
    assert frequent_vocab(ds, 2, always=(2,)).tolist() == [2, 5, 900]  # `always` comes on top of the `size`
    assert frequent_vocab(ds, 10).tolist() == [0, 5, 7, 900]  # prompt tokens fill a vocabulary the responses leave short
    assert frequent_vocab(ds, 10, fill_from_prompts=False).tolist() == [5, 7, 900]
    assert frequent_vocab(ds, 3).tolist() == [5, 7, 900]  # response tokens first


def test_feature_cache_key_covers_what_shapes_the_features(tgt, recs, tmp_path):
    long_ = TrajectoryDataset(recs[:1], max_len=64)[0]
    short = TrajectoryDataset(recs[:1], max_len=20)[0]
    assert long_.id == short.id and len(long_.tokens) != len(short.tokens)
    f = TargetFeatures(tgt, (0, 1), tmp_path / "c")
    assert f.cache_file(long_) != f.cache_file(short)
    assert TargetFeatures(tgt, (0, 1), tmp_path / "c", autocast_bf16=True).cache_file(long_) != f.cache_file(long_)
    assert TargetFeatures(tgt, (1, 2), tmp_path / "c2").cache_file(long_).name != f.cache_file(long_).name
    # a cached long sequence must not be served for the truncated one (the old id-only key zero-padded it)
    full = f([long_], torch.device("cpu"), torch.float32)
    cut = f([short], torch.device("cpu"), torch.float32)
    assert cut.shape[1] == len(short.tokens) and len(list((tmp_path / "c").glob("*.pt"))) == 2
    torch.testing.assert_close(cut[0], full[0, : len(short.tokens)], atol=0.05, rtol=0.05)  # causal target, bf16 cache


def test_feature_cache_writes_are_atomic(tgt, recs, tmp_path, monkeypatch):
    """A run killed mid-write (or another run sharing the cache) must never find a partial .pt file: the features
    are written to a temporary name and renamed into place."""
    seq = TrajectoryDataset(recs[:1], max_len=32)[0]
    f = TargetFeatures(tgt, (0, 1), tmp_path / "c")

    def dies_mid_write(obj, path):
        open(path, "wb").write(b"partial")
        raise KeyboardInterrupt  # the process is killed while torch.save writes

    monkeypatch.setattr(torch, "save", dies_mid_write)
    with pytest.raises(KeyboardInterrupt):
        f([seq], torch.device("cpu"), torch.float32)
    assert not f.cache_file(seq).exists()  # the next read recomputes instead of loading garbage
    monkeypatch.undo()
    out = f([seq], torch.device("cpu"), torch.float32)
    assert f.cache_file(seq).exists()
    torch.testing.assert_close(f([seq], torch.device("cpu"), torch.float32), out)  # now read from the cache


def test_greedy_only_and_a_split_that_never_trains_on_held_out_ids():
    recs = [{"id": f"s{i}", "prompt_ids": [1, 2], "response_ids": [3, 4, 5, 6], "temperature": 0.7 if i % 4 == 0 else 0.0}
            for i in range(3000)]
    ds = TrajectoryDataset(recs)
    tr, ev = ds.split(eval_fraction=0.05, max_eval=10)
    assert len(ev) == 10 and all(s.greedy for s in ev.items)
    assert not any(s.greedy and heldout_hash(s.id) < 0.05 for s in tr.items)  # past the cap: dropped, not trained
    g = tr.greedy_only()
    assert len(g) < len(tr) and all(s.greedy for s in g.items)


def test_data_from_several_folders(recs, tmp_path):
    a = _write_collection(tmp_path / "v1", [dict(r, temperature=0.7) for r in recs[:10]])
    b = _write_collection(tmp_path / "v2", recs[5:15])  # ids 5..9 collected again (greedy)
    ds = TrajectoryDataset.from_dir(f"{a},{b}")
    assert [s.id for s in ds.items] == [r["id"] for r in recs[:15]]
    assert [s.greedy for s in ds.items] == [False] * 5 + [True] * 10  # the later folder's record wins


def test_mask_token_default_comes_from_a_table_of_known_targets(tgt):
    assert default_mask_token_id({"model_type": "llama", "vocab_size": 49152}) == 16
    assert KNOWN_MASK_TOKEN_IDS[("llama", 49152)] == 16
    with pytest.raises(ValueError, match="--mask-token-id"):
        default_mask_token_id({"model_type": "qwen3", "vocab_size": 151936})


def test_cli_defaults_are_the_audit_recipe(monkeypatch):
    import vllm_dflash.train.run as run
    from vllm_dflash.cli import main

    seen = {}
    monkeypatch.setattr(run, "run_train", lambda **kw: seen.update(kw) or {})
    assert main(["train", "--data", "a,b", "--out", "x"]) == 0
    assert seen["batch_size"] == 1 and seen["anchors_per_seq"] == 32 and seen["precision"] == "auto"
    assert seen["greedy_only"] is True and seen["mask_token_id"] is None and seen["data"] == "a,b"
    main(["train", "--data", "a", "--out", "x", "--no-greedy-only", "--precision", "fp32"])
    assert seen["greedy_only"] is False and seen["precision"] == "fp32"


def _trainer(pair, tgt, out, **kw):
    torch.manual_seed(0)
    d = DFlashDraftModel.from_pretrained(pair / "draft-b8", target=tgt)
    d.init_weights(0.05)
    return BlockDiffusionTrainer(d, tgt, out_dir=out, lr=3e-3, anchors_per_seq=8, log_every=1, ckpt_every=1000,
                                 autocast_bf16=False, **kw)


def test_schedule_follows_the_real_step_count_and_logs_blocks_per_s(pair, tgt, recs, tmp_path):
    ds = TrajectoryDataset(recs[:8])
    held = TrajectoryDataset(recs[20:22])
    t = _trainer(pair, tgt, tmp_path / "r", eval_every=8)
    out = t.train(ds, batch_size=1, num_epochs=2, max_steps=1000, eval_dataset=held, progress=False)  # 16 steps
    assert out["step"] == out["total_steps"] == 16
    rows = [r for r in t.state["history"] if "loss" in r]
    assert all(r["blocks_per_s"] > 0 for r in rows)
    assert rows[-1]["lr"] == pytest.approx(0.1 * 3e-3)  # the cosine reached its floor at the last step
    evals = [r for r in t.state["history"] if "eval_acceptance_length" in r]
    assert [r["step"] for r in evals] == [0, 8, 16] and evals[0]["eval_sequences"] == 2  # 0: the starting point
    assert t.state["best_eval"]["acceptance_length"] == max(r["eval_acceptance_length"] for r in evals)
    assert (tmp_path / "r" / "best" / "model.safetensors").exists()


def test_pause_resume_over_grown_data(pair, tgt, recs, tmp_path):
    """run_steps pauses like SIGTERM (exact resume); a grown dataset on resume starts the next epoch over it."""
    ds = TrajectoryDataset(recs[:8])
    full = _trainer(pair, tgt, tmp_path / "full")
    full.train(ds, batch_size=2, num_epochs=2, progress=False)
    part = _trainer(pair, tgt, tmp_path / "part", run_steps=3)
    out = part.train(ds, batch_size=2, num_epochs=2, progress=False)
    assert out["paused"] and not out["interrupted"] and out["step"] == 3
    resumed = _trainer(pair, tgt, tmp_path / "part")
    resumed.train(ds, batch_size=2, num_epochs=2, progress=False)
    for (k, a), (_, b) in zip(full.draft.state_dict().items(), resumed.draft.state_dict().items()):
        assert torch.equal(a, b), k

    grown = TrajectoryDataset(recs[:12])
    g = _trainer(pair, tgt, tmp_path / "grow", run_steps=2)
    g.train(ds, batch_size=2, num_epochs=3, progress=False)
    g2 = _trainer(pair, tgt, tmp_path / "grow", run_steps=1)
    g2.train(grown, batch_size=2, num_epochs=3, progress=False)
    assert g2.state["epoch"] == 1 and g2.state["pos"] == 2 and g2.state["step"] == 3


def test_run_train_end_to_end_two_folders_fine_tune(pair, tgt, recs, tmp_path):
    """vllm-dflash train on two folders, fine-tuned from a trained draft, paused and resumed with more data."""
    from vllm_dflash.train.run import run_train

    a = _write_collection(tmp_path / "v1", recs[:12])
    b = _write_collection(tmp_path / "v2", recs[12:16])
    kw = dict(out=str(tmp_path / "run"), target=str(pair / "target"), init_draft=str(pair / "draft-b8"),
              draft_vocab_size=64, max_steps=40, num_epochs=100, anchors_per_seq=4, eval_every=5, log_every=1,
              precision="fp32", run_steps=3, feature_cache=str(tmp_path / "feat"))
    r1 = run_train(data=str(a), **kw)
    assert r1["train"]["paused"] and r1["train"]["step"] == 3
    r2 = run_train(data=f"{a},{b}", **kw)
    assert r2["train"]["step"] == 6 and 1.0 <= r2["eval"].get("acceptance_length", 1.0)
    d = DFlashDraftModel.from_pretrained(tmp_path / "run" / "draft", target=tgt)
    assert d.config.mask_token_id == DFlashDraftModel.from_pretrained(pair / "draft-b8").config.mask_token_id
    assert d.config.draft_vocab_size is not None and d.config.draft_vocab_size <= 65
    with pytest.raises(ValueError, match="--mask-token-id"):  # a tiny target has no known mask token
        run_train(data=str(a), out=str(tmp_path / "other"), target=str(pair / "target"), max_steps=1, precision="fp32")


def test_time_budget_fits_the_schedule_to_the_measured_rate(pair, tgt, recs, tmp_path, monkeypatch):
    """--time-budget-minutes: after the probe steps the schedule's length is the steps that fit in the budget at
    the measured rate (so the cosine really reaches its floor), and the run stops there. A fake clock makes every
    step take exactly 1 s, so the expected length is known: 60 s * (1 - reserve) = 51 steps."""
    import vllm_dflash.train.trainer as trainer_mod

    clock = {"t": 0.0}
    monkeypatch.setattr(trainer_mod.time, "perf_counter", lambda: clock["t"])
    ds = TrajectoryDataset(recs[:8])
    t = _trainer(pair, tgt, tmp_path / "tb", time_budget_minutes=1.0, probe_steps=4, budget_reserve=0.15)
    real_loss = t._batch_loss

    def one_second_step(*a, **kw):
        clock["t"] += 1.0
        return real_loss(*a, **kw)

    t._batch_loss = one_second_step
    out = t.train(ds, batch_size=1, num_epochs=10_000, progress=False)
    assert t.state["horizon"] == out["total_steps"] == out["step"] == 51, out
    rows = [r for r in t.state["history"] if "loss" in r]
    assert rows[-1]["lr"] == pytest.approx(0.1 * 3e-3)  # the schedule ended at its floor, not mid-decay


def test_bad_device_is_named_before_training(pair, recs, tmp_path):
    from vllm_dflash.train.run import run_train

    a = _write_collection(tmp_path / "v1", recs[:4])
    with pytest.raises(ValueError, match="--device"):
        run_train(data=str(a), out=str(tmp_path / "r"), target=str(pair / "target"), device="tpu", max_steps=1)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            run_train(data=str(a), out=str(tmp_path / "r"), target=str(pair / "target"), device="cuda", max_steps=1)


def test_length_groups_pad_less_and_cover_every_sequence():
    from vllm_dflash.train.features import length_groups

    lengths = [500, 30, 1200, 40, 480, 35, 9000]
    groups = length_groups(lengths, 1024)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))  # each once
    assert all(len(g) * max(lengths[i] for i in g) <= 1024 for g in groups if len(g) > 1)
    assert [6] in groups and [2] in groups  # longer than the budget: alone
    padded = sum(len(g) * max(lengths[i] for i in g) for g in groups)
    assert padded < len(lengths) * max(lengths)
    assert length_groups([], 1024) == []


def test_features_of_a_mixed_batch_match_each_sequence_alone(tgt, recs, tmp_path):
    """Grouping by length (small budget: several target forwards) gives every sequence the features it gets alone,
    in its batch position, zero beyond its length; with and without the cache."""
    seqs = [TrajectoryDataset(recs[:1], max_len=n)[0] for n in (64, 20, 40)]
    for cache in (None, tmp_path / "c"):
        f = TargetFeatures(tgt, (0, 1), cache, group_tokens=64)
        batch = f(seqs, torch.device("cpu"), torch.float32)  # [3, 64, F]
        for i, s in enumerate(seqs):
            alone = TargetFeatures(tgt, (0, 1))([s], torch.device("cpu"), torch.float32)[0]
            n = len(s.tokens)
            tol = 0.05 if cache else 1e-5  # the cache stores bf16
            torch.testing.assert_close(batch[i, :n], alone, atol=tol, rtol=tol)
            assert not batch[i, n:].any()
