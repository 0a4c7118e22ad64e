# SPDX-License-Identifier: Apache-2.0
"""Patch: CPU linear layers on our GEMM kernels: bf16 with few rows (setting cpu_gemv; off by default) and fp32
(setting cpu_gemm_f32; on by default on AVX2-only CPUs).

vLLM 0.32 gives every bf16 linear layer on x86 to oneDNN (`dispatch_cpu_unquantized_gemm`), which streams the weight
at a fraction of the memory bandwidth when a call has 1-8 rows: the whole of decode at concurrency 1, and the draft
forward. With `DFLASH_CPU_GEMV` set, a layer vLLM would give to oneDNN gets both: our packed copy of the weight
(vllm_dflash/ops/gemv.py) and vLLM's oneDNN handler; `torch.ops.vllm_dflash.linear_bf16` picks one per call from the
row count (csrc/gemv_cpu.cpp), so a compiled graph keeps working for every batch size. Every other layer (fp32,
sgl-kernel, zentorch, a CPU without avx512_bf16) keeps vLLM's choice untouched.

fp32 (setting cpu_gemm_f32): a layer vLLM would give to oneDNN gets our packed copy (vllm_dflash/ops/gemm_f32.py) and
`torch.ops.vllm_dflash.linear_f32`, which runs calls with up to the setting's rows on our AVX2 kernel
(csrc/gemm_f32_cpu.cpp) and larger ones on vLLM's oneDNN handler; with `all` (auto on AVX2-only CPUs) every call runs
on ours and no oneDNN handler is built. Our kernel sums each output in one fixed order, so a row's result does not
depend on the batch it is in: decode (1 row a request) and verification (1 + k rows) see the same bits.
"""
from __future__ import annotations

import functools

from vllm_dflash.integration.patches.base import Patch, acts, setting_for
from vllm_dflash.utils import get_logger

logger = get_logger(__name__)

_ORIGINAL = None


def max_rows(value: int | str, threads: int) -> int:
    """The row threshold of a cpu_gemv value: `auto` = 8 with 2+ threads (measured crossover against oneDNN on
    2-core Xeon / EPYC machines, dev/results/gemv.md), 2 on one thread; an integer is itself; 0 = off."""
    if value == "auto":
        return 8 if threads >= 2 else 2
    return int(value)


NO_LIMIT = 1 << 62  # `all`: every call on our kernel


def f32_rows(value: int | str) -> int:
    """The row threshold of a cpu_gemm_f32 value: `auto` = all rows on CPUs with avx2 but no avx512f (measured
    there, dev/results/gemm_f32.md), 0 elsewhere; `all` = every call; an integer is itself; 0 = off."""
    import torch

    if value == "auto":
        return NO_LIMIT if torch.cpu._is_avx2_supported() and not torch.cpu._is_avx512_supported() else 0
    if value == "all":
        return NO_LIMIT
    return int(value)


def runs_own_f32_gemm(value) -> bool:
    """Does a cpu_gemm_f32 value (raw, e.g. an environment string, or parsed) put some float32 linear calls on our
    GEMM on this CPU, where stock vLLM runs oneDNN's? A value that does not parse: False (the server reports it)."""
    from vllm_dflash import settings
    from vllm_dflash.config import DFlashConfigError
    from vllm_dflash.ops.gemm_f32 import gemm_f32_supported

    try:
        rows = f32_rows(settings.parse_value("cpu_gemm_f32", value))
    except DFlashConfigError:
        return False
    return rows > 0 and gemm_f32_supported()


def _eligible(layer, utils_mod, ops_mod, dtype, supported) -> bool:
    """Would vLLM give this `dtype` layer to oneDNN (and can our kernel take it: `supported()`)? Mirrors
    dispatch_cpu_unquantized_gemm."""
    from vllm.platforms import current_platform

    w = layer.weight
    if w.is_meta or w.ndim != 2 or w.dtype != dtype or w.device.type != "cpu" or w.numel() == 0:
        return False
    if current_platform.is_zen_cpu():  # vLLM may give it to zentorch
        return False
    n, k = w.shape
    if utils_mod.check_cpu_sgl_kernel(n, k, w.dtype):
        return False
    return bool(ops_mod._supports_onednn) and supported()


