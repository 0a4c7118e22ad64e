# SPDX-License-Identifier: Apache-2.0
"""Draft cost vs depth: one DFlash draft step (block forward + reduced-vocabulary output layer) for 1..L layers at
SmolLM2-draft shapes, per batch size, on this machine. Pairs with the acceptance of trained drafts of each depth
(MODEL_CARD.md) to choose the depth: a deeper draft must buy more accepted tokens than its extra cost.

    python dev/studies/draft_depth.py [--layers 1,2,3] [--batches 1,8,32] [--context 256] [--threads 1]

Writes dev/results/draft_depth.{json,md}. Timing: median of repeated runs, process CPU time by default
(robust on a shared machine; --clock wall for wall time)."""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from vllm_dflash.config import DFlashConfig
from vllm_dflash.model import DFlashDraftModel

RESULTS = Path(__file__).resolve().parents[2] / "dev" / "results"
SMOLLM2 = dict(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, head_dim=64, intermediate_size=1536,
               vocab_size=49152, num_target_layers=30)


def build(layers: int, block: int, draft_vocab: int) -> DFlashDraftModel:
    cfg = DFlashConfig(num_hidden_layers=layers, block_size=block, target_layer_ids=(1, 8, 14, 21, 27), mask_token_id=16,
                       draft_vocab_size=draft_vocab, **SMOLLM2)
    m = DFlashDraftModel(cfg).eval()
    m.init_weights(0.02)
    H, V = cfg.hidden_size, cfg.vocab_size
    m.bind_target(torch.randn(V, H) * 0.02, torch.randn(V, H) * 0.02, torch.arange(draft_vocab))
    return m


def time_step(m: DFlashDraftModel, batch: int, context: int, clock, reps: int) -> float:
    """Seconds for one draft step: [anchor, MASK x (B-1)] per request over `context` injected positions."""
    cfg = m.config
    with torch.no_grad():
        ctx = torch.randn(batch, context, cfg.hidden_size)
        pos = torch.arange(context)[None].expand(batch, -1)
        kv = m.context_kv(ctx, pos)  # injected once; the per-step cost is the block forward
        anchor = torch.randint(0, 1000, (batch,))
        start = torch.full((batch,), context)
        m.draft_block(anchor, start, kv)  # warm-up
        ts = []
        for _ in range(reps):
            t0 = clock()
            m.draft_block(anchor, start, kv)
            ts.append(clock() - t0)
    return statistics.median(ts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", default="1,2,3")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--block", type=int, default=8)
    p.add_argument("--draft-vocab", type=int, default=7762)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    p.add_argument("--out", default=str(RESULTS / "draft_depth"))
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    clock = time.process_time if a.clock == "cpu" else time.perf_counter
    layers = [int(x) for x in a.layers.split(",")]
    batches = [int(x) for x in a.batches.split(",")]
    rows = []
    for L in layers:
        m = build(L, a.block, a.draft_vocab)
        for b in batches:
            rows.append({"layers": L, "batch": b, "ms": 1e3 * time_step(m, b, a.context, clock, a.reps)})
            print(f"layers {L}  batch {b:3d}  {rows[-1]['ms']:8.2f} ms", flush=True)
    out = {"context": a.context, "block": a.block, "draft_vocab": a.draft_vocab, "threads": a.threads,
           "clock": a.clock, "dtype": "float32", "rows": rows}
    Path(a.out).with_suffix(".json").write_text(json.dumps(out, indent=1))
    base = {r["batch"]: r["ms"] for r in rows if r["layers"] == layers[0]}
    md = [f"# Draft step cost vs depth (SmolLM2 draft shapes, block {a.block}, draft vocabulary {a.draft_vocab}, "
          f"context {a.context}, fp32, {a.threads} thread(s), {a.clock} clock)", "",
          "| layers | " + " | ".join(f"batch {b}" for b in batches) + " |", "|---|" + "---:|" * len(batches)]
    for L in layers:
        cells = [next(r["ms"] for r in rows if r["layers"] == L and r["batch"] == b) for b in batches]
        md.append(f"| {L} | " + " | ".join(f"{c:.2f} ms ({c / base[b]:.2f}×)" for c, b in zip(cells, batches)) + " |")
    Path(a.out).with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
