#!/usr/bin/env bash
# Long-running, resumable data collection for the SmolLM2 draft (1 OpenMP thread, leaves a core free).
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1
exec .venv/bin/vllm-dflash collect --out data/collect/smollm2-v1 --max-new-tokens 320 --chunk-size 64 --max-num-seqs 64 "$@"
