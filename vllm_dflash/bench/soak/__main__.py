# SPDX-License-Identifier: Apache-2.0
"""`python -m vllm_dflash.bench.soak [--quick] ...`: the soak test (run.py); results under ./bench-results/."""
from vllm_dflash.bench.soak.run import main

raise SystemExit(main(prog="python -m vllm_dflash.bench.soak"))
