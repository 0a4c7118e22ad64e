#!/usr/bin/env bash
# Long-running, resumable data collection for the SmolLM2 drafts (run again to resume; niced so other work goes on).
# vLLM's defaults (torch.compile; bf16 where the CPU has it, fp32 on AVX2-only CPUs), one core bound to the worker
# (see below): several times the eager fp32 rate. Greedy only (the drafts are judged on greedy serving); ShareGPT
# chat (multi-turn, the target answers every turn) and code prompts. Those are all answered now: the next folder is
#   OUT=data/collect/smollm2-v3 SOURCES=code-stdlib-alt,code-pkgs-alt,code-codeio-alt,chat-web-alt EXCLUDE= \
#     setsid nohup bash scripts/collect_bg.sh >> runs/collect-v3.log 2>&1 < /dev/null &
cd "$(dirname "$0")/.."
# setsid gives this job its own scheduler autogroup, where nice only ranks it against itself: lower the
# group's weight too (Linux autogroup; measured: a "nice 15" job still took a full core from a build).
echo 19 > /proc/self/autogroup 2>/dev/null || true
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}
# One thread on the last core by default: with other work on the machine, two OpenMP threads spin-wait and collapse
# (measured: no chunk done in 25 min); on an idle machine VLLM_CPU_OMP_THREADS_BIND=0-1 OMP_NUM_THREADS=2 is ~1.8x faster.
export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-$(($(nproc) - 1))} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
EXCLUDE=${EXCLUDE-data/collect/smollm2-gpu1,data/collect/smollm2-gpu2,data/collect/smollm2-gpu3}  # empty: none
exec nice -n ${NICE:-15} .venv/bin/vllm-dflash collect --out ${OUT:-data/collect/smollm2-v2} \
  --sources ${SOURCES:-chat-sharegpt,code-codeio,code-stdlib,code-pkgs} --sample-fraction 0 \
  --max-new-tokens 384 --chunk-size 64 --max-num-seqs 64 \
  ${EXCLUDE:+--exclude-collected "$EXCLUDE"} "$@"
