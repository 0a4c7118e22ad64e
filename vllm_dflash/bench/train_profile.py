# SPDX-License-Identifier: Apache-2.0
"""Where does a DFlash training step spend its time on this machine? (target features vs draft vs output layer)

python benchmarks/profile_train_step.py --data data/collect/smollm2-v1 [--out benchmarks/results/profile_train_step.json]
(or python -m vllm_dflash.bench.train_profile ...)
Times each phase of one step on real SmolLM2 trajectories (median of --reps), for the full 49,152-token output layer
and a reduced 8,192-token draft vocabulary, and prints a table plus the disk cost of caching target features."""
import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def timed(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="data/collect/smollm2-v1")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--layers", default="1", help="draft depths, comma-separated (e.g. 1,2,3 for the depth study)")
    ap.add_argument("--vocab", default="full,8192", help="output layers: full and/or a reduced vocabulary size")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    from transformers import AutoModelForCausalLM

    from vllm_dflash.config import DFlashConfig
    from vllm_dflash.model import DFlashDraftModel
    from vllm_dflash.target import prepare_target
    from vllm_dflash.train.data import TrajectoryDataset
    from vllm_dflash.train.trainer import BlockDiffusionTrainer
    from vllm_dflash.utils import cpu_kind

    tgt = AutoModelForCausalLM.from_pretrained(str(prepare_target()), dtype=torch.float32).eval()
    ds = TrajectoryDataset.from_dir(a.data, max_len=640)
    seqs = ds.items[: a.batch_size]
    rows = {}
    layers = [int(x) for x in a.layers.split(",")]
    vocabs = [None if v == "full" else int(v) for v in a.vocab.split(",")]
    for L, vocab in [(L, v) for L in layers for v in vocabs]:
        cfg = DFlashConfig.for_target(tgt.config.to_dict(), num_layers=L, block_size=a.block_size,
                                      draft_vocab_size=vocab)  # mask: the id known for SmolLM2 (16)
        d = DFlashDraftModel(cfg)
        ids = torch.arange(vocab) if vocab else None
        d.bind_target(tgt.get_input_embeddings().weight.detach(), tgt.get_output_embeddings().weight.detach(), ids)
        tr = BlockDiffusionTrainer(d, tgt, anchors_per_seq=a.anchors)
        feats = tr.features(seqs, torch.device("cpu"), torch.float32)
        t_feat = timed(lambda: tr.features(seqs, torch.device("cpu"), torch.float32), a.reps)
        tr.features = lambda s, dev, dt: feats  # cached features: the rest of the step

        def step():
            loss, _ = tr._batch_loss(seqs, 0, 0)
            loss.backward()
        t_step = timed(step, a.reps)
        name = "full" if vocab is None else f"reduced-{vocab}"
        rows[name if layers == [1] else f"{L}-layer {name}"] = {"layers": L, "target_features_s": t_feat,
                                                                "draft_step_s": t_step}
    tokens = sum(len(s.tokens) for s in seqs)
    res = {"batch_size": a.batch_size, "anchors": a.anchors, "block_size": a.block_size, "tokens_in_batch": tokens,
           "threads": torch.get_num_threads(), "cpu": cpu_kind(), "phases": rows,
           "feature_cache_bytes_per_token": 5 * 576 * 2, "note": "draft_step = fwd+bwd with cached features"}
    print(f"batch {a.batch_size} seqs / {tokens} tokens, {a.anchors} anchors x block {a.block_size}, {res['threads']} threads")
    print(f"{'draft':<24}{'target features (s)':>22}{'draft fwd+bwd (s)':>20}")
    for k, r in rows.items():
        print(f"{k:<24}{r['target_features_s']:>22.3f}{r['draft_step_s']:>20.3f}")
    print(f"cached features cost {res['feature_cache_bytes_per_token']} bytes/token (bf16, 5 layers x 576)")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
