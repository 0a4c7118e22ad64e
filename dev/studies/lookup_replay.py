# SPDX-License-Identifier: Apache-2.0
"""Issue 54.4: what longer prompt-lookup proposals (11-15 tokens) and a cross-request lookup source (suffix-decoding
style) would add, estimated by replaying served greedy outputs, at no training cost.

1. `--generate`: the target's greedy answers (stock vLLM, no speculation, the bench's prompt sets and chat wrapping,
   128 tokens by default) in serving order -> a local JSONL cache (token ids only).
2. Replay (no vLLM): each request is decoded again step by step against its own output. A step verifies the
   proposal of a lookup source and keeps its matching prefix plus the target's token (what verification gives);
   tokens per target forward = output tokens / steps. Sources:
   - `self k=K`: prompt lookup in the request's own prompt and output (what the adaptive drafter's n-gram source
     does: n = 4 .. 2, the most recent occurrence), proposals of up to K tokens;
   - `cross`: the same n-gram match in every EARLIER request's prompt and output (an index that grows as requests
     finish, most recent occurrence, n = max_n .. min_n);
   - `self+cross`: the request's own lookup, else the cross-request one;
   - `best`: the longer accepted of the two (an oracle bound for a planner that picks per step).

    PYTHONPATH=$PWD .venv/bin/python dev/studies/lookup_replay.py --generate   # once (~5 min on 2 cores)
    PYTHONPATH=$PWD .venv/bin/python dev/studies/lookup_replay.py [--out dev/studies/lookup_replay.json]

Lookup alone: the DFlash draft's own block is not replayed here; served tokens per forward of the merged drafter
are measured by `vllm-dflash bench` (see dev/LOG.md).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from vllm_dflash.adaptive.ngram import prompt_lookup

CACHE = Path.home() / ".cache" / "vllm-dflash" / "lookup_replay.jsonl"
SETS = ("open-chat", "math", "humaneval")


def generate(cache: Path, sets: tuple[str, ...], limit: int, max_tokens: int, dtype: str) -> None:
    from vllm import LLM, SamplingParams

    from vllm_dflash.bench.run import load_prompt_set
    from vllm_dflash.target import resolve_target

    llm = LLM(model=str(resolve_target(None)), dtype=dtype, max_model_len=2048, seed=0)
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    cache.parent.mkdir(parents=True, exist_ok=True)
    with cache.open("w") as f:
        for name in sets:
            items = load_prompt_set(name, limit)
            outs = llm.chat([it["messages"] for it in items], sp, use_tqdm=True)
            for it, o in zip(items, outs):
                f.write(json.dumps({"set": name, "category": it.get("category", name), "id": it["id"],
                                    "prompt": list(o.prompt_token_ids), "output": list(o.outputs[0].token_ids)}) + "\n")


class CrossIndex:
    """Every earlier request's tokens, indexed by n-gram (n = min_n .. max_n) -> the most recent occurrence's end.
    Insertion O(length) per finished request, lookup O(1) per n: what a serving-side index would cost."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.docs: list[np.ndarray] = []
        self.where: dict[tuple[int, ...], tuple[int, int]] = {}

    def add(self, tokens: np.ndarray) -> None:
        d = len(self.docs)
        self.docs.append(tokens)
        t = tokens.tolist()
        for n in range(self.min_n, self.max_n + 1):
            for end in range(n - 1, len(t) - 1):  # an occurrence with at least one token after it
                self.where[(n, *t[end - n + 1: end + 1])] = (d, end)

    def lookup(self, history: np.ndarray, k: int) -> np.ndarray:
        h = history.tolist()
        for n in range(min(self.max_n, len(h)), self.min_n - 1, -1):
            hit = self.where.get((n, *h[-n:]))
            if hit is not None:
                d, end = hit
                return self.docs[d][end + 1: end + 1 + k]
        return history[:0]


