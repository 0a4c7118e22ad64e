# SPDX-License-Identifier: Apache-2.0
"""Patch: CPU torch.Generators have no offset; the runner rewinds seeded generators by offset."""
from __future__ import annotations

from vllm_dflash.integration.patches.base import Patch, acts_for


class _NoOffsetGenerator:
    """Proxy for a CPU torch.Generator: get/set_offset are no-ops (CPU generators have no offset)."""

    def __init__(self, gen):
        self._gen = gen

    def get_offset(self) -> int:
        return 0

    def set_offset(self, offset: int) -> None:
        pass

    def __getattr__(self, name):
        return getattr(self._gen, name)


def apply() -> None:
    from vllm.v1.worker import gpu_model_runner as gmr

    runner_cls = gmr.GPUModelRunner
    # its existence and the attributes the wrapper reads: checked by the seam (integration/seam.py) before any patch
    orig = runner_cls._bookkeeping_sync
    if getattr(orig, "_vllm_dflash_patched", False):
        return

    def _bookkeeping_sync(self, *args, **kwargs):
        batch = self.input_batch
        gens = batch.generators
        if self.device.type == "cpu" and gens and self.discard_request_mask.np[: batch.num_reqs].any() and \
                acts_for(self, "fix"):
            batch.generators = {k: _NoOffsetGenerator(g) for k, g in gens.items()}
            try:
                return orig(self, *args, **kwargs)
            finally:
                batch.generators = gens
        return orig(self, *args, **kwargs)

    _bookkeeping_sync._vllm_dflash_patched = True
    runner_cls._bookkeeping_sync = _bookkeeping_sync


PATCH = Patch(
    symbol="vllm.v1.worker.gpu_model_runner.GPUModelRunner._bookkeeping_sync",
    why="On CPU, a seeded request whose prefill is chunked crashes the engine: the runner rewinds the "
        "request's generator with get_offset()/set_offset(), which CPU torch.Generators do not support "
        "('RuntimeError: CPU Generator does not use offset'). We hand it no-op offsets on CPU; the "
        "discarded partial-prefill sample then advances the seeded stream (output still a valid sample).",
    removal="when vLLM rewinds CPU generators by state (or skips sampling for partial prefills); "
            "check with tests/vllm/test_vllm_patches.py without the patch",
    apply=apply,
    kind="fix",
)
