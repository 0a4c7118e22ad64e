#!/usr/bin/env bash
# Serve SmolLM2-135M-Instruct with our DFlash drafter on :8000 (prepare the target first: vllm-dflash prepare-target).
set -euo pipefail
TARGET=${TARGET:-$(.venv/bin/vllm-dflash prepare-target)}
DRAFT=${DRAFT:-models/SmolLM2-135M-Instruct-DFlash-b8}
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
exec .venv/bin/vllm serve "$TARGET" --dtype float32 --max-model-len 2048 --enforce-eager --served-model-name target \
  --speculative-config "{\"method\":\"dflash\",\"model\":\"$DRAFT\",\"num_speculative_tokens\":7,\"diffusion_steps\":1}"
