# SPDX-License-Identifier: Apache-2.0
"""The all-sampled rejection sampling of integration/sampled_verify.py (the CPU patch cpu_sampled_verify), without
vLLM: its output follows the target's distribution at every position whatever drafted the tokens (chi-square on a
batch of 6000 requests: drafts drawn from q and verified with q, deterministic drafts verified without
probabilities), and the same test catches a q other than the one the drafts were drawn from; the output layout is
vLLM's (accepted drafts, then the recovered or bonus token, -1 after); masked tokens are never recovered; seeded
generators reproduce their requests."""
import collections

import torch

from support.stats import chi2_two_sample_pvalue
from vllm_dflash.integration.sampled_verify import PLACEHOLDER_TOKEN_ID, rejection_sample_sampled

V, K, N = 8, 2, 6000


def _dists(seed: int):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(K, V, generator=g) * 1.5  # the target's processed logits at each of the K positions
    q = torch.softmax(torch.randn(K, V, generator=g) * 1.5, -1)  # [K, V] the draft's distribution per position
    return g, logits, q


def _run(g, logits, drafts, told):
    """N requests of K drafts each: drafts [N, K], told [N * K, V] or None."""
    num = [K] * N
    bonus = torch.multinomial(torch.softmax(logits[-1], -1), N, replacement=True, generator=g).view(N, 1)
    return rejection_sample_sampled(drafts.reshape(-1), num, K, told, logits.repeat(N, 1), bonus, {},
                                    lambda: torch.rand(N * K, dtype=torch.float64, generator=g))


def _check_positions(out, logits, g, expect_same: bool):
    """Position 0 of every request, and position 1 of those that accepted their first draft, against samples of p."""
    p = torch.softmax(logits, -1)
    got0 = collections.Counter(out[:, 0].tolist())
    ref0 = collections.Counter(torch.multinomial(p[0], N, replacement=True, generator=g).tolist())
    pv0 = chi2_two_sample_pvalue(got0, ref0)
    if not expect_same:
        return pv0
    assert pv0 > 1e-3, pv0
    second = out[:, 1][out[:, 1] != PLACEHOLDER_TOKEN_ID]
    assert len(second) > 500
    ref1 = collections.Counter(torch.multinomial(p[1], len(second), replacement=True, generator=g).tolist())
    assert chi2_two_sample_pvalue(collections.Counter(second.tolist()), ref1) > 1e-3
    return pv0


def test_drafts_from_q_verified_with_q_follow_the_target():
    g, logits, q = _dists(1)
    drafts = torch.stack([torch.multinomial(q[j], N, replacement=True, generator=g) for j in range(K)], 1)  # [N, K]
    out = _run(g, logits, drafts, q.repeat(N, 1))
    _check_positions(out, logits, g, expect_same=True)


def test_one_hot_drafts_without_probabilities_follow_the_target():
    g, logits, q = _dists(2)
    drafts = logits.argmax(-1).repeat(N, 1)  # [N, K] a deterministic proposal (prompt lookup, greedy DFlash)
    out = _run(g, logits, drafts, None)
    _check_positions(out, logits, g, expect_same=True)


def test_a_q_other_than_the_drafts_is_caught():
    """Control: drafts drawn from q but verified with a sharpened q (not the one they came from) are not the
    target's distribution, and the same check says so."""
    g, logits, q = _dists(3)
    drafts = torch.stack([torch.multinomial(q[j], N, replacement=True, generator=g) for j in range(K)], 1)
    sharp = q ** 3 / (q ** 3).sum(-1, keepdim=True)
    out = _run(g, logits, drafts, sharp.repeat(N, 1))
    assert _check_positions(out, logits, g, expect_same=False) < 1e-3


def test_layout_bonus_and_placeholders():
    """Accepted drafts, then one recovered or bonus token, -1 after; a request with fewer drafts than the longest
    is laid out in its own row; all accepted: the bonus token."""
    logits = torch.full((3, V), -30.0)
    logits[:, 5] = 30.0  # the target is sure of token 5 at every position
    drafts = torch.tensor([5, 5, 3])  # request 0: [5, 5] (both accepted), request 1: [3] (rejected)
    out = rejection_sample_sampled(drafts, [2, 1], 2, None, logits, torch.tensor([[7], [7]]), {},
                                   lambda: torch.full((3,), 0.5, dtype=torch.float64))
    assert out.dtype == torch.int32
    assert out.tolist() == [[5, 5, 7], [5, PLACEHOLDER_TOKEN_ID, PLACEHOLDER_TOKEN_ID]]


def test_masked_tokens_are_never_recovered():
    """Top-k leaves -inf logits: a recovered token always has positive target probability."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(1, V, generator=g).repeat(N, 1)
    logits[:, 4:] = float("-inf")  # top-4
    drafts = torch.full((N,), 6)  # a masked token: always rejected (p = 0)
    out = rejection_sample_sampled(drafts, [1] * N, 1, None, logits, torch.zeros(N, 1, dtype=torch.long), {},
                                   lambda: torch.rand(N, dtype=torch.float64, generator=g))
    assert set(out[:, 0].tolist()) <= {0, 1, 2, 3} and (out[:, 1] == PLACEHOLDER_TOKEN_ID).all()


def test_seeded_requests_reproduce():
    g, logits, q = _dists(6)
    drafts = torch.stack([torch.multinomial(q[j], 16, replacement=True, generator=g) for j in range(K)], 1)

    def once():
        gens = {i: torch.Generator().manual_seed(100 + i) for i in range(16)}
        uni = torch.empty(16 * K, dtype=torch.float64)
        for i in range(16):
            uni[i * K:(i + 1) * K].uniform_(generator=gens[i])
        return rejection_sample_sampled(drafts.reshape(-1), [K] * 16, K, q.repeat(16, 1), logits.repeat(16, 1),
                                        torch.zeros(16, 1, dtype=torch.long), gens, lambda: uni)

    assert torch.equal(once(), once())
