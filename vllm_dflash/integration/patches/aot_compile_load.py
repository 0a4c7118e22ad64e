# SPDX-License-Identifier: Apache-2.0
"""Patch: vLLM's compile cache never loads on CPU, so every server start compiles the model again.

vLLM saves each compiled model (VLLM_USE_AOT_COMPILE, on by default) and loads it at the next start in
`vllm.compilation.decorators._try_load_aot_compiled_fn`, which calls `finalize_loading` on the loaded artifact's
compiled function. That method exists on vLLM's own `VllmSerializableFunction` (its piecewise backend, built lazily)
but not on the Inductor bundle torch returns for the CPU backend (`BundledAOTAutogradSerializableCallable`, complete
once deserialised). The load raises `'function' object has no attribute 'finalize_loading'`, vLLM logs "Compiling
model again due to a load failure" and compiles from scratch: on a 2-core CPU the SmolLM2 engine took 43 s to build
instead of 10 s (session 40 probe, warm Inductor cache both times).

The fix: while vLLM loads an artifact, a compiled function without `finalize_loading` gets one that does nothing
(nothing is left to finalise for it); everything else, the guard and source checks included, is vLLM's.

Once artifacts load, their key must cover what the plugin changes in the traced graph. vLLM's key
(`aot_compile_hash_factors(vllm_config)`, the folder under VLLM_CACHE_ROOT/torch_compile_cache/torch_aot_compile/)
holds the config (`additional_config` too, our per-deployment settings) and vLLM's own environment variables, but
not our process settings DFLASH_CPU_GEMM_F32, DFLASH_CPU_GEMV and DFLASH_VLLM_EXTRAS, read in the process that loads
the model, which decide whether a CPU linear layer runs vLLM's oneDNN closure or our packed-weight op (cpu_gemv.py,
which also drops `layer.weight`). Without them a DFlash start on oneDNN after one on our fp32 GEMM loaded the other's
graph and failed at its first forward (IndexError in the compiled forward). Where our op runs, the wrapped
`aot_compile_hash_factors` appends `linear_routing`, computed in the process that compiles as cpu_gemv's `dispatch`
decides there; an engine on vLLM's own GEMM keeps vLLM's key.
"""
from __future__ import annotations

from contextlib import contextmanager

from vllm_dflash.integration.patches.base import Patch, acts


def _noop_finalize(vllm_config) -> None:  # the Inductor bundle is complete once deserialised
    return None


@contextmanager
def finalizable_loads():
    """Inside: `torch.compiler.load_compiled_function` returns artifacts whose compiled function has
    `finalize_loading` (a no-op where torch's artifact lacks it)."""
    import torch

    orig = torch.compiler.load_compiled_function

    def load_compiled_function(*args, **kwargs):
        loaded = orig(*args, **kwargs)
        fn = getattr(getattr(loaded, "_artifacts", None), "compiled_fn", None)
        if fn is not None and not hasattr(fn, "finalize_loading"):
            fn.finalize_loading = _noop_finalize
        return loaded

    torch.compiler.load_compiled_function = load_compiled_function
    try:
        yield
    finally:
        torch.compiler.load_compiled_function = orig


def linear_routing(vllm_config) -> str | None:
    """Our CPU linear routing in the engine of `vllm_config` as cpu_gemv's `dispatch` decides it in this process: the
    row limits of our fp32 and bf16 ops (0: that dtype stays on vLLM's GEMM). None: every layer on vLLM's GEMM."""
    from vllm_dflash.integration.patches import cpu_gemv
    from vllm_dflash.integration.patches.base import setting_for
    from vllm_dflash.ops.gemm_f32 import gemm_f32_supported
    from vllm_dflash.ops.gemv import gemv_supported

    device = getattr(getattr(vllm_config, "device_config", None), "device_type", None)
    if device != "cpu" or not acts("speedup", vllm_config):
        return None
    import torch

    f32 = cpu_gemv.f32_rows(setting_for("cpu_gemm_f32", vllm_config)) if gemm_f32_supported() else 0
    bf16 = cpu_gemv.max_rows(setting_for("cpu_gemv", vllm_config), torch.get_num_threads()) if gemv_supported() else 0
    if f32 <= 0 and bf16 <= 0:
        return None
    return f"vllm_dflash cpu linear: f32 rows {f32}, bf16 rows {bf16}"


def with_routing(orig):
    """`aot_compile_hash_factors` with `linear_routing` appended where our op runs."""

    def aot_compile_hash_factors(vllm_config) -> list[str]:
        factors = orig(vllm_config)
        routing = linear_routing(vllm_config)
        return factors if routing is None else [*factors, routing]

    aot_compile_hash_factors._vllm_dflash_patched = True
    return aot_compile_hash_factors


def apply() -> None:
    from vllm.compilation import caching, decorators

    # their existence and the source they rely on: checked by the seam (integration/seam.py) before any patch
    if not getattr(caching.aot_compile_hash_factors, "_vllm_dflash_patched", False):
        # the compiled model's __call__ imports it from the module at call time: the module attribute reaches it
        caching.aot_compile_hash_factors = with_routing(caching.aot_compile_hash_factors)
    orig = decorators._try_load_aot_compiled_fn
    if getattr(orig, "_vllm_dflash_patched", False):
        return

    def _try_load_aot_compiled_fn(model, aot_compilation_path):
        if not acts("fix", getattr(model, "vllm_config", None)):
            return orig(model, aot_compilation_path)
        with finalizable_loads():
            return orig(model, aot_compilation_path)

    _try_load_aot_compiled_fn._vllm_dflash_patched = True
    decorators._try_load_aot_compiled_fn = _try_load_aot_compiled_fn


PATCH = Patch(
    symbol="vllm.compilation.decorators._try_load_aot_compiled_fn",
    why="On CPU vLLM's saved compile artifact never loads (it calls finalize_loading, which torch's Inductor bundle "
        "lacks), so every server start compiles the model from scratch (SmolLM2 on 2 cores: 43 s instead of 10 s). "
        "A compiled function without finalize_loading gets a no-op one while vLLM loads it. The key of a saved "
        "artifact (vllm.compilation.caching.aot_compile_hash_factors, wrapped) gets our CPU linear routing "
        "(DFLASH_CPU_GEMM_F32 / DFLASH_CPU_GEMV / DFLASH_VLLM_EXTRAS), so no start loads a graph traced for another.",
    removal="when vLLM loads Inductor bundles (checks hasattr before finalize_loading); check with "
            "tests/vllm/test_vllm_compile_cache.py::test_stock_vllm_compiles_again",
    apply=apply,
    kind="fix",
)
