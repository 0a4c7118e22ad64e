# SPDX-License-Identifier: Apache-2.0
"""Issue 54.6: r, the share of the draft's slot-1 misses that its second choice would catch (the gate for tree or
sibling verification: build it for c1 only if r >= 0.25).

Teacher-forced replay (`BlockDiffusionTrainer.evaluate`) of a draft on the held-out greedy sequences of the
collection folders (the same 64-sequence split the trainer reports on), in float32 on CPU.

    .venv/bin/python dev/studies/second_choice.py [--draft models/SmolLM2-135M-Instruct-DFlash-b8] \
        [--data data/collect/smollm2-v1,...] [--limit 64] [--out dev/studies/second_choice.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

DATA = ",".join(f"data/collect/smollm2-{n}" for n in ("v1", "v2", "gpu1", "gpu2", "gpu3"))


def cpu_kind() -> str:
    """The CPU model and whether it has avx512_bf16 (figures depend on the machine kind)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
    return f"{model} ({'avx512_bf16' if 'avx512_bf16' in info else 'no avx512_bf16'})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draft", default="models/SmolLM2-135M-Instruct-DFlash-b8")
    p.add_argument("--data", default=DATA)
    p.add_argument("--limit", type=int, default=64, help="held-out sequences at most")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="dev/studies/second_choice.json")
    a = p.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from vllm_dflash.model import DFlashDraftModel
    from vllm_dflash.target import resolve_target
    from vllm_dflash.train.data import TrajectoryDataset
    from vllm_dflash.train.trainer import BlockDiffusionTrainer

    torch.set_num_threads(a.threads)
    tgt = AutoModelForCausalLM.from_pretrained(str(resolve_target(None)), dtype=torch.float32).eval()
    draft = DFlashDraftModel.from_pretrained(a.draft, target=tgt)
    _, held = TrajectoryDataset.from_dir(a.data).split()
    held.items = held.items[: a.limit]
    t0 = time.time()
    trainer = BlockDiffusionTrainer(draft, tgt, out_dir=None)
    ev = trainer.evaluate(held, estimate_speedup=False)
    res = {"draft": a.draft, "sequences": len(held.items), "seconds": round(time.time() - t0, 1),
           "cpu": cpu_kind(), "dtype": "float32",
           "slot1_second_choice": ev["slot1_second_choice"], "acceptance_length": ev["acceptance_length"],
           "tokens_per_forward": ev["tokens_per_forward"]}
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
