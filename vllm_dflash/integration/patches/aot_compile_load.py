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


def apply() -> None:
    from vllm.compilation import decorators

    # its existence and the source it relies on: checked by the seam (integration/seam.py) before any patch
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
        "A compiled function without finalize_loading gets a no-op one while vLLM loads it.",
    removal="when vLLM loads Inductor bundles (checks hasattr before finalize_loading); check with "
            "tests/vllm/test_vllm_compile_cache.py::test_stock_vllm_compiles_again",
    apply=apply,
    kind="fix",
)
