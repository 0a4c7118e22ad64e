#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""KV-injection micro-benchmark: our fused op vs the unfused PyTorch path vs vLLM 0.32's own precompute.

    python benchmarks/bench_kv_injection.py --clock cpu --serving   # the published run (benchmarks/results/)
    python benchmarks/bench_kv_injection.py --quick

The logic lives in vllm_dflash/bench/kernels.py (also `python -m vllm_dflash.bench.kernels`)."""
from pathlib import Path

from vllm_dflash.bench.kernels import main

if __name__ == "__main__":  # as the repo's script: results stay with the committed ones
    raise SystemExit(main(out_default=str(Path(__file__).resolve().parent / "results" / "kv_injection.json")))
