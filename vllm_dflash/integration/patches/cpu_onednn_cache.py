# SPDX-License-Identifier: Apache-2.0
"""Patch: vLLM's oneDNN GEMM keeps a primitive for only 32 row counts per weight shape (setting onednn_cache).

On CPU, vLLM 0.32 runs every large linear layer through `_C::onednn_mm` (`dispatch_cpu_unquantized_gemm`). The C++
handler keeps one oneDNN primitive per row count M in an LRU shared by all layers of a weight shape
(csrc/cpu/dnnl_helper.cpp), and vLLM creates it with room for 32 row counts. A speculative step has
M = sum over requests of (1 + its draft length), so at batch 8-32 the row counts in play exceed 32 and the LRU
thrashes, and every new row count builds its primitives on the critical path (measured on a 2-core Xeon with
avx512_bf16, the target's 120 GEMMs: 3-5 ms more for the first step at M = 9-57, 28 ms at M = 257, 45 ms at
M = 1,653; a thrashing LRU adds about 10 us per GEMM call). Served traces of adaptive drafting at concurrency 8 saw
57-104 distinct M in 96-256 steps.

With the setting on (the default), every handler created after the plugin loads gets an LRU of `onednn_cache` row
counts, and the first handler of each weight shape builds the primitives for M = 1 .. the largest decode step the
engine can schedule (max_num_seqs x (1 + num_speculative_tokens), capped at max_num_batched_tokens and at half the
cache; smallest first, at most WARM_BUDGET_S per shape), so decode steps rarely build one while serving. Prefill
steps (one-off large M) still build theirs. Applies to every configuration alike (no speculation included);
`DFLASH_ONEDNN_CACHE=0` leaves vLLM's behaviour untouched.
"""
from __future__ import annotations

import time

from vllm_dflash.integration.patches.base import Patch, acts, setting_for
from vllm_dflash.utils import get_logger

logger = get_logger(__name__)

_ORIGINAL = None
_WARMED: set[tuple[int, int, str]] = set()  # (N, K, dtype) weight shapes whose row counts were built


def warm_rows(cache: int) -> int:
    """Row counts to build up front: the largest decode step of the engine being loaded (0 outside one)."""
    from vllm.config import get_current_vllm_config_or_none

    cfg = get_current_vllm_config_or_none()
    sched = getattr(cfg, "scheduler_config", None)
    if sched is None:  # no engine being loaded: build nothing up front
        return 0
    spec = cfg.speculative_config
    k = int(getattr(spec, "num_speculative_tokens", 0) or 0) if spec is not None else 0
    rows = int(sched.max_num_seqs) * (1 + k)
    return max(0, min(rows, int(sched.max_num_batched_tokens), cache // 2))


WARM_BUDGET_S = 0.5  # per weight shape: a float32 LM head on an AVX2 CPU would take seconds for 256 row counts


def _warm(handler, weight, rows: int, budget_s: float = WARM_BUDGET_S) -> int:
    """Run the handler once per row count 1, 2, .. rows on zeros (each run builds and caches that row count's
    primitive), smallest first, until `budget_s` has passed. Returns the largest row count built."""
    import torch

    from vllm import _custom_ops as ops

    k = weight.shape[0]  # weight is [K, N] (vLLM passes the transposed view)
    x = torch.zeros(rows, k, dtype=weight.dtype)  # [rows, K]
    deadline = time.perf_counter() + budget_s
    for m in range(1, rows + 1):
        ops.onednn_mm(handler, x[:m], None)  # [m, N], discarded
        if time.perf_counter() > deadline:
            return m
    return rows


def create_onednn_mm(weight, primitive_cache_size: int = 128):
    """Wraps vLLM's `_custom_ops.create_onednn_mm` (same signature): a larger row-count cache, built up front."""
    from vllm.config import get_current_vllm_config_or_none

    cfg = get_current_vllm_config_or_none()  # the engine whose model is loading (None: outside one)
    if not acts("speedup", cfg):  # not an engine with our drafter (nor the opt-in): vLLM's own
        return _ORIGINAL(weight, primitive_cache_size)
    cache = setting_for("onednn_cache", cfg)
    if cache <= 0:
        return _ORIGINAL(weight, primitive_cache_size)
    handler = _ORIGINAL(weight, max(cache, primitive_cache_size))
    key = (int(weight.shape[1]), int(weight.shape[0]), str(weight.dtype))
    if key not in _WARMED:
        rows = warm_rows(cache)
        if rows > 0:  # a shape first met outside an engine (rows 0) is built by the first engine that loads it
            _WARMED.add(key)
            t0 = time.perf_counter()
            built = _warm(handler, weight, rows)
            logger.info("vllm_dflash: oneDNN GEMM primitives for M = 1..%d of weight [N=%d, K=%d] %s built in %.2f s",
                        built, key[0], key[1], key[2], time.perf_counter() - t0)
    return handler


def apply() -> None:
    global _ORIGINAL
    from vllm import _custom_ops as ops

    if getattr(ops.create_onednn_mm, "_vllm_dflash_patched", False):
        return
    _ORIGINAL = ops.create_onednn_mm
    create_onednn_mm._vllm_dflash_patched = True  # the ledger's mark: the seam check skips our wrapper
    # vllm.model_executor.layers.utils and our cpu_gemv patch call it as `ops.create_onednn_mm` (module attribute)
    ops.create_onednn_mm = create_onednn_mm


PATCH = Patch(
    symbol="vllm._custom_ops.create_onednn_mm (the row-count primitive cache of vLLM's CPU oneDNN GEMM)",
    why="vLLM keeps oneDNN primitives for 32 row counts per weight shape; speculative decode steps use far more, so "
        "the cache thrashes and each new row count is built mid-step. The wrapper asks for `onednn_cache` entries "
        "and builds the decode-sized ones when the first layer of each shape loads",
    removal="when vLLM sizes the cache from the scheduler (or pads M to buckets) and builds the decode sizes at "
            "warm-up",
    apply=apply,
    kind="speedup",
)
