# SPDX-License-Identifier: Apache-2.0
"""How far apart two processes of the same engine run: one offline `LLM` (no speculation, the plugin's CPU extras),
six waves of 8 open-chat prompts x 128 tokens (greedy, ignore_eos: equal work), output tokens/s per wave.

    for i in 1 2 3; do VLLM_CPU_OMP_THREADS_BIND=0-1 python dev/process_spread.py p$i; done

Run it in several processes one after another: a wave's rate differs between waves (the prompts differ), so compare
process against process wave by wave. Session 51 (2-core EPYC with avx512_bf16, bf16): six processes averaged
237-278 tok/s, each staying fast or slow across its six waves (e.g. 1.08-1.30x wave by wave between the slowest and
the fastest), so an A/B between two servers carries a per-process offset of that size that interleaved rounds do not
average out. THP_MEM_ALLOC_ENABLE=1 (torch's huge-page allocations, 11 GB of them) did not change it."""
import os
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ["DFLASH_VLLM_EXTRAS"] = "all"


def main() -> None:
    from vllm import LLM, SamplingParams

    from vllm_dflash.bench.run import load_prompt_set
    from vllm_dflash.target import resolve_target
    from vllm_dflash.utils import default_dtype

    llm = LLM(model=str(resolve_target(None)), dtype=default_dtype(), max_model_len=2048, max_num_seqs=8, seed=0,
              gpu_memory_utilization=0.5)
    items = load_prompt_set("open-chat", 64)
    sp = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    llm.chat([it["messages"] for it in items[:8]], sp, use_tqdm=False)  # warm-up
    rates = []
    for w in range(6):
        t = time.perf_counter()
        outs = llm.chat([it["messages"] for it in items[8 + 8 * w: 16 + 8 * w]], sp, use_tqdm=False)
        rates.append(sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t))
    label = sys.argv[1] if len(sys.argv) > 1 else str(os.getpid())
    print("RATES", label, " ".join(f"{r:.0f}" for r in rates), flush=True)


if __name__ == "__main__":
    main()
