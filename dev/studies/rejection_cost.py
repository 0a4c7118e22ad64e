# SPDX-License-Identifier: Apache-2.0
"""Where a sampled speculative step's sampling time goes on CPU (issue 54.1), and what the patch cpu_sampled_verify
saves.

vLLM's RejectionSampler (with the CPU platform's C++ kernel overrides, as a CPU worker installs them) against the
plain Sampler of a step without drafts, for all-sampled batches at one temperature: the whole call, the
torch.profiler top ops of vLLM's rejection sampler, then the same call with our patch on (integration/
sampled_verify.py). The target's vocabulary size comes from --target's config.

    .venv/bin/python dev/studies/rejection_cost.py --batch 1,8 --k 7 [--draft-probs] [--out dev/studies/rejection_cost.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def _meta(batch: int, temperature: float):
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    return SamplingMetadata(
        temperature=torch.full((batch,), temperature), all_greedy=False, all_random=True, top_p=None, top_k=None,
        generators={}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch), presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.ones(batch), output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())


def _time(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1e3  # ms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=None, help="target folder (default: the bundled SmolLM2 target)")
    p.add_argument("--batch", default="1,8")
    p.add_argument("--k", type=int, default=7, help="draft tokens per request")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--out", default=None)
    a = p.parse_args()

    import torch
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    from vllm_dflash.integration.patches import cpu_sampled_verify

    if a.target is None:
        from vllm_dflash.target import resolve_target

        a.target = str(resolve_target(None))
    vocab = json.loads((Path(a.target) / "config.json").read_text())["vocab_size"]
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    rows = []
    for batch in [int(x) for x in a.batch.split(",")]:
        meta = _meta(batch, a.temperature)
        drafts = torch.randint(0, vocab, (batch, a.k), generator=g).tolist()
        spec = SpecDecodeMetadata.make_dummy(drafts, torch.device("cpu"))
        logits_spec = torch.randn(batch * (a.k + 1), vocab, generator=g)  # [B * (K + 1), V]
        logits_plain = torch.randn(batch, vocab, generator=g)  # [B, V]
        q = torch.softmax(torch.randn(batch * a.k, vocab, generator=g), -1)  # [B * K, V]
        sampler = Sampler()
        rej = RejectionSampler(sampler)
        plain_ms = _time(lambda: sampler(logits_plain.clone(), meta), a.reps)
        onehot_ms = _time(lambda: rej(spec, None, logits_spec.clone(), meta), a.reps)
        q_ms = _time(lambda: rej(spec, q, logits_spec.clone(), meta), a.reps)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(10):
                rej(spec, None, logits_spec.clone(), meta)
        top = [{"op": e.key, "ms_per_call": e.cpu_time_total / 10 / 1e3, "calls": e.count // 10}
               for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:12]]
        # ours: the patch cpu_sampled_verify (integration/sampled_verify.py), on for this sampler
        cpu_sampled_verify.apply()
        rej._vllm_dflash_on = True
        ours_onehot_ms = _time(lambda: rej(spec, None, logits_spec.clone(), meta), a.reps)
        ours_q_ms = _time(lambda: rej(spec, q, logits_spec.clone(), meta), a.reps)
        assert rej._vllm_dflash_sampled_steps > 0
        rej._vllm_dflash_on = False
        rows.append({"batch": batch, "plain_sampler_ms": plain_ms, "rejection_onehot_ms": onehot_ms,
                     "rejection_q_ms": q_ms, "ours_onehot_ms": ours_onehot_ms, "ours_q_ms": ours_q_ms,
                     "top_ops_onehot": top})
        print(f"batch {batch}: plain sampler {plain_ms:.2f} ms; vLLM's rejection sampler: one-hot drafts "
              f"{onehot_ms:.2f} ms, draft q {q_ms:.2f} ms; ours (cpu_sampled_verify): {ours_onehot_ms:.2f} / "
              f"{ours_q_ms:.2f} ms")
        for t in top[:8]:
            print(f"    {t['op'][:60]:60s} {t['ms_per_call']:7.3f} ms x{t['calls']}")
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "?")
    flags = Path("/proc/cpuinfo").read_text()
    result = {"cpu": cpu + (", avx512_bf16" if "avx512_bf16" in flags else ", no avx512_bf16"), "vocab": vocab,
              "k": a.k, "temperature": a.temperature, "threads": a.threads, "rows": rows}
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
