# SPDX-License-Identifier: Apache-2.0
"""Serving benchmark (issue 6): no speculation, vLLM n-gram, vLLM's built-in dflash drafter and ours on the
same draft checkpoint, each behind a real `vllm serve`, driven by concurrent streaming OpenAI clients.

    python benchmarks/bench_serving.py --quick        # < 10 min on 2 cores
    python benchmarks/bench_serving.py                # concurrency 1/8/32, 256 tokens (same as `vllm-dflash bench`)

The logic lives in vllm_dflash/bench/ (args.py: flags; run.py: driver)."""
import sys
from pathlib import Path

from vllm_dflash.bench.run import main

if __name__ == "__main__":  # as the repo's script: results stay with the committed ones
    sys.exit(main(out_dir_default=str(Path(__file__).resolve().parent / "results")))
