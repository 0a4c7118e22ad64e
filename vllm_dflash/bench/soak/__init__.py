# SPDX-License-Identifier: Apache-2.0
"""The soak test: `vllm serve` with our DFlash drafter under load, faults and bad input (docs/RELIABILITY.md).

  plan.py    : the seeded request mix (real prompts, plain request descriptions, no HTTP)
  client.py  : concurrent asyncio clients (httpx) and the server process tree's memory sampler
  startup.py : bad configurations that `vllm serve` must reject before serving
  features.py: the served feature check against stock vLLM (`--features-check`)
  calibrate.py: the calibration check of sampled output (`--calibration`; the maths: vllm_dflash/bench/calibration.py)
  lora.py    : the tiny LoRA adapter the soak serves (unless --no-lora)
  report.py  : a round's figures, the server-log accounting, the pass/fail checks
  render.py  : the markdown report (docs/RELIABILITY.md, `--render`)
  phases.py  : the phases against a running server: driven batches, idle wait, round counters, restart, watchdog
  run.py     : the driver and its command line (`python -m vllm_dflash.bench.soak`, `benchmarks/soak.py`)

Importing this package is cheap (no torch, no vLLM, no httpx)."""
