#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""Pooled ratios of twin servers (`NAME`, `NAME#p2`, ...) in one `vllm-dflash bench` run (issue 62: one server per
configuration carries a per-process speed offset of up to ~8 %).

    vllm-dflash bench --configs none,none+extras,none+extras#p2,ours,ours#p2 ... --name RUN
    python benchmarks/pooled.py benchmarks/results/RUN.json

The logic lives in vllm_dflash/bench/pooled.py (also `python -m vllm_dflash.bench.pooled`)."""
from vllm_dflash.bench.pooled import main

if __name__ == "__main__":
    raise SystemExit(main())
