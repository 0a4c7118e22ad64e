# SPDX-License-Identifier: Apache-2.0
"""The reference loop is lossless: greedy equals plain greedy; sampling keeps the target distribution."""
import collections
import random

import pytest
import torch

from support.stats import chi2_two_sample_pvalue
from vllm_dflash import reference as ref_mod
from vllm_dflash.model import DFlashDraftModel
from vllm_dflash.reference import ReferenceDecoder, greedy_generate
from vllm_dflash.sampling import SamplingParams

PROMPT = list(range(5, 25))


class OracleDraft(DFlashDraftModel):
    """Proposes the known greedy continuation, corrupted with probability `noise` per token, so that
    acceptance lengths vary over the whole 0..B-1 range and every commit path is exercised."""

    def setup(self, truth, noise, seed=0):
        self.truth, self.noise, self.rng = truth, noise, random.Random(seed)
        return self

    def draft_block(self, anchor, start_pos, ctx_kv, *, block_size=None, **kw):
        B = block_size or self.config.block_size
        s = int(start_pos[0])
        out = []
        for p in range(s + 1, s + B):
            t = self.truth[p] if p < len(self.truth) else 0
            out.append(self.rng.randrange(self.config.vocab_size) if self.rng.random() < self.noise else t)
        return torch.tensor([out])


def _draft(tiny_dir, b, target, cls=DFlashDraftModel):
    return cls.from_pretrained(tiny_dir / f"draft-b{b}", target=target)


@pytest.mark.parametrize("block_size", [1, 4, 8, 16])
@pytest.mark.parametrize("steps", [1, 2])
def test_greedy_equals_plain_greedy(tiny_dir, tiny_target, block_size, steps):
    expected = greedy_generate(tiny_target, PROMPT, 48)
    draft = None if block_size == 1 else _draft(tiny_dir, block_size, tiny_target)
    res = ReferenceDecoder(tiny_target, draft, block_size=block_size, diffusion_steps=steps).generate(PROMPT, max_new_tokens=48)
    assert res.token_ids == expected
    assert res.finish_reason == "length" and len(res.token_ids) == 48


@pytest.mark.parametrize("block_size", [4, 8, 16])
@pytest.mark.parametrize("noise", [0.0, 0.15, 0.5])
def test_greedy_with_accepting_draft(tiny_dir, tiny_target, block_size, noise):
    expected = greedy_generate(tiny_target, PROMPT, 60)
    draft = _draft(tiny_dir, block_size, tiny_target, OracleDraft).setup(PROMPT + expected, noise)
    res = ReferenceDecoder(tiny_target, draft).generate(PROMPT, max_new_tokens=60)
    assert res.token_ids == expected
    st = res.stats
    assert st.num_accepted > 0 and sum(st.histogram) == st.num_steps
    if noise == 0.0:  # a perfect draft commits whole blocks (the last step may run past the truth)
        assert st.histogram[-1] >= st.num_steps - 1
    assert st.acceptance_length == pytest.approx(1 + st.num_accepted / st.num_steps)


@pytest.mark.parametrize("max_new", [1, 2, 5, 7, 13])
def test_max_new_tokens_inside_block(tiny_dir, tiny_target, max_new):
    expected = greedy_generate(tiny_target, PROMPT, 40)
    draft = _draft(tiny_dir, 8, tiny_target, OracleDraft).setup(PROMPT + expected, 0.0)
    res = ReferenceDecoder(tiny_target, draft).generate(PROMPT, max_new_tokens=max_new)
    assert res.token_ids == expected[:max_new] and res.finish_reason == "length"


def test_stop_token_inside_block(tiny_dir, tiny_target):
    expected = greedy_generate(tiny_target, PROMPT, 40)
    stop_tok = expected[10]  # lands inside an accepted block of 8
    first = expected.index(stop_tok)
    draft = _draft(tiny_dir, 8, tiny_target, OracleDraft).setup(PROMPT + expected, 0.0)
    res = ReferenceDecoder(tiny_target, draft).generate(PROMPT, max_new_tokens=40, stop_token_ids=[stop_tok])
    assert res.token_ids == expected[: first + 1] and res.finish_reason == "stop"
    assert greedy_generate(tiny_target, PROMPT, 40, stop_token_ids=[stop_tok]) == res.token_ids


# ----------------------------------------------------------------------------- sampling
SAMPLING = SamplingParams(temperature=0.25, top_k=20, top_p=0.95)
N_SAMPLES = 700


def _samples(decoder, n, seed0):
    c = collections.Counter()
    for s in range(n):
        r = decoder.generate(PROMPT, max_new_tokens=3, sampling=SamplingParams(**{**SAMPLING.__dict__, "seed": seed0 + s}))
        c[tuple(r.token_ids)] += 1
    return c


@pytest.fixture(scope="module")
def sampling_setup(tiny_dir, tiny_target):
    greedy = greedy_generate(tiny_target, PROMPT, 8)
    plain = ReferenceDecoder(tiny_target, None, block_size=1)
    baseline = _samples(plain, N_SAMPLES, 0)
    # The oracle proposes the greedy path: often right at temperature 0.25, so drafts are accepted
    # and rejected in every position; the committed tokens must still follow the target distribution.
    draft = _draft(tiny_dir, 4, tiny_target, OracleDraft).setup(PROMPT + greedy, 0.0)
    return baseline, ReferenceDecoder(tiny_target, draft)


def test_sampling_keeps_target_distribution(sampling_setup):
    baseline, spec = sampling_setup
    got = _samples(spec, N_SAMPLES, 10_000)
    p = chi2_two_sample_pvalue(baseline, got)
    assert p > 1e-3, f"speculative sampling changed the output distribution (p={p:.2e})"


def test_sampling_test_detects_a_wrong_verifier(sampling_setup, monkeypatch):
    """Negative control: accepting every draft (a classic bug) must be caught by the same test."""
    baseline, spec = sampling_setup

    def accept_all(drafts, logits, params, gen):
        return drafts.shape[0], int(torch.multinomial(torch.softmax(logits[-1].float() / params.temperature, -1), 1, generator=gen))

    monkeypatch.setattr(ref_mod, "sample_verify", accept_all)
    got = _samples(spec, N_SAMPLES, 10_000)
    assert chi2_two_sample_pvalue(baseline, got) < 1e-3
