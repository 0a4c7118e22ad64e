# SPDX-License-Identifier: Apache-2.0
"""How far one greedy divergence's logprob margin moves with the numeric context (bf16 batch variance).

    python dev/divergence_contexts.py dev/results/bench_v12.json.gz --config ours-merged --prompt-set chat \
        --concurrency 32 --id web:wikipedia_5.jsonl:516

The benchmark's judge measures a divergence's margin with one prefill of the whole prefix at batch 1. The runs
themselves took the token in decode steps at batch 32, with other query lengths. This replays the prefix in bf16 in
several contexts with vLLM's defaults (compiled), and prints the target's top tokens and both outputs' logprobs in
each: prefill alone (the judge's context), decode alone after the prefix minus its last tokens, and the same decode
in a batch with the other prompts of the run's slice. A margin that moves as much as the divergence needs is a
numerical tie of bf16, not a drafting error; fp32 (--dtype float32) gives the reference."""
from __future__ import annotations

import argparse
import gzip
import json
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result")
    ap.add_argument("--config", required=True)
    ap.add_argument("--prompt-set", required=True)
    ap.add_argument("--concurrency", type=int, required=True)
    ap.add_argument("--id", required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--back", type=int, default=6, help="decode contexts: prefill all but this many prefix tokens")
    a = ap.parse_args()

    from vllm import LLM, SamplingParams

    from vllm_dflash.bench.run import load_prompt_set
    from vllm_dflash.exactness import first_difference, prompt_ids
    from vllm_dflash.target import resolve_target

    d = json.load(gzip.open(a.result, "rt") if a.result.endswith(".gz") else open(a.result))  # dev/results/ is gzipped
    runs = {(r["config"], r["prompt_set"], r["concurrency"]): r for r in d["runs"]}
    base, other = runs[("none", a.prompt_set, a.concurrency)], runs[(a.config, a.prompt_set, a.concurrency)]
    ids_in_run = [q["id"] for q in base["requests"]]
    items = {it["id"]: it for it in load_prompt_set(a.prompt_set, 4 * len(ids_in_run) + 200)}
    item = items[a.id]
    llm = LLM(model=str(resolve_target(None)), dtype=a.dtype, max_model_len=2048, max_num_seqs=64, seed=0,
              gpu_memory_utilization=0.5)
    tok = llm.get_tokenizer()
    ta = tok.encode(base["outputs"][a.id], add_special_tokens=False)
    tb = tok.encode(other["outputs"][a.id], add_special_tokens=False)
    i = first_difference(ta, tb)
    P = prompt_ids(tok, item)
    A, B = ta[i], tb[i]
    print(f"first difference at output token {i}: none {tok.decode([A])!r} vs {a.config} {tok.decode([B])!r}")

    def show(name: str, lps) -> None:
        top = sorted(lps.items(), key=lambda kv: -kv[1].logprob)
        best = top[0][1].logprob
        cells = ", ".join(f"{tok.decode([t])!r} {lp.logprob - best:+.3f}" for t, lp in top[:5])
        mine = {t: lp.logprob - best for t, lp in lps.items()}
        gap = (mine.get(A, float("nan")) - mine.get(B, float("nan")))
        print(f"{name:32s} logprob(none's) - logprob({a.config}'s) = {gap:+.3f} nats | top: {cells}")

    greedy = SamplingParams(temperature=0.0, max_tokens=1, logprobs=20)
    out = llm.generate([{"prompt_token_ids": P + ta[:i]}], greedy, use_tqdm=False)[0]
    show("prefill alone (the judge)", out.outputs[0].logprobs[0])
    n = a.back
    dec = SamplingParams(temperature=0.0, max_tokens=n + 1, logprobs=20)
    prefix = P + ta[: i - n]
    out = llm.generate([{"prompt_token_ids": prefix}], dec, use_tqdm=False)[0]
    same = list(out.outputs[0].token_ids[:n]) == ta[i - n: i]
    show(f"decode alone (path {'same' if same else 'DIFFERENT'})", out.outputs[0].logprobs[n])
    others = [items[x] for x in ids_in_run if x != a.id and x in items]
    batch = [{"prompt_token_ids": prefix}] + [{"prompt_token_ids": prompt_ids(tok, it)} for it in others]
    outs = llm.generate(batch, [dec] + [SamplingParams(temperature=0.0, max_tokens=64)] * len(others),
                        use_tqdm=False)
    same = list(outs[0].outputs[0].token_ids[:n]) == ta[i - n: i]
    show(f"decode in a batch of {len(batch)} (path {'same' if same else 'DIFFERENT'})", outs[0].outputs[0].logprobs[n])


if __name__ == "__main__":
    main()
