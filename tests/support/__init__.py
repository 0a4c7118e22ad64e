# SPDX-License-Identifier: Apache-2.0
"""Test support shared by every tier (importable as `support` once tests/ is on sys.path: tests/conftest.py puts
it there for pytest; scripts/make_test_assets.py inserts it itself).

* support.testing: tiny random models and trajectories (no vLLM; was vllm_dflash.testing, which is not shipped);
* support.vllm_helpers: run vLLM configurations in a fresh subprocess (support/vllm_run.py) and read their results.
"""