def accepted(proposal: np.ndarray, truth: np.ndarray) -> int:
    m = min(len(proposal), len(truth))
    if m == 0:
        return 0
    neq = np.nonzero(proposal[:m] != truth[:m])[0]
    return int(neq[0]) if len(neq) else m


def replay(reqs: list[dict], source: str, k: int, cross_n: tuple[int, int]) -> dict:
    index = CrossIndex(*cross_n)
    steps = tokens = proposed = 0
    for r in reqs:
        prompt, out = np.asarray(r["prompt"], np.int64), np.asarray(r["output"], np.int64)
        hist = prompt
        t = 0
        while t < len(out):
            truth = out[t:]
            own = prompt_lookup(hist, k, 2, 4) if source != "cross" else hist[:0]
            other = index.lookup(hist, k) if source != "self" else hist[:0]
            if source == "best":
                a = max(accepted(own, truth), accepted(other, truth))
                proposed += bool(len(own) or len(other))
            else:
                prop = own if len(own) or source == "self" else other
                a = accepted(prop, truth)
                proposed += bool(len(prop))
            n = min(a + 1, len(truth))
            hist = np.concatenate([hist, truth[:n]])
            t += n
            steps += 1
        tokens += len(out)
        index.add(np.concatenate([prompt, out]))
    return {"tokens": tokens, "steps": steps, "tokens_per_forward": tokens / max(steps, 1),
            "proposed_share": proposed / max(steps, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--generate", action="store_true", help="(re)generate the served outputs first (needs vLLM)")
    p.add_argument("--cache", type=Path, default=CACHE)
    p.add_argument("--sets", default=",".join(SETS))
    p.add_argument("--limit", type=int, default=200, help="prompts per set at most")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--out", default="dev/studies/lookup_replay.json")
    a = p.parse_args()
    sets = tuple(s for s in a.sets.split(",") if s)
    if a.generate or not a.cache.exists():
        generate(a.cache, sets, a.limit, a.max_tokens, a.dtype)
    reqs = [json.loads(line) for line in a.cache.open()]
    t0 = time.perf_counter()
    arms = [("self", 7, (2, 4)), ("self", 11, (2, 4)), ("self", 15, (2, 4)), ("cross", 7, (2, 4)),
            ("cross", 7, (3, 6)), ("self+cross", 7, (3, 6)), ("self+cross", 15, (3, 6)), ("best", 7, (3, 6))]
    rows = []
    for name in sets:
        for group in sorted({r["category"] for r in reqs if r["set"] == name}) if name == "open-chat" else [name]:
            sub = [r for r in reqs if r["set"] == name and (name != "open-chat" or r["category"] == group)]
            for src, k, cn in arms:
                res = replay(sub, src, k, cn)
                rows.append({"set": name, "group": group, "requests": len(sub), "source": src, "k": k,
                             "cross_n": list(cn), **res})
        if name == "open-chat":  # the whole set too, the cross index then spans categories
            sub = [r for r in reqs if r["set"] == name]
            for src, k, cn in arms:
                rows.append({"set": name, "group": "all", "requests": len(sub), "source": src, "k": k,
                             "cross_n": list(cn), **replay(sub, src, k, cn)})
    from dev.studies.second_choice import cpu_kind

    Path(a.out).write_text(json.dumps({"cache": str(a.cache), "max_tokens": a.max_tokens, "dtype": a.dtype,
                                       "cpu": cpu_kind(), "replay_seconds": round(time.perf_counter() - t0, 1),
                                       "rows": rows}, indent=1) + "\n")
    print(f"{'set/group':24s} {'source':11s} {'k':>3s} {'n':>5s} {'tok/fwd':>8s} {'proposed':>9s}")
    for r in rows:
        print(f"{r['set'] + '/' + r['group']:24s} {r['source']:11s} {r['k']:3d} {str(r['cross_n']):>5s} "
              f"{r['tokens_per_forward']:8.3f} {r['proposed_share']:9.2f}")


if __name__ == "__main__":
    main()
