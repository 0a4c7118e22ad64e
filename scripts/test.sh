#!/usr/bin/env bash
# The test command (README, .ci/run). No arguments: every tier (tests/unit, tests/vllm, tests/e2e), minus `slow`.
#   bash scripts/test.sh                 # everything (what CI runs)
#   bash scripts/test.sh --unit          # the fast path: tests/unit (no vLLM anywhere) without the nvcc compile check
#                                        # (marker `build`, a minute of nvcc); `tests/unit` instead of --unit runs it too
#   bash scripts/test.sh --vllm | --e2e  # one tier
#   bash scripts/test.sh -m slow         # other arguments go to pytest as they are
# Tests run in pytest-xdist workers, one more than cores (DFLASH_TEST_WORKERS overrides; 0 = in this process), a
# file to a worker so module-scoped engines are built once; tests/conftest.py binds each worker's engines to a core.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} TOKENIZERS_PARALLELISM=false
marks="not slow"
args=()
for a in "$@"; do
  case "$a" in
    --unit) args+=("tests/unit"); marks="not slow and not build" ;;
    --vllm|--e2e) args+=("tests/${a#--}") ;;
    *) args+=("$a") ;;
  esac
done
# one worker more than cores: the vLLM tests spend part of their time waiting (servers starting, engines shutting
# down), which the extra worker fills (CI: 2 cores, 3 workers)
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc alone obeys OMP_NUM_THREADS
workers=${DFLASH_TEST_WORKERS:-$((cores + 1))}
par=()
# files in collection order (tests/conftest.py puts the longest first), not xdist's default order by tests per file
[ "$workers" -gt 1 ] && par=(-n "$workers" --dist loadfile --no-loadscope-reorder)
exec .venv/bin/python -m pytest -q -m "$marks" --durations=30 ${par[@]+"${par[@]}"} ${args[@]+"${args[@]}"}