def _install(layer, remove_weight: bool, ops, rows: int, op, pack, attr: str) -> bool:
    """Give `layer` our linear `op` (torch.ops.vllm_dflash.linear_bf16 / linear_f32) on its weight packed by `pack`:
    calls with <= rows rows on our kernel, larger ones on vLLM's oneDNN handler (none is built with NO_LIMIT).
    False (nothing changed) where vLLM's oneDNN handler cannot be built: vLLM's function decides then."""
    import torch

    weight = layer.weight.detach()  # [N, K]
    if rows < NO_LIMIT:
        try:
            handler = ops.create_onednn_mm(weight.t(), 32)  # vLLM's own oneDNN GEMM, for calls with more rows
        except RuntimeError:
            return False  # vLLM warns and falls back to F.linear itself
        handler_tensor = handler.handler_tensor
    else:
        handler, handler_tensor = None, torch.empty(0)  # never read: every call runs on our kernel
    packed = pack(weight)
    setattr(layer, attr, (packed, handler))  # keeps both alive (the handler frees its primitive in __del__)
    n, w_packed = packed.n, packed.packed
    layer.cpu_linear = lambda x, weight, bias: op(x, w_packed, n, bias, rows, handler_tensor)  # [..., N]
    if remove_weight:
        layer.weight = torch.nn.Parameter(torch.empty(0, dtype=weight.dtype, device=weight.device),
                                          requires_grad=False)
    return True


def dispatch(layer, remove_weight: bool) -> None:
    """Wraps vLLM's dispatch_cpu_unquantized_gemm (same signature): our linear where eligible (fp32: cpu_gemm_f32,
    bf16: cpu_gemv), else vLLM's function."""
    import torch

    from vllm import _custom_ops as ops
    from vllm.model_executor.layers import utils as utils_mod

    from vllm.config import get_current_vllm_config_or_none

    from vllm_dflash.ops.gemm_f32 import gemm_f32_supported, pack_f32_weight
    from vllm_dflash.ops.gemv import gemv_supported, pack_gemv_weight

    cfg = get_current_vllm_config_or_none()  # the engine whose model is loading
    if not acts("speedup", cfg):  # not an engine with our drafter (nor the opt-in): vLLM's own choice
        _ORIGINAL(layer, remove_weight)
        return
    rows = f32_rows(setting_for("cpu_gemm_f32", cfg))
    if rows > 0 and _eligible(layer, utils_mod, ops, torch.float32, gemm_f32_supported) and _install(
            layer, remove_weight, ops, rows, torch.ops.vllm_dflash.linear_f32, pack_f32_weight, "_dflash_gemm_f32"):
        _log_once_f32(rows)
        return
    rows = max_rows(setting_for("cpu_gemv", cfg), torch.get_num_threads())
    if rows > 0 and _eligible(layer, utils_mod, ops, torch.bfloat16, gemv_supported) and _install(
            layer, remove_weight, ops, rows, torch.ops.vllm_dflash.linear_bf16, pack_gemv_weight, "_dflash_gemv"):
        _log_once(rows)
        return
    _ORIGINAL(layer, remove_weight)


@functools.lru_cache(maxsize=None)
def _log_once(rows: int) -> None:
    logger.info("vllm_dflash: bf16 linear layers with <= %d rows run on the skinny-GEMM kernel (cpu_gemv), larger "
                "ones on vLLM's oneDNN GEMM", rows)


@functools.lru_cache(maxsize=None)
def _log_once_f32(rows: int) -> None:
    logger.info("vllm_dflash: float32 linear layers run on our AVX2 GEMM (cpu_gemm_f32) %s",
                "for every call" if rows >= NO_LIMIT
                else f"for calls with <= {rows} rows, larger ones on vLLM's oneDNN")


def apply() -> None:
    global _ORIGINAL
    from vllm.model_executor.layers import utils as utils_mod

    if getattr(utils_mod.dispatch_cpu_unquantized_gemm, "_vllm_dflash_patched", False):
        return
    _ORIGINAL = utils_mod.dispatch_cpu_unquantized_gemm
    dispatch._vllm_dflash_patched = True  # the ledger's mark: the seam check skips our wrapper
    # linear.py and vocab_parallel_embedding.py import it from the module inside process_weights_after_loading
    # (checked by the seam), so replacing the module attribute reaches every layer loaded after the plugin.
    utils_mod.dispatch_cpu_unquantized_gemm = dispatch


PATCH = Patch(
    symbol="vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm (CPU linear-layer GEMM choice)",
    why="oneDNN streams a bf16 weight far below the memory bandwidth for 1-8 rows (decode at low concurrency, the "
        "draft forward); with DFLASH_CPU_GEMV set such calls run on our AVX512-BF16 skinny GEMM. fp32 on AVX2-only "
        "CPUs (cpu_gemm_f32, auto): oneDNN needs 1.3-1.7x our AVX2 kernel's time at 1-64 rows, so a verify step "
        "costs far more than a decode step; ours also sums each row in one order (batch-invariant). Both off, the "
        "wrapper calls vLLM's function unchanged",
    removal="when vLLM's CPU linear reaches the memory bandwidth at decode-sized M (dev/studies/gemv.py and "
            "dev/studies/gemm_f32.py show `vllm` within 10% of `ours` at M=1 and M=8)",
    apply=apply,
    kind="speedup",
)
