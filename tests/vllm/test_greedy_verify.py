# SPDX-License-Identifier: Apache-2.0
"""integration/greedy_verify.py against its reference, vLLM's own `RejectionSampler.forward` (the unwrapped
original), on the same logits: random, tied, bf16 and float32, requests with 0..7 drafts whose acceptance ends at
every position. The engine-level check (the wrapper runs in a real engine and greedy output equals no speculation) is
tests/vllm/test_vllm_patches.py::test_steps_without_drafts_sample_plainly."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from vllm_dflash.integration import greedy_verify as G


@pytest.fixture(scope="module")
def sampler():
    from vllm.platforms import current_platform
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    from vllm_dflash.integration.patches import cpu_greedy_verify

    current_platform.register_triton_kernel_overrides()  # what the CPU worker does before its first step
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    before, sample = RejectionSampler.forward, CPUModelRunner._sample
    cpu_greedy_verify.apply()  # this patch only (the wrapper; vLLM's forward stays as __wrapped__), undone after:
    try:  # the other patches would change what later tests in this process read of vLLM (tests/vllm/test_seam.py)
        yield RejectionSampler(Sampler())
    finally:
        RejectionSampler.forward, CPUModelRunner._sample = before, sample


def _metadata(draft_lists: list[list[int]]):
    """SpecDecodeMetadata laid out as the runner lays it out: per request its draft rows, then its bonus row."""
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    md = SpecDecodeMetadata.make_dummy(draft_lists, torch.device("cpu"))
    target, bonus, row = [], [], 0
    for d in draft_lists:
        target += list(range(row, row + len(d)))
        bonus.append(row + len(d))
        row += len(d) + 1
    return dataclasses.replace(md, target_logits_indices=torch.tensor(target, dtype=torch.int32),
                               bonus_logits_indices=torch.tensor(bonus, dtype=torch.int32),
                               logits_indices=torch.arange(row, dtype=torch.int32))


def _greedy_metadata(batch: int, **changes):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    sm = SamplingMetadata(temperature=None, all_greedy=True, all_random=False, top_p=None, top_k=None, generators={},
                          max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
                          frequency_penalties=torch.zeros(batch), presence_penalties=torch.zeros(batch),
                          repetition_penalties=torch.ones(batch), output_token_ids=[[] for _ in range(batch)],
                          allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())
    return dataclasses.replace(sm, **changes)


def _case(rng: np.random.Generator, batch: int, vocab: int, dtype: torch.dtype, ties: bool):
    """Random logits; each request's drafts copy the target's argmax for a random prefix, then differ."""
    nums = rng.integers(0, 8, size=batch).tolist()
    nums[0] = max(nums[0], 1)  # a step the runner verifies has at least one draft
    rows = sum(nums) + batch
    if ties:  # few distinct values: many exact ties, so the first-index rule decides
        logits = torch.from_numpy(rng.integers(0, 3, size=(rows, vocab)).astype(np.float32)).to(dtype)
    else:
        logits = torch.from_numpy(rng.standard_normal((rows, vocab)).astype(np.float32)).to(dtype)
    am = logits.float().argmax(-1).tolist()
    drafts, row = [], 0
    for n in nums:
        keep = int(rng.integers(0, n + 1))  # drafts 1..keep equal the target's choice
        d = [am[row + j] if j < keep else (am[row + j] + 1 + int(rng.integers(0, vocab - 1))) % vocab
             for j in range(n)]
        drafts.append(d)
        row += n + 1
    return drafts, logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("ties", [False, True])
def test_output_equals_vllm_rejection_sampler(sampler, dtype, ties):
    """Token for token (and placeholder for placeholder) the tensor vLLM's rejection sampler returns."""
    orig = type(sampler).forward.__wrapped__  # vLLM's forward
    rng = np.random.default_rng(7 + ties)
    for batch in (1, 3, 8, 32):
        for _ in range(5):
            drafts, logits = _case(rng, batch, 512, dtype, ties)
            md, sm = _metadata(drafts), _greedy_metadata(batch)
            assert G.eligible(sm)
            want = orig(sampler, md, None, logits.clone(), sm).sampled_token_ids
            got = G.greedy_verify(md, logits.clone())
            assert got.dtype == want.dtype == torch.int32 and got.shape == want.shape
            assert torch.equal(got, want), (drafts, got, want)


