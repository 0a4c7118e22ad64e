#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""The adaptive planner's step-cost model, predicted against measured step time on DFLASH_TRACE traces (issue 62.3).

    python benchmarks/cost_model.py /tmp/tr/RUN --out-dir benchmarks/results --name cost_model_epyc_bf16 --label RUN

The logic lives in vllm_dflash/bench/cost_model.py (also `python -m vllm_dflash.bench.cost_model`)."""
from vllm_dflash.bench.cost_model import main

if __name__ == "__main__":
    raise SystemExit(main())
