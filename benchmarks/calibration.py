#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""Calibration of vLLM's CPU sampler alone, on real target logits in float32 and in bfloat16 (issue 61, item 5).

    python benchmarks/calibration.py [--contexts 48] [--draws 2000] [--out runs/calibration/sampler.json]

The served check is `python benchmarks/soak.py --calibration` (vllm_dflash/bench/soak/calibrate.py). This script
takes the served part away: SmolLM2-135M-Instruct (the bundled target, transformers) gives the next-token logits
of --contexts open-chat prompts, once with float32 weights and once with bfloat16 weights (the logits vLLM's bf16
engine samples from are bf16: its lm_head runs in bf16); each row is then sampled --draws times by vLLM's own
`Sampler` (temperature 1.0, no top-k / top-p, 20 logprobs: on this CPU `TopKTopPSampler.forward_cpu`, the
`fused_gumbel_argmax` kernel, and the raw logprobs the server returns), and every draw is scored as the served
check scores an emitted token (vllm_dflash.bench.calibration), and as a statistic blind to ties would
(`tie_blind_event`: I = emitted logprob at least the k-th largest, E = the probability of exactly k tokens).
"""
import argparse
import json
import time
from pathlib import Path


def logits_rows(target: Path, contexts: int, dtype) -> "torch.Tensor":  # noqa: F821
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vllm_dflash.data.prompts import get_prompts, render

    tok = AutoTokenizer.from_pretrained(str(target))
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=dtype).eval()
    rows = []
    with torch.no_grad():
        for item in get_prompts("open-chat", contexts):
            ids = render(tok, item)[-256:]
            rows.append(model(torch.tensor([ids])).logits[0, -1])  # [V], in the model's dtype
    return torch.stack(rows)


def sample(logits, draws: int, batch: int = 256):
    """vLLM's Sampler on each row `draws` times -> [(sampled id, its logprob, top-20 ids, their logprobs)]."""
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler

    sampler, out = Sampler(), []
    for row in logits:
        for lo in range(0, draws, batch):
            b = min(batch, draws - lo)
            sm = SamplingMetadata(
                temperature=torch.ones(b), all_greedy=False, all_random=True, top_p=None, top_k=None, generators={},
                max_num_logprobs=20, no_penalties=True, prompt_token_ids=None, frequency_penalties=torch.zeros(b),
                presence_penalties=torch.zeros(b), repetition_penalties=torch.ones(b),
                output_token_ids=[[] for _ in range(b)], allowed_token_ids_mask=None, bad_words_token_ids={},
                logitsprocs=LogitsProcessors())
            lt = sampler(row.expand(b, -1).clone(), sm).logprobs_tensors
            out += list(zip(lt.logprob_token_ids.tolist(), lt.logprobs.tolist(), strict=True))
    return out


def score(draws) -> dict:
    from vllm_dflash.bench.calibration import Calibration, Position

    cal = Calibration()
    for ids, lps in draws:
        cal.add(Position(str(ids[0]), lps[0], tuple((str(i), v) for i, v in zip(ids[1:], lps[1:], strict=True))))
    return {**{k: v for k, v in cal.to_dict().items() if k != "tallies"}, "tied_top1": cal.tallies[1].tied,
            "tied_top5": cal.tallies[5].tied}


def main() -> None:
    import torch

    from vllm_dflash.target import default_target_dir, is_prepared, prepare_target
    from vllm_dflash.utils import cpu_kind

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--contexts", type=int, default=48)
    p.add_argument("--draws", type=int, default=2000, help="samples per context")
    p.add_argument("--out", default="runs/calibration/sampler.json")
    a = p.parse_args()
    target = default_target_dir() if is_prepared(default_target_dir()) else prepare_target()
    torch.manual_seed(0)  # vLLM's CPU sampler seeds its unseeded rows from torch's global generator
    res = {"target": str(target), "contexts": a.contexts, "draws": a.draws, "cpu": cpu_kind(),
           "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        t0 = time.time()
        draws = sample(logits_rows(target, a.contexts, dtype), a.draws)
        res[name] = {**score(draws), "seconds": round(time.time() - t0)}
        print(name, json.dumps(res[name]), flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
