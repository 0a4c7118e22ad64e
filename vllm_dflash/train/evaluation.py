# SPDX-License-Identifier: Apache-2.0
"""Held-out evaluation of a draft during training (`BlockDiffusionTrainer.evaluate` calls these): τ and tokens per
target forward by teacher-forced replay of the greedy loop on target trajectories, and the reference-loop speed-up
that a τ implies on this device."""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import torch

from vllm_dflash.adaptive.ngram import anchor_hints
from vllm_dflash.model import DFlashDraftModel
from vllm_dflash.reference import DecodeStats
from vllm_dflash.train.data import TrajectoryDataset, block_attention_mask


@torch.no_grad()
def evaluate_draft(draft: DFlashDraftModel, block_size: int, eval_dataset: TrajectoryDataset,
                   draft_all: Callable[..., Any], sampled: Callable[..., Any] | None = None) -> dict[str, Any]:
    """Teacher-forced replay of the greedy loop on greedy target trajectories: exact τ for those contexts.

    All anchor positions of a sequence are drafted in one batched forward (blocks are independent under
    the block mask); the loop's walk (anchor -> accept a -> next anchor at +a+1) is then replayed. The headline
    τ is the draft as served (a hinted draft fed its hints). `tokens_per_forward` replays every drafting
    method on the same trajectories, as generated tokens / target forwards (a step without a proposal counts
    1): dflash (the block fed MASK only), lookup (prompt lookup alone, up to B-1 tokens), merged (lookup tokens
    first, the plain block after them), and for a hinted draft hinted (its block fed the hints) and
    hinted_merged (lookup tokens first, the hinted block after them).

    sampled (optional, `sampled_acceptance_of`): s, anchors -> [A, B-1] the probability that each slot's draft token,
    sampled from the draft at a temperature, passes verification against the target's distribution there
    (teacher-forced: the trajectory as the prefix). Reported as `sampled`: the mean per slot over every anchor, and
    the expected accepted length 1 + sum_k prod_{j<=k} alpha_j (slots taken as independent)."""
    d, B = draft, block_size
    d.eval()
    stats = DecodeStats(block_size=B)
    ngram = d.config.hint_ngram or (2, 4)  # the lookup of a hinted draft, else the serving default
    methods = ["dflash", "lookup", "merged"] + (["hinted", "hinted_merged"] if d.config.hint_ngram else [])
    tokens = dict.fromkeys(methods, 0)
    steps = dict.fromkeys(methods, 0)
    slot1_misses = slot1_second = 0  # r: the share of slot-1 misses the draft's second choice would catch
    alphas: list[torch.Tensor] = []  # [A, B-1] per sequence: sampled acceptance per slot
    for s in eval_dataset.items:
        L = len(s.tokens)
        if L - s.prompt_len < 2:
            continue
        anchors = torch.arange(s.prompt_len, L - 1)
        hints = torch.from_numpy(anchor_hints(np.asarray(s.tokens), anchors.numpy(), B - 1, *ngram))
        plain, second = draft_all(s, anchors, second_choice=True)  # [A, B-1] target ids each
        if sampled is not None:
            alpha = sampled(s, anchors)  # [A, B-1]
            alpha[(anchors[:, None] + torch.arange(1, B)) > L - 1] = 0.0  # slots past the trajectory's end
            alphas.append(alpha)
        rows = {"dflash": plain, "lookup": hints, "merged": torch.where(hints >= 0, hints, plain)}
        if d.config.hint_ngram:
            hinted = draft_all(s, anchors, hints)
            rows.update(hinted=hinted, hinted_merged=torch.where(hints >= 0, hints, hinted))
        toks = torch.tensor(s.tokens + (0,) * B)
        for name in methods:
            served = name == ("hinted" if d.config.hint_ngram else "dflash")
            p = s.prompt_len
            while p <= L - 2:
                row = rows[name][p - s.prompt_len]
                match = (row == toks[p + 1: p + B]).long()
                match[L - 1 - p:] = 0  # past the trajectory's end
                a = int(torch.cumprod(match, 0).sum())
                if served:
                    stats.record(B - 1, a)
                if name == "dflash" and a == 0:  # a slot-1 miss of the plain block
                    slot1_misses += 1
                    slot1_second += int(second[p - s.prompt_len, 0] == toks[p + 1])
                tokens[name] += a + 1
                steps[name] += 1
                p += a + 1
    d.train()
    out = {"acceptance_length": stats.acceptance_length, "per_position_acceptance": stats.per_position_acceptance,
           "histogram": stats.histogram, "num_steps": stats.num_steps,
           "tokens_per_forward": {m: tokens[m] / max(steps[m], 1) for m in methods},
           "slot1_second_choice": {"misses": slot1_misses, "caught": slot1_second,
                                   "r": slot1_second / max(slot1_misses, 1)}}
    if alphas:
        al = torch.cat(alphas)  # [anchors, B-1]
        out["sampled"] = {"per_position_acceptance": al.mean(0).tolist(),
                          "acceptance_length": float(1 + torch.cumprod(al, dim=1).sum(1).mean())}
    return out