def test_wrapper_takes_the_fast_path_only_when_eligible(sampler):
    """The installed wrapper counts its fast steps; a batch that asks for logprobs goes to vLLM's forward."""
    assert getattr(type(sampler).forward, "_vllm_dflash_patched", False)
    rng = np.random.default_rng(3)
    drafts, logits = _case(rng, 4, 256, torch.float32, False)
    md = _metadata(drafts)
    before = getattr(sampler, "_vllm_dflash_greedy_steps", 0)
    sampler._vllm_dflash_on = False  # its runner's engine has neither our drafter nor the opt-in: vLLM's forward
    sampler(md, None, logits.clone(), _greedy_metadata(4))
    assert getattr(sampler, "_vllm_dflash_greedy_steps", 0) == before
    sampler._vllm_dflash_on = True  # set by the runner (CPUModelRunner._sample wrapper) for such an engine
    fast = sampler(md, None, logits.clone(), _greedy_metadata(4))
    assert sampler._vllm_dflash_greedy_steps == before + 1
    slow = sampler(md, None, logits.clone(), _greedy_metadata(4, max_num_logprobs=0))
    assert sampler._vllm_dflash_greedy_steps == before + 1  # not taken
    assert torch.equal(fast.sampled_token_ids, slow.sampled_token_ids) and slow.logprobs_tensors is not None


def test_eligibility_names_every_condition():
    """Each thing the greedy path would apply to the logits makes the batch ineligible."""
    from vllm.v1.sample.logits_processor.builtin import LogitBiasLogitsProcessor, MinTokensLogitsProcessor
    from vllm.v1.sample.logits_processor import LogitsProcessors

    assert G.eligible(_greedy_metadata(2))
    assert not G.eligible(_greedy_metadata(2), synthetic_mode=True)
    for change in ({"all_greedy": False}, {"max_num_logprobs": 0}, {"logprob_token_ids": {0: [1]}},
                   {"no_penalties": False}, {"allowed_token_ids_mask": torch.zeros(2, 8, dtype=torch.bool)},
                   {"bad_words_token_ids": {0: [[1]]}}):
        assert not G.eligible(_greedy_metadata(2, **change)), change

    class Custom:  # an unknown argmax-changing processor: cannot tell whether it is active
        def is_argmax_invariant(self):
            return False

    bias = LogitBiasLogitsProcessor.__new__(LogitBiasLogitsProcessor)
    bias.biases = {}
    mint = MinTokensLogitsProcessor.__new__(MinTokensLogitsProcessor)
    mint.min_toks = {}
    assert G.eligible(_greedy_metadata(2, logitsprocs=LogitsProcessors([bias, mint])))  # builtins, unused
    bias.biases = {0: {5: 1.0}}
    assert not G.eligible(_greedy_metadata(2, logitsprocs=LogitsProcessors([bias, mint])))
    assert not G.eligible(_greedy_metadata(2, logitsprocs=LogitsProcessors([Custom()])))


def test_greedy_accept_rule():
    """The rule by hand: accepted prefix, then the correction; all accepted: then the bonus; no drafts: the bonus."""
    draft = np.array([5, 6, 7, 1, 2, 9], dtype=np.int64)
    target = np.array([5, 6, 8, 1, 2, 9], dtype=np.int64)  # request 0 rejects its 3rd draft; request 2 accepts all
    bonus = np.array([40, 41, 42], dtype=np.int64)
    out = G.greedy_accept(draft, target, bonus, np.array([3, 0, 3]), 3)
    assert out.tolist() == [[5, 6, 8, -1], [41, -1, -1, -1], [1, 2, 9, 42]]
