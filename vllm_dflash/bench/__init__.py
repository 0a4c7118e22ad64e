# SPDX-License-Identifier: Apache-2.0
"""The serving benchmark (`vllm-dflash bench`, `benchmarks/bench_serving.py`).

  configs.py : the configuration registry (none, ngram, vllm-dflash, ours, ours-no-overlap, ours-adaptive, ours-adaptive-overlap)
  client.py  : concurrent streaming OpenAI clients (asyncio) against one `vllm serve`
  stats.py   : pure maths: percentiles, /metrics counter deltas (τ, per-position acceptance), output comparison
  report.py  : markdown table and PNG plots
  run.py     : the driver: one real `vllm serve` per configuration, every prompt set and concurrency level

Importing this package is cheap (no torch, no vLLM)."""
