# SPDX-License-Identifier: Apache-2.0
"""Training sequences from collected trajectories, anchor sampling and the block attention mask."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch


@dataclass(frozen=True)
class Sequence_:
    id: str
    tokens: tuple[int, ...]  # prompt + response
    prompt_len: int
    greedy: bool


class TrajectoryDataset:
    """Sequences (prompt + target response) with the response span marked; truncated to max_len."""

    def __init__(self, records: Sequence[dict[str, Any]], max_len: int = 640, min_response: int = 4):
        self.items: list[Sequence_] = []
        self.skipped = 0
        for r in records:
            p, resp = list(r["prompt_ids"]), list(r["response_ids"])
            toks = (p + resp)[:max_len]
            if len(toks) - len(p) < min_response:
                self.skipped += 1
                continue
            self.items.append(Sequence_(r["id"], tuple(toks), len(p), float(r.get("temperature", 0.0)) == 0.0))

    @classmethod
    def from_dir(cls, path: str | Path, **kw) -> "TrajectoryDataset":
        """One collection folder, or several separated by commas (records of a later folder replace those of an
        earlier one with the same id: the same prompt collected again)."""
        from vllm_dflash.data.collect import load_records

        by_id: dict[str, dict[str, Any]] = {}
        for folder in [p for p in str(path).split(",") if p.strip()]:
            for r in load_records(folder.strip()):
                by_id.pop(r["id"], None)  # re-insert: a replaced record moves to the later folder's place
                by_id[r["id"]] = r
        return cls(list(by_id.values()), **kw)

    def greedy_only(self) -> "TrajectoryDataset":
        """Only the trajectories generated greedily (temperature 0): labels a greedy target would emit."""
        out = TrajectoryDataset([])
        out.items = [s for s in self.items if s.greedy]
        out.skipped = self.skipped
        return out

    def split(self, eval_fraction: float = 0.02, max_eval: int = 64) -> tuple["TrajectoryDataset", "TrajectoryDataset"]:
        """Deterministic split by id hash; the eval split keeps greedy records only (teacher-forced τ is exact).

        A greedy record whose hash falls in the eval range never trains, even past `max_eval`: adding data (or
        reading folders in another order) can then move records into the eval split but never out of training."""
        tr, ev = TrajectoryDataset([]), TrajectoryDataset([])
        for s in self.items:
            if not (s.greedy and heldout_hash(s.id) < eval_fraction):
                tr.items.append(s)
            elif len(ev.items) < max_eval:
                ev.items.append(s)
        return tr, ev

    def fraction(self, f: float) -> "TrajectoryDataset":
        """A deterministic share f of the sequences (by id hash, independent of the eval split): data-scaling runs."""
        if not 0.0 < f <= 1.0:
            raise ValueError(f"train fraction {f!r}: expected a number in (0, 1]")
        out = TrajectoryDataset([])
        out.items = [s for s in self.items if int(hashlib.sha1(f"frac:{s.id}".encode()).hexdigest()[:8], 16) / 2**32 < f]
        return out

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Sequence_:
        return self.items[i]

    def num_response_tokens(self) -> int:
        return sum(len(s.tokens) - s.prompt_len for s in self.items)


def heldout_hash(seq_id: str) -> float:
    """The id's position in [0, 1) that decides the held-out split."""
    return int(hashlib.sha1(seq_id.encode()).hexdigest()[:8], 16) / 2**32


def sample_anchors(seq: Sequence_, num_anchors: int, block_size: int, gen: torch.Generator) -> torch.Tensor:
    """Random anchor positions a (sorted) with a >= prompt_len (the first response token is the target's own
    prefill sample, never drafted) and a <= len - 2 (at least one label). Returns [<= num_anchors]."""
    lo, hi = seq.prompt_len, len(seq.tokens) - 2
    if hi < lo:
        return torch.empty(0, dtype=torch.long)
    n = hi - lo + 1
    k = min(num_anchors, n)
    return (torch.randperm(n, generator=gen)[:k] + lo).sort().values


def block_attention_mask(anchors: torch.Tensor, ctx_len: int, block_size: int) -> torch.Tensor:
    """Dense bool mask [A*B, ctx_len + A*B]: query in block i sees context positions < anchors[i] and every
    token of its own block (non-causal), nothing of other blocks."""
    A, B = anchors.shape[0], block_size
    q_block = torch.arange(A * B) // B  # [A*B] block index of each query
    ctx_ok = torch.arange(ctx_len)[None, :] < anchors[q_block][:, None]  # [A*B, C]
    blk_ok = q_block[:, None] == q_block[None, :]  # [A*B, A*B]
    return torch.cat([ctx_ok, blk_ok], dim=1)


def loss_weights(block_size: int, gamma: float | None = None) -> torch.Tensor:
    """w_k = exp(-(k-1)/γ) for block positions k = 1..B-1 (γ 7 for B=16, 5 for B=10, 4 for B=8)."""
    if gamma is None:
        gamma = {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, max(block_size / 2.0, 1.0))
    k = torch.arange(1, block_size, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)
