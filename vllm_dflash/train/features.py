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
                 autocast_bf16: bool = False):
        self.target = target.eval().requires_grad_(False)
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
        if todo:
            ids = torch.zeros(len(todo), S, dtype=torch.long)
            att = torch.zeros(len(todo), S, dtype=torch.long)
            for j, i in enumerate(todo):
                t = seqs[i].tokens
                ids[j, : len(t)] = torch.tensor(t)
                att[j, : len(t)] = 1
            body = getattr(self.target, "model", self.target)  # the decoder stack: no 49k-vocabulary lm_head
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.autocast):
                hs = body(input_ids=ids.to(device), attention_mask=att.to(device), output_hidden_states=True).hidden_states
            feats = torch.cat([hs[l + 1] for l in self.layer_ids], dim=-1)  # layer l's OUTPUT
            if not self.cache_dir:  # nothing to store (every sequence was computed): stay on the device
                return (feats * att.to(device)[..., None]).to(dtype)  # zero-padded like the cached path
            for j, i in enumerate(todo):
                out[i] = feats[j, : len(seqs[i].tokens)].to(torch.bfloat16).cpu()
                self._store(out[i], self.cache_file(seqs[i]))
        full = torch.zeros(len(seqs), S, out[0].shape[-1], dtype=dtype)
        for i, f in enumerate(out):
            full[i, : f.shape[0]] = f.to(dtype)
        return full.to(device)
