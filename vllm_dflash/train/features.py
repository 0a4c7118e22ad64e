# SPDX-License-Identifier: Apache-2.0
"""`TargetFeatures`: the frozen target's hidden states at the draft's target layers, for whole training sequences,
cached on disk (the trainer's input; vllm_dflash/train/trainer.py)."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch


class TargetFeatures:
    """Frozen target: features of the draft's target layers for whole sequences, optionally cached on disk
    (bf16, n_feat * H * 2 bytes per token: 5.76 KB for SmolLM2-135M).

    A cache file is keyed by everything that shapes its features: sequence id, the tokens themselves (so a
    changed max_len or a re-collected trajectory misses), the target layer ids and the target's compute dtype."""

    def __init__(self, target: torch.nn.Module, layer_ids: tuple[int, ...], cache_dir: str | Path | None = None,
                 autocast_bf16: bool = False, group_tokens: int = 8192):
        self.target = target.eval().requires_grad_(False)
        self.group_tokens = group_tokens  # padded tokens per target forward (length_groups)
        self.layer_ids = tuple(layer_ids)
        self.autocast = autocast_bf16  # target forward under bf16 autocast (as vLLM serves it on bf16 hardware)
        self.cache_dir = Path(cache_dir) if cache_dir else None
        if self.cache_dir:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            meta, want = self.cache_dir / "meta.json", {"target_layer_ids": list(layer_ids)}
            if meta.exists() and json.loads(meta.read_text()) != want:
                raise ValueError(f"feature cache {self.cache_dir} holds features of {meta.read_text().strip()}, this "
                                 f"draft needs {want}. Fix: use another --feature-cache folder for this draft")
            meta.write_text(json.dumps(want))

    def cache_file(self, s) -> Path:
        tokens = hashlib.sha1(",".join(map(str, s.tokens)).encode()).hexdigest()
        dtype = "bf16-autocast" if self.autocast else str(next(self.target.parameters()).dtype).removeprefix("torch.")
        key = f"{s.id}|{len(s.tokens)}|{tokens}|{','.join(map(str, self.layer_ids))}|{dtype}"
        return self.cache_dir / f"{hashlib.sha1(key.encode()).hexdigest()}.pt"

    @staticmethod
    def _store(feats: torch.Tensor, path: Path) -> None:
        """Write a cache file atomically: a killed run or another run sharing the cache never sees a partial file."""
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        torch.save(feats.clone(), tmp)
        os.replace(tmp, path)

    @torch.no_grad()
    def __call__(self, seqs: list, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """-> [N, S_max, n_feat * H] (zero-padded)."""
        S = max(len(s.tokens) for s in seqs)
        out: list[torch.Tensor | None] = [None] * len(seqs)
        todo = []
        for i, s in enumerate(seqs):
            f = self.cache_file(s) if self.cache_dir else None
            if f is not None and f.exists():
                out[i] = torch.load(f)
            else:
                todo.append(i)
        body = getattr(self.target, "model", self.target)  # the decoder stack: no 49k-vocabulary lm_head
        for group in length_groups([len(seqs[i].tokens) for i in todo], self.group_tokens):
            idx = [todo[g] for g in group]
            Sg = max(len(seqs[i].tokens) for i in idx)
            ids = torch.zeros(len(idx), Sg, dtype=torch.long)  # [n, Sg], right-padded
            att = torch.zeros(len(idx), Sg, dtype=torch.long)
            for j, i in enumerate(idx):
                t = seqs[i].tokens
                ids[j, : len(t)] = torch.tensor(t)
                att[j, : len(t)] = 1
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.autocast):
                hs = body(input_ids=ids.to(device), attention_mask=att.to(device), output_hidden_states=True).hidden_states
            feats = torch.cat([hs[l + 1] for l in self.layer_ids], dim=-1)  # [n, Sg, n_feat * H]: layer l's OUTPUT
            for j, i in enumerate(idx):
                f = feats[j, : len(seqs[i].tokens)]  # [S_i, n_feat * H]
                if self.cache_dir:
                    out[i] = f.to(torch.bfloat16).cpu()
                    self._store(out[i], self.cache_file(seqs[i]))
                else:  # nothing to store: stay on the device
                    out[i] = f
        full = torch.zeros(len(seqs), S, out[0].shape[-1], dtype=dtype, device=device)  # [N, S_max, F]
        for i, f in enumerate(out):
            full[i, : f.shape[0]] = f.to(device=device, dtype=dtype)
        return full


def length_groups(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices into `lengths`, shortest first, cut into groups whose padded size (count x longest) stays within
    `max_tokens` (a longer sequence forms a group of its own). The target's forward over a group pads to the group's
    longest sequence only: padding a whole batch of 16 collected sequences (cut at 640 tokens) to its longest wasted
    about a third of the compute."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if groups and (len(groups[-1]) + 1) * lengths[i] <= max_tokens:  # sorted: lengths[i] is the group's longest
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups
