# SPDX-License-Identifier: Apache-2.0
"""Probabilistic drafting without vLLM: the draft's q per request (temperature, top-k, top-p) == the target's
processing row by row; draws follow q (chi-square) and never hit a zero-probability token; the verifier's [B, K, V]
buffer equals a dense rebuild after any sequence of builds (q cells, one-hot cells, stale one-hots cleared); q that
was really sampled from keeps rejection sampling lossless (chi-square, and the same test flags a q other than the one
the token was drawn from); sampled requests are planned from sampled requests' acceptance, not greedy ones'."""
import collections

import numpy as np
import pytest
import torch

from support.stats import chi2_two_sample_pvalue
from vllm_dflash.adaptive.policy import AcceptanceModel
from vllm_dflash.integration.draft_probs import DraftProbs
from vllm_dflash.sampling import SamplingParams, draft_distribution, sample_rows, target_probs


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.7, 0, 1.0), (1.0, 5, 1.0), (0.7, 0, 0.8), (1.3, 7, 0.9)])
def test_draft_distribution_equals_target_processing(temperature, top_k, top_p):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 40, generator=g) * 3
    V = logits.shape[-1]
    q = draft_distribution(logits, torch.full((6,), temperature), torch.full((6,), top_k or V) if top_k else None,
                           torch.full((6,), top_p) if top_p < 1 else None)
    ref = target_probs(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    assert torch.allclose(q, ref, atol=1e-6) and torch.allclose(q.sum(-1), torch.ones(6))


def test_draft_distribution_per_row_parameters():
    """Rows with different temperatures / top-k / top-p (a mixed batch) each get their own processing; a top-k at
    or above the vocabulary (vLLM's 'off') is off."""
    logits = torch.randn(3, 30, generator=torch.Generator().manual_seed(1)) * 2
    q = draft_distribution(logits, torch.tensor([0.5, 1.0, 2.0]), torch.tensor([3, 30, 1000]),
                           torch.tensor([1.0, 0.5, 1.0]))
    for i, sp in enumerate([SamplingParams(0.5, top_k=3), SamplingParams(1.0, top_p=0.5), SamplingParams(2.0)]):
        assert torch.allclose(q[i], target_probs(logits[i], sp), atol=1e-6)


def test_sample_rows_follows_q():
    g = torch.Generator().manual_seed(2)
    q = torch.softmax(torch.randn(12, generator=g) * 1.5, -1)
    q[3] = 0.0  # a zero-probability token is never drawn
    q = q / q.sum()
    n = 20000
    got = sample_rows(q.expand(n, -1), torch.rand(n, dtype=torch.float64, generator=g))
    assert (got != 3).all()
    ref = torch.multinomial(q, n, replacement=True, generator=g)
    p = chi2_two_sample_pvalue(collections.Counter(got.tolist()), collections.Counter(ref.tolist()))
    assert p > 1e-3, p
    edge = sample_rows(q[None], torch.tensor([1 - 2 ** -53], dtype=torch.float64))  # the top of the CDF
    assert q[edge].item() > 0


def test_draft_probs_buffer_equals_dense_rebuild():
    """Three builds of the persistent buffer (q cells, one-hot cells in and outside the draft vocabulary, a cell
    switching from one-hot to q and back, a q cell left out of the next build, a growing batch): the whole buffer
    equals the dense tensor of that build alone -- q and one-hot where the build names them, zero everywhere else,
    nothing left from an earlier build (what vLLM's runner reads for a request with drafts)."""
    K, V = 3, 20
    ids = torch.tensor([0, 2, 5, 7, 11, 13])  # target ids of the 6 draft ids
    buf = DraftProbs(K, V, ids)
    g = torch.Generator().manual_seed(3)
    builds = [(2, [0, 1, 4], [2, 5]), (2, [2, 5], [0, 1, 3]), (3, [0, 3, 8], [1, 6]), (3, [], [2, 4])]
    for B, q_cells, hot_cells in builds:
        q = torch.softmax(torch.randn(len(q_cells), len(ids), generator=g), -1)
        hot = torch.randint(0, V, (len(hot_cells),), generator=g)
        out = buf.build(B, torch.tensor(q_cells, dtype=torch.long), q, torch.tensor(hot_cells), hot)
        assert out.shape == (B, K, V)
        want = torch.zeros(buf.buf.shape[0] * K, V)
        for c, row in zip(q_cells, q):
            want[c] = torch.zeros(V).index_copy(0, ids, row)
        for c, t in zip(hot_cells, hot.tolist()):
            want[c] = torch.nn.functional.one_hot(torch.tensor(t), V).float()
        assert torch.equal(buf.buf.reshape(-1, V), want), (q_cells, hot_cells)
    with pytest.raises(ValueError, match="vocab_size"):
        DraftProbs(K, 10, ids)


@pytest.mark.parametrize("ids, match", [([0, 2, 2, 7], "one-to-one"), ([0, -1, 5], "< 0")])
def test_draft_probs_refuses_a_malformed_d2t_map(ids, match):
    """A d2t map with a duplicate target id (q over target ids would merge two draft ids: the verifier would read a
    q other than the one the draft was drawn from) or a negative one (indexes from the end) is refused, the fix named."""
    with pytest.raises(ValueError, match=match) as e:
        DraftProbs(2, 20, torch.tensor(ids))
    assert "re-export the draft" in str(e.value)


def _verify(p: torch.Tensor, q_true: torch.Tensor, q_told: torch.Tensor, g: torch.Generator) -> int:
    """One slot of vLLM's rejection rule: draft x ~ q_true, the verifier reads q_told. -> the committed token."""
    x = int(torch.multinomial(q_true, 1, generator=g))
    if q_told[x] > 0 and torch.rand((), generator=g) < min(1.0, float(p[x] / q_told[x])):
        return x
    residual = torch.clamp(p - q_told, min=0)
    return int(torch.multinomial(residual / residual.sum(), 1, generator=g))


def test_sampled_q_is_lossless_and_a_mismatched_q_is_caught():
    """x ~ q verified with q: the target's distribution. With one-hot q at x: also the target's (one-hot
    verification is lossless whatever chose x, which is why greedy drafts are; it only accepts less). With a q that
    is not the one x was drawn from (sharpened: q^2, renormalised): detectably not."""
    g = torch.Generator().manual_seed(4)
    p = torch.softmax(torch.randn(8, generator=g) * 1.5, -1)  # the target's processed distribution
    q = torch.softmax(torch.randn(8, generator=g) * 1.5, -1)  # the draft's
    n = 6000
    target = collections.Counter(torch.multinomial(p, n, replacement=True, generator=g).tolist())
    right = collections.Counter(_verify(p, q, q, g) for _ in range(n))
    assert chi2_two_sample_pvalue(target, right) > 1e-3
    one_hot = collections.Counter()
    for _ in range(n):
        x = int(torch.multinomial(q, 1, generator=g))
        told = torch.nn.functional.one_hot(torch.tensor(x), 8).float()
        one_hot[_verify(p, told, told, g)] += 1
    assert chi2_two_sample_pvalue(target, one_hot) > 1e-3
    sharp = q ** 2 / (q ** 2).sum()
    wrong = collections.Counter(_verify(p, q, sharp, g) for _ in range(n))
    assert chi2_two_sample_pvalue(target, wrong) < 1e-3


def test_sampled_requests_use_sampled_rates():
    """Greedy requests accept everything, sampled ones nothing: a new sampled request starts from the sampled
    pool's rate (low), a new greedy one from the greedy pool's (high); `forget` drops the mark."""
    a = AcceptanceModel(4)
    a.mark_sampled(["g", "s"], [False, True])
    for _ in range(50):
        a.observe("g", "dflash", 4, 4)
        a.observe("s", "dflash", 4, 0)
    a.mark_sampled(["g2", "s2"], [False, True])
    assert a.rates("s2", "dflash")[0] < 0.2 < 0.9 < a.rates("g2", "dflash")[0]
    batch = a.rates_batch(["g2", "s2", "s"], "dflash")
    assert np.allclose(batch[0], a.rates("g2", "dflash")) and np.allclose(batch[1], a.rates("s2", "dflash"))
    assert np.allclose(batch[2], a.rates("s", "dflash"))
    a.forget("s2")
    assert "s2" not in a.sampled
