# SPDX-License-Identifier: Apache-2.0
"""The pieces of the LoRA fixes that need no engine. The prompt-logprobs fix (integration/patches/lora_prompt_logprobs.py):
where a slice of the step's hidden states starts, and the sampler indices set for its rows and put back afterwards.
The no-adapter fix (integration/patches/cpu_lora_no_adapter.py): rows marked -1 contribute nothing. The served fixes:
tests/vllm/test_vllm_lora.py."""
import torch

from vllm_dflash.integration.patches.cpu_lora_no_adapter import no_adapter_rows_zeroed
from vllm_dflash.integration.patches.lora_prompt_logprobs import row_offset, rows_mapped


def test_row_offset_of_slices():
    h = torch.randn(20, 8)
    assert row_offset(h[5:9], h) == 5
    assert row_offset(h[0:20], h) == 0
    part = h[3:15]  # the runner passes hidden_states[:num_scheduled_tokens]; offsets are relative to it
    assert row_offset(part[4:6], part) == 4


def test_row_offset_refuses_what_is_not_a_row_slice():
    h = torch.randn(20, 8)
    assert row_offset(torch.randn(4, 8), h) is None  # another tensor
    assert row_offset(h[2:6, :4], h) is None  # columns cut: not whole rows
    assert row_offset(h.t(), h) is None  # transposed view
    assert row_offset(h[18:20], h[:10]) is None  # past the end of the given rows


class _Wrapper:
    """The punica wrapper's index buffers (PunicaWrapperBase: buffers of max_num_batched_tokens, lengths)."""

    def __init__(self, tokens, sampled):
        self._token_lora_indices = torch.full((32,), 7, dtype=torch.long)
        self._token_lora_indices[: len(tokens)] = torch.tensor(tokens)
        self._sampler_indices = torch.full((32,), 9, dtype=torch.long)
        self._sampler_indices[: len(sampled)] = torch.tensor(sampled)
        self.indices_len = [len(tokens), len(sampled), len(sampled), len(tokens)]

    @property
    def token_lora_indices(self):
        return self._token_lora_indices[: self.indices_len[0]]

    @property
    def sampler_indices(self):
        return self._sampler_indices[: self.indices_len[1]]


def test_rows_mapped_sets_and_restores():
    w = _Wrapper(tokens=[0, 0, 0, -1, -1, 1, 1], sampled=[0, -1, 1])
    with rows_mapped([w], 3, 4):
        assert w.sampler_indices.tolist() == [-1, -1, 1, 1]
    assert w.sampler_indices.tolist() == [0, -1, 1]
    assert w._sampler_indices[3].item() == 9  # the buffer past the old length is back too


def test_rows_mapped_restores_after_an_error_and_skips_short_maps():
    w = _Wrapper(tokens=[2, 2, 2], sampled=[2])
    try:
        with rows_mapped([w], 0, 3):
            raise ValueError
    except ValueError:
        pass
    assert w.sampler_indices.tolist() == [2]
    with rows_mapped([w], 2, 5):  # rows past the step's tokens: no map for them, left untouched
        assert w.sampler_indices.tolist() == [2]


def _bgmv(inputs, weights, indices):
    """vLLM's CPU kernel in miniature: each row times its adapter's weights (weights[-1]: the last slot)."""
    return torch.einsum("bi, boi -> bo", inputs, weights[indices])


def test_no_adapter_rows_contribute_nothing():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=g)
    w = torch.randn(1, 3, 6, generator=g)  # max_loras=1: slot 0 holds the adapter
    idx = torch.tensor([0, -1, 0, -1])
    leaky = _bgmv(x, w, idx)
    assert leaky[1].abs().sum() > 0  # the bug: -1 selects the last slot, the adapter
    fixed = _bgmv(no_adapter_rows_zeroed(x, idx), w, idx)
    assert torch.equal(fixed[[1, 3]], torch.zeros(2, 3))
    assert torch.equal(fixed[[0, 2]], leaky[[0, 2]])  # adapter rows untouched


def test_no_adapter_rows_zeroed_broadcasts_one_index():
    x = torch.randn(5, 6)
    assert torch.equal(no_adapter_rows_zeroed(x, torch.tensor([-1])), torch.zeros(5, 6))
    assert torch.equal(no_adapter_rows_zeroed(x, torch.tensor([0])), x)
