# SPDX-License-Identifier: Apache-2.0
"""Where a training step's time goes (random SmolLM2-shaped target, random data; no weights needed):
`python3 dev/gpu/profile_step.py CONFIG_JSON [cuda|cpu] [N] [A]`."""
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from vllm_dflash.config import DFlashConfig
from vllm_dflash.model import DFlashDraftModel
from vllm_dflash.train.data import TrajectoryDataset
from vllm_dflash.train.trainer import BlockDiffusionTrainer

cfg_path, dev = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "cuda"
N, A = int(sys.argv[3]) if len(sys.argv) > 3 else 32, int(sys.argv[4]) if len(sys.argv) > 4 else 64
tc = LlamaConfig(**json.loads(Path(cfg_path).read_text()))
if dev == "cpu":
    tc.num_hidden_layers = 4
tgt = LlamaForCausalLM(tc).eval().to(dev)
lids = (1, 2, 3) if dev == "cpu" else (1, 8, 14, 21, 27)
dc = DFlashConfig.for_target(tc.to_dict(), num_layers=1, block_size=8, mask_token_id=16, draft_vocab_size=8192)
dc = dc.with_(target_layer_ids=lids)
d = DFlashDraftModel(dc)
d.bind_target(tgt.get_input_embeddings().weight.detach(), tgt.get_output_embeddings().weight.detach(), torch.arange(8192))
d = d.to(dev)
g = torch.Generator().manual_seed(0)
recs = [{"id": str(i), "prompt_ids": torch.randint(0, 8000, (100,), generator=g).tolist(),
         "response_ids": torch.randint(0, 8000, (500,), generator=g).tolist()} for i in range(N * 8)]
ds = TrajectoryDataset(recs)
tr = BlockDiffusionTrainer(d, tgt, anchors_per_seq=A)
tr._make_scheduler(100)


def sync():
    if dev == "cuda":
        torch.cuda.synchronize()


def step(i):
    seqs = [ds[j] for j in range(i * N % len(ds), i * N % len(ds) + N)]
    t = {}
    t0 = time.perf_counter()
    feats = tr.features(seqs, tr.device, torch.float32); sync(); t["features"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    loss, info = tr._batch_loss(seqs, 0, i * N); sync(); t["batch_loss(all, incl. features)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    tr.optimizer.zero_grad(); loss.backward(); sync(); t["backward"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(d.parameters(), 1.0); tr.optimizer.step(); sync(); t["clip+adam"] = time.perf_counter() - t0
    return t


for i in range(3):
    step(i)
ts = [step(i) for i in range(3, 8)]
print({k: round(sum(t[k] for t in ts) / len(ts), 4) for k in ts[0]}, f"N={N} A={A} {dev}", flush=True)
from torch.profiler import ProfilerActivity, profile

acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
with profile(activities=acts) as prof:
    step(9)
    sync()
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=60))
if dev == "cuda":
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60))
