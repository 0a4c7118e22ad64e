#!/usr/bin/env bash
# Long-running, resumable training of the SmolLM2 block-8 draft (1 OpenMP thread; run again to resume).
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec .venv/bin/vllm-dflash train --data data/collect/smollm2-v1 --out runs/smollm2-b8-l1 \
  --feature-cache runs/features/smollm2-v1 --layers 1 --block-size 8 --epochs 4 --eval-every 150 \
  --ckpt-every 25 --threads 1 "$@"