@torch.no_grad()
def sampled_acceptance_of(draft: DFlashDraftModel, features: Callable[..., torch.Tensor], tail, block_size: int,
                          device: torch.device, temperature: float, s, anchors: torch.Tensor,
                          chunk: int = 64) -> torch.Tensor:
    """[A, B-1]: for each anchor and slot k, sum(min(p, q)) of the target's distribution p at position anchor + k - 1
    (rebuilt from the features by `TargetTail`) and the draft's q at slot k, both at `temperature`."""
    from vllm_dflash.train.target_tail import sampled_acceptance

    d, B = draft, block_size
    feats = features([s], device, torch.float32)  # [1, S, F]
    ids = list(d.config.target_layer_ids)
    H = feats.shape[-1] // len(ids)
    j = ids.index(max(ids))
    final = tail.final_hidden(feats[..., j * H:(j + 1) * H])[0]  # [S, H]
    S = final.shape[0]
    _, q_logits = draft_all_anchors(d, features, B, device, s, anchors, chunk=chunk, logits=True)  # [A, B-1, Vd]
    at = (anchors[:, None] + torch.arange(B - 1)).clamp(max=S - 1)  # [A, B-1]: the target predicts slot k here
    lo = int(at.min())
    p_all = tail.probs_at_draft_vocab(final[lo:], temperature)  # [S - lo, Vd]: once per position, not per slot
    out = torch.empty(at.shape)
    for c in range(0, len(anchors), chunk):
        p = p_all[(at[c: c + chunk] - lo).to(p_all.device)]  # [a, B-1, Vd]
        out[c: c + chunk] = sampled_acceptance(p, q_logits[c: c + chunk].to(p.device), temperature).cpu()
    return out


def draft_all_anchors(draft: DFlashDraftModel, features: Callable[..., torch.Tensor], block_size: int,
                      device: torch.device, s, anchors: torch.Tensor, hints: torch.Tensor | None = None,
                      chunk: int = 64, second_choice: bool = False, logits: bool = False):
    """Greedy draft blocks at every anchor of sequence s -> [A, B-1] target ids. features: the trainer's
    `TargetFeatures` (seqs, device, dtype -> [N, S, F]). hints [A, B-1] (-1 = none): fed
    into the blocks ([anchor, h1 .. hm, MASK ..]) as a hinted draft sees them in serving. second_choice: also
    the draft's second most likely token at each slot -> ([A, B-1], [A, B-1]); logits: also the draft's logits
    -> ([A, B-1], [A, B-1, V_draft])."""
    d, B, dev = draft, block_size, device
    feats = features([s], dev, torch.float32)
    S = feats.shape[1]
    ctx_kv = d.context_kv(d.fuse(feats), torch.arange(S, device=dev)[None])
    toks = torch.tensor(s.tokens)
    outs, seconds, raw = [], [], []
    for c in range(0, len(anchors), chunk):
        a = anchors[c: c + chunk]
        A = len(a)
        ids = torch.full((1, A, B), d.config.mask_token_id, dtype=torch.long)
        ids[0, :, 0] = toks[a]
        if hints is not None:
            h = hints[c: c + chunk]
            ids[0, :, 1:] = torch.where(h >= 0, h, ids[0, :, 1:])
        pos = (a[:, None] + torch.arange(B)).view(1, -1)
        mask = block_attention_mask(a, S, B)[None]
        h = d(d.embed(ids.view(1, -1).to(dev)), pos.to(dev), ctx_kv, mask.to(dev)).view(A, B, -1)[:, 1:]
        lg = d.logits(h)  # [A, B-1, V_draft]
        top = lg.topk(2, dim=-1).indices  # [A, B-1, 2] draft-vocabulary ids
        outs.append(d.draft_to_target[top[..., 0]].cpu())
        seconds.append(d.draft_to_target[top[..., 1]].cpu())
        if logits:
            raw.append(lg.float().cpu())
    if logits:
        return torch.cat(outs), torch.cat(raw)
    return (torch.cat(outs), torch.cat(seconds)) if second_choice else torch.cat(outs)


def estimate_speedup(draft: DFlashDraftModel, target: torch.nn.Module, block_size: int, device: torch.device,
                     tau: float, context: int = 256, reps: int = 3) -> dict[str, float]:
    """Reference-loop speedup implied by τ: τ·t(target, 1 token) / (t(target, B tokens) + t(draft block))."""
    from transformers import DynamicCache

    dev, B = device, block_size

    def timed(fn) -> float:
        fn()
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t) / reps

    ids = torch.randint(0, draft.config.vocab_size, (1, context), device=dev)
    with torch.no_grad():
        cache = DynamicCache(config=target.config)
        target(input_ids=ids, past_key_values=cache, use_cache=True)

        def target_step(n):
            def f():
                target(input_ids=ids[:, :n], past_key_values=cache, use_cache=True)
                cache.crop(-n)
            return f

        t1, tB = timed(target_step(1)), timed(target_step(B))
        ctx_kv = draft.context_kv(torch.zeros(1, context, draft.config.hidden_size, device=dev),
                                  torch.arange(context, device=dev)[None])
        td = timed(lambda: draft.draft_block(ids[0, :1], torch.tensor([context], device=dev), ctx_kv, block_size=B))
    return {"speedup": tau * t1 / (tB + td), "t_target_1": t1, "t_target_block": tB, "t_draft": td}
