# SPDX-License-Identifier: Apache-2.0
"""Patch: on CPU, a request without an adapter that shares a step with an adapter request gets an adapter anyway.

vLLM marks "no adapter" as slot index -1 in the punica wrapper's per-row indices. Its CPU kernels
(`vllm.lora.ops.torch_ops.bgmv_shrink / bgmv_expand / bgmv_expand_slice`, also under the sgmv_* ones) select the
adapter weights with `weights[indices]`, so -1 picks the LAST slot. When every slot holds an adapter (always with
vLLM's default max_loras=1 once one adapter has been used), the base model's rows in a mixed batch run through that
adapter: greedy outputs depend on what else is in the batch, and the KV they leave in the prefix cache is wrong
too (session 40: SmolLM2, float32, a batch of one adapter request and three base requests: two base outputs differ
from the same requests alone, with or without speculation; with max_loras=2, -1 lands on an empty slot and all
match). A step with no adapter request at all skips the kernels (`no_lora`), which is why it looks rare.

The fix: the rows whose index is -1 enter each kernel as zeros, so their LoRA delta is zero (shrink writes 0, expand
adds 0; the slice and embedding paths likewise). One multiply per LoRA kernel call, branch-free (traced by
torch.compile like the kernel itself).

It acts per engine: each punica wrapper (one per engine) is built while vLLM loads the model (its config current)
and records whether the fix acts there; the kernels are module functions, so each of the wrapper's methods that
reach them says, for the duration of the call, whose kernels run (in-process engines of one process run their steps
one at a time, on one thread).
"""
from __future__ import annotations

import functools

from vllm_dflash.integration.patches.base import Patch, current_acts

KERNELS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
# PunicaWrapperCPU's methods that LoRA layers call, each reaching the kernels only through itself
ENTRIES = ("add_shrink", "add_expand", "add_lora_embedding", "add_lora_linear", "add_lora_logits",
           "apply_lora_full_linear")
ATTR = "_vllm_dflash_no_adapter_fix"  # on a PunicaWrapperCPU: does its engine get the fix?
_CALL = {"on": False}  # during an ENTRIES call: does the calling wrapper's engine get the fix?


def no_adapter_rows_zeroed(inputs, lora_indices):
    """inputs (rows, in) with the rows whose adapter index is -1 set to 0; lora_indices (rows,) or (1,)."""
    keep = (lora_indices >= 0).to(inputs.dtype).unsqueeze(-1)  # (rows, 1) or (1, 1): broadcasts like the kernel
    return inputs * keep


def _wrap(kernel):
    def wrapped(inputs, lora_b_weights, output_tensor, lora_indices_tensor, *args, **kwargs):
        if _CALL["on"]:
            inputs = no_adapter_rows_zeroed(inputs, lora_indices_tensor)
        return kernel(inputs, lora_b_weights, output_tensor, lora_indices_tensor, *args, **kwargs)

    wrapped._vllm_dflash_patched = True
    wrapped.__name__ = kernel.__name__
    wrapped.__wrapped__ = kernel
    return wrapped


def apply() -> None:
    from vllm.lora.ops import torch_ops
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    cls = punica_cpu.PunicaWrapperCPU
    if getattr(cls.__init__, "_vllm_dflash_patched", False):
        return
    # the kernels are looked up as module globals: by the sgmv_* kernels in lora_ops, and by the wrapper's module,
    # which imported them by name from the package
    for name in KERNELS:
        wrapped = _wrap(getattr(lora_ops, name))
        for module in (lora_ops, torch_ops, punica_cpu):
            if hasattr(module, name):
                setattr(module, name, wrapped)
    orig_init = cls.__init__

    def __init__(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        setattr(self, ATTR, current_acts("fix"))

    __init__._vllm_dflash_patched = True
    cls.__init__ = __init__
    for name in ENTRIES:
        setattr(cls, name, _entry(getattr(cls, name)))


def _entry(method):
    """`method` of PunicaWrapperCPU with the kernels set, for the call, to its wrapper's engine (plain Python: a
    compiled model traces it, each engine's model with its own wrapper)."""
    @functools.wraps(method)
    def entry(self, *args, **kwargs):
        before = _CALL["on"]
        _CALL["on"] = getattr(self, ATTR, False)
        try:
            return method(self, *args, **kwargs)
        finally:
            _CALL["on"] = before

    return entry


PATCH = Patch(
    symbol="vllm.lora.punica_wrapper.punica_cpu.PunicaWrapperCPU (__init__ and its add_* / apply_* methods wrapped; "
           "vllm.lora.ops.torch_ops.bgmv_* replaced)",
    why="On CPU, vLLM's LoRA kernels index adapter weights with the row's slot index, and 'no adapter' (-1) picks the "
        "last slot: with every slot in use (max_loras=1 after one adapter request), base-model requests batched "
        "with adapter requests run through the adapter. Rows marked -1 enter the kernels as zeros, in the calls of "
        "a punica wrapper whose engine gets the fix (each wrapper records it when built).",
    removal="when vLLM's CPU LoRA kernels skip index -1; check with "
            "tests/vllm/test_vllm_lora.py::test_stock_vllm_applies_the_adapter_to_base_requests",
    apply=apply,
    kind="fix",
)
