#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""Soak test: `vllm serve` with our DFlash drafter under load, faults and bad input (docs/RELIABILITY.md).

    python benchmarks/soak.py --quick                  # ~5 min (CI: tests/e2e/test_soak.py); --preempt: small KV cache
    python benchmarks/soak.py --features-check         # each request feature against stock vLLM (~2 min)
    python benchmarks/soak.py --calibration --dtype bfloat16   # sampled output calibrated, ours and stock (~30 min)
    python benchmarks/soak.py                          # the full soak: 64 clients, 3 rounds, 20 min
    python benchmarks/soak.py --render benchmarks/results/soak-full.json benchmarks/results/soak-quick.json \
        --notes dev/soak_notes.md --md docs/RELIABILITY.md   # the report from the JSON results

The logic lives in vllm_dflash/bench/soak/ (run.py: flags and driver; also `python -m vllm_dflash.bench.soak`).
As the repo's script, the results stay with the committed ones (benchmarks/results/) and the server log goes to
runs/soak/."""
from pathlib import Path

from vllm_dflash.bench.soak.run import main

REPO = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    raise SystemExit(main(out_default=str(REPO / "benchmarks" / "results" / "soak-{mode}.json"),
                          log_default=str(REPO / "runs" / "soak" / "soak-{mode}-serve.log")))
