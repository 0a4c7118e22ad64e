#!/usr/bin/env bash
# The test command (README, .ci/run): unit tests, the reference loop, and real vLLM (CPU) tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest -q -m "not slow" --durations=30 "$@"
