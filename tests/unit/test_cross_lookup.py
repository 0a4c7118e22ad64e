# SPDX-License-Identifier: Apache-2.0
"""Cross-request lookup (adaptive/cross_lookup.py, setting cross_lookup): the index finds the continuation of a
suffix in other requests' tokens, indexes incrementally, keeps to its capacity, is emptied by a prefix-cache reset,
and the controller uses it only where the request's own history has no match."""
import numpy as np

from vllm_dflash.adaptive import cross_lookup
from vllm_dflash.adaptive.controller import AdaptiveController
from vllm_dflash.adaptive.cross_lookup import CrossRequestIndex
from vllm_dflash.adaptive.ngram import prompt_lookup


def a(*xs):
    return np.asarray(xs, dtype=np.int64)


def test_finds_the_longest_suffix_in_other_requests():
    ix = CrossRequestIndex(1000, min_n=3, max_n=6)
    ix.observe("a", a(1, 2, 3, 4, 5, 6, 7, 8, 9))
    ix.observe("b", a(20, 3, 4, 5, 30, 31))  # a later 3-gram occurrence of (3, 4, 5)
    assert ix.lookup(a(0, 2, 3, 4, 5), 3).tolist() == [6, 7, 8]  # 4-gram (2, 3, 4, 5) only in "a": longest n wins
    assert ix.lookup(a(0, 0, 3, 4, 5), 3).tolist() == [30, 31]  # 3-gram: the most recent occurrence
    assert ix.lookup(a(7, 8), 3).tolist() == []  # shorter than min_n
    assert ix.lookup(a(8, 9), 3).tolist() == []  # an occurrence with no token after it is not indexed


def test_incremental_observation_equals_one_pass():
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 6, 300)
    whole, parts = CrossRequestIndex(10_000), CrossRequestIndex(10_000)
    whole.observe("r", toks)
    for L in range(1, 301, 7):
        parts.observe("r", toks[:L])
    parts.observe("r", toks)
    for _ in range(200):
        q = rng.integers(0, 6, 8)
        assert whole.lookup(q, 5).tolist() == parts.lookup(q, 5).tolist()


def test_capacity_drops_the_oldest_requests():
    ix = CrossRequestIndex(100, min_n=3, max_n=3)
    ix.observe("old", a(1, 2, 3, 4))
    for i in range(10):
        ix.observe(f"r{i}", np.arange(1000 + 20 * i, 1020 + 20 * i))
    assert ix.tokens <= 100
    assert ix.lookup(a(1, 2, 3), 2).tolist() == []  # evicted: a stale map entry is skipped
    assert ix.lookup(a(1180, 1181, 1182), 2).tolist() == [1183, 1184]  # the newest stays


def test_a_prefix_cache_reset_empties_the_index():
    ix = CrossRequestIndex(1000)
    ix.observe("a", a(1, 2, 3, 4, 5))
    assert ix.lookup(a(2, 3, 4), 1).tolist() == [5]
    cross_lookup.note_prefix_cache_reset()
    assert ix.lookup(a(2, 3, 4), 1).tolist() == []  # what the patch on Scheduler.reset_prefix_cache triggers
    ix.observe("b", a(2, 3, 4, 9))
    assert ix.lookup(a(2, 3, 4), 1).tolist() == [9]


def test_controller_falls_back_to_other_requests_only_without_an_own_match():
    on = AdaptiveController(7, mode="both", cross_lookup=10_000)
    off = AdaptiveController(7, mode="both")
    first = a(50, 51, 52, 53, 54, 55, 56, 57, 58, 59)
    on._lookup("first", first)  # indexed as the planner sees it
    q = a(90, 91, 52, 53, 54)  # no match in its own history
    assert off._lookup("q", q).tolist() == []
    assert on._lookup("q", q).tolist() == [55, 56, 57, 58, 59]
    own = a(52, 53, 54, 77, 52, 53, 54)  # its own history has (52, 53, 54) -> 77: the own match wins
    assert on._lookup("own", own).tolist() == prompt_lookup(own, 7).tolist() == [77, 52, 53, 54]
    assert AdaptiveController(7, mode="dflash", cross_lookup=10_000).cross is None  # no lookup source at all


def test_cross_lookups_keep_their_own_acceptance_rates():
    """A continuation from other requests' tokens is scored as 'cross', and the planner values such a request's lookup
    with the 'cross' rates: the request's own-history lookups ('ngram') keep theirs (served open chat at c8 lost
    tokens per forward, 1.68 -> 1.46, while both shared one record)."""
    from vllm_dflash.adaptive.controller import _Pending

    c = AdaptiveController(7, mode="both", cross_lookup=10_000)
    c._lookup("first", a(50, 51, 52, 53, 54, 55, 56, 57, 58, 59))
    q = a(90, 91, 52, 53, 54)
    look = c._lookup("q", q)
    assert "q" in c._from_cross
    ngram_before = c.acceptance.global_rates("ngram").copy()
    for _ in range(20):
        c._observe("q", _Pending(len(q), look, "ngram", 0, "q" in c._from_cross), len(look), 0)
    assert (c.acceptance.global_rates("ngram") == ngram_before).all()
    assert c.acceptance.global_rates("cross")[0] < 0.3
    m = np.asarray([len(look)])
    table = c._gain_table(["q"], m)
    own = AdaptiveController(7, mode="both")._gain_table(["q"], m)
    assert table["ngram"][0, 0] < own["ngram"][0, 0]  # valued with the failed 'cross' record, not 'ngram'
