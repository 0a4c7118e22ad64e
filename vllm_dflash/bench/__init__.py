# SPDX-License-Identifier: Apache-2.0
"""Benchmarks and the demo. The serving benchmark (`vllm-dflash bench`, `benchmarks/bench_serving.py`):

  configs.py : the configuration registry (stock vLLM none and ngram, none+extras, ngram+extras, vllm-dflash,
               ours: our default, ours-overlap, ours-fixed: the paper's fixed block, ours-fixed-no-overlap, ...)
  client.py  : concurrent streaming OpenAI clients (asyncio) against one `vllm serve`
  stats.py   : pure maths: percentiles, /metrics counter deltas (τ, per-position acceptance), output comparison
  report.py  : markdown table and PNG plots
  waves.py   : one wave of requests against a server (metrics scrapes, CPU time of its threads and of every other
               process) and a run summarized from its waves
  procs.py   : CPU time and layout of processes and threads, read from /proc
  args.py    : the flags of `vllm-dflash bench` and the presets (--quick, the full run)
  drive.py   : the runs: each configuration's `vllm serve` started and warmed up, every prompt set and concurrency
               level against it (one server after another, or --interleave: all up, rotated rounds)
  lossless.py: greedy outputs against `none`, each difference explained (vllm_dflash.exactness)
  meta.py    : the JSON's meta block (schema, flags, engine, layout, machine, versions), each run's hardware limit,
               and `upgrade`, which reads a result written before the configurations were renamed
  run.py     : the driver: one real `vllm serve` per configuration, every prompt set and concurrency level
Beside it:
  demo.py          : `vllm-dflash demo`: stock vLLM without speculation and with n-gram, and ours side by side
  soak/            : the soak test (`benchmarks/soak.py`, `python -m vllm_dflash.bench.soak`): load, faults, bad input
  kernels.py       : KV-injection kernel benchmark (`benchmarks/bench_kv_injection.py`)
  train_profile.py : one training step timed by phase (`benchmarks/profile_train_step.py`)

Importing this package is cheap (no torch, no vLLM)."""
