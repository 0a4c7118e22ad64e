# SPDX-License-Identifier: Apache-2.0
import torch

from vllm_dflash.integration.cpu_sampling import expand_kernel_impl


def _loop_reference(x, cu, n, rf, rt):
    out, start = [], 0
    for v, end in zip(x.tolist(), cu.tolist()):
        out += [rt if v == rf else v] * (end - start)
        start = end
    return torch.tensor(out, dtype=x.dtype)[:n]


def test_expand_keeps_float_values_and_writes_in_place():
    temps = torch.tensor([1.5, -1.0, 0.7, 2.25], dtype=torch.float32)  # -1 = GREEDY_TEMPERATURE
    cu = torch.tensor([3, 3, 7, 8], dtype=torch.int32)
    out = torch.full((8,), float("nan"))
    expand_kernel_impl(out, temps, cu, -1.0, 1.0)
    assert torch.equal(out, _loop_reference(temps, cu, 8, -1.0, 1.0))
    assert out[0] == 1.5 and out[-1] == 2.25  # not truncated to integers


def test_expand_ints_and_empty():
    k = torch.tensor([5, 0, 9], dtype=torch.int32)
    cu = torch.tensor([1, 2, 4])
    out = torch.zeros(4, dtype=torch.int32)
    expand_kernel_impl(out, k, cu, 0, 7)
    assert out.tolist() == [5, 7, 9, 9]
    expand_kernel_impl(torch.zeros(0), torch.zeros(0), torch.zeros(0, dtype=torch.long), 0, 0)
