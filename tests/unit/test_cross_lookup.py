# SPDX-License-Identifier: Apache-2.0
"""Cross-request lookup (adaptive/cross_lookup.py, setting cross_lookup): the index finds the continuation of a
suffix in other requests' tokens of the same tenant only, indexes incrementally, keeps to its capacity at a cost
proportional to the new tokens (finished requests evicted first), is emptied by a prefix-cache reset, and the
controller uses it only where the request's own history has no match."""
import numpy as np
import pytest

from vllm_dflash.adaptive import cross_lookup
from vllm_dflash.adaptive.controller import AdaptiveController
from vllm_dflash.adaptive.cross_lookup import ONE_TENANT, CrossRequestIndex
from vllm_dflash.adaptive.ngram import prompt_lookup
from vllm_dflash.config import DFlashConfigError
from vllm_dflash.settings import parse_value


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


def test_over_capacity_finished_requests_go_first_then_live_ones_lose_their_oldest_tokens():
    ix = CrossRequestIndex(100, min_n=3, max_n=3)
    ix.observe("old", a(1, 2, 3, 4))
    ix.finish(["old"])
    ix.observe("again", a(5, 6, 7, 8))
    ix.finish(["again"])
    ix.observe("again", a(5, 6, 7, 8, 9))  # back in the batch: live again, its document kept
    for i in range(10):
        ix.observe(f"r{i}", np.arange(1000 + 20 * i, 1020 + 20 * i))
    assert ix.tokens <= 100
    assert ix.lookup(a(1, 2, 3), 2).tolist() == []  # finished: dropped first
    assert ix.lookup(a(6, 7, 8), 1).tolist() == [9]  # live: never dropped
    assert "r0" in ix.live and ix.lookup(a(1000, 1001, 1002), 1).tolist() == []  # live, its oldest tokens trimmed
    for i in range(10):  # every live request keeps its latest tokens
        assert ix.lookup(np.arange(1014 + 20 * i, 1017 + 20 * i), 1).tolist() == [1017 + 20 * i], i


def _counting(monkeypatch) -> dict[str, int]:
    """Positions (re-)indexed and unindexed by every CrossRequestIndex from now on."""
    seen = {"indexed": 0, "unindexed": 0}
    for name, key in (("_index", "indexed"), ("_unindex", "unindexed")):
        orig = getattr(CrossRequestIndex, name, None)
        if orig is None:
            continue

        def counting(self, d, doc, lo, hi, _orig=orig, _key=key):
            seen[_key] += max(hi - lo, 0)
            return _orig(self, d, doc, lo, hi)

        monkeypatch.setattr(CrossRequestIndex, name, counting)
    return seen


def test_over_capacity_a_step_indexes_only_its_new_tokens(monkeypatch):
    """6 live requests x 300 tokens in an index of 1,000 (review NEW-2), each step one new token per request. The old
    eviction dropped whole live requests and re-indexed them the next step: ~1,800 positions a step for 6 new tokens
    (this test then fails at its first step). Now a step indexes its 6 new tokens, and evictions trim as many old
    ones (in batches: down to 31/32 of the capacity when it is passed)."""
    seen = _counting(monkeypatch)
    rng = np.random.default_rng(1)
    ix = CrossRequestIndex(1000)
    hists = {f"r{i}": list(rng.integers(0, 50, 300)) for i in range(6)}
    for rid, h in hists.items():
        ix.observe(rid, np.asarray(h))
    assert ix.tokens <= 1000
    start = dict(seen)
    for step in range(1, 101):
        before = dict(seen)
        for rid, h in hists.items():
            h.append(int(rng.integers(0, 50)))
            ix.lookup(np.asarray(h), 7)
            ix.observe(rid, np.asarray(h))
        assert seen["indexed"] - before["indexed"] == 6, (step, seen)
        assert seen["unindexed"] - before["unindexed"] <= 1000 // 32 + 6, (step, seen)
        assert 1000 - 1000 // 32 - 6 <= ix.tokens <= 1000
    assert seen["unindexed"] - start["unindexed"] <= 600 + 1000 // 32  # as many as came in
    assert sorted(ix.live) == sorted(hists)


def test_the_index_stays_consistent_and_bounded():
    """Random traffic of two tenants over capacity: every map entry points at a held token of its tenant whose n-gram
    it is, the maps hold at most (max_n - min_n + 1) entries a held token, and each token list at most twice its held
    tokens."""
    rng = np.random.default_rng(2)
    ix = CrossRequestIndex(500, min_n=2, max_n=4)
    hists: dict[str, list[int]] = {}
    for step in range(400):
        rid = f"r{rng.integers(0, 12)}"
        h = hists.setdefault(rid, [])
        h.extend(rng.integers(0, 8, int(rng.integers(1, 40))).tolist())
        ix.observe(rid, np.asarray(h), tenant=int(rid[1:]) % 2)
        if step % 7 == 0:
            ix.finish([f"r{rng.integers(0, 12)}"])
        assert ix.tokens <= 500
        assert ix.tokens == sum(doc.end - doc.start for doc in ix.docs.values())
        for doc in ix.docs.values():
            assert len(doc.tokens) <= 2 * (doc.end - doc.start) + 1
    entries = 0
    for tenant, where in ix.maps.items():
        entries += len(where)
        for key, v in where.items():
            doc = ix.docs[v >> 32]
            end = v & 0xFFFFFFFF
            assert doc.tenant == tenant and doc.start <= end <= doc.end - 2
            i = end - doc.offset
            assert any(hash((n, *doc.tokens[i - n + 1: i + 1])) == key for n in range(2, 5)
                       if end - n + 1 >= doc.start)
    assert entries <= 3 * ix.tokens


def test_a_long_prompt_indexes_only_what_the_index_holds(monkeypatch):
    seen = _counting(monkeypatch)
    ix = CrossRequestIndex(1000)
    ix.observe("long", np.arange(50_000))
    assert ix.tokens == 1000 and seen["indexed"] <= 1000
    assert ix.lookup(a(49_000, 49_001, 49_002), 2).tolist() == [49_003, 49_004]
    assert ix.lookup(a(10, 11, 12), 2).tolist() == []


def test_tenants_never_draft_from_each_other():
    """Keyed by (cache_salt, LoRA adapter), as the drafter passes them: the same key shares, any other never."""
    base, salt_a, salt_b = ("s", None), ("a", None), ("b", None)
    lora, lora2 = ("s", ("ad1", "/ad1")), ("s", ("ad2", "/ad2"))
    text = a(40, 41, 42, 43, 44, 45)
    for key in (base, salt_a, lora):
        ix = CrossRequestIndex(1000)
        ix.observe("A", text, tenant=key)
        for other in (base, salt_a, salt_b, lora, lora2, ONE_TENANT, (None, None)):
            got = ix.lookup(a(9, 41, 42, 43), 2, tenant=other).tolist()
            assert got == ([44, 45] if other == key else []), (key, other)
    ix = CrossRequestIndex(1000)
    ix.observe("A", text, tenant=salt_a)
    ix.observe("A", np.concatenate([text, a(46)]), tenant=salt_b)  # a request id seen again under another tenant
    assert ix.lookup(a(41, 42, 43), 2, tenant=salt_a).tolist() == []  # its old document is gone
    assert ix.lookup(a(41, 42, 43), 2, tenant=salt_b).tolist() == [44, 45]  # indexed anew under its tenant


def test_controller_keeps_tenants_apart():
    tenants = {"a1": ("a", None), "a2": ("a", None), "b": ("b", None), "lora": ("a", ("ad", "/ad")), "x": None}
    c = AdaptiveController(7, mode="both", cross_lookup=10_000)
    c.tenant_of = tenants.__getitem__
    c._lookup("a1", a(50, 51, 52, 53, 54, 55, 56, 57))
    q = a(90, 91, 52, 53, 54)
    assert c._lookup("b", q).tolist() == []  # another cache_salt
    assert c._lookup("lora", q).tolist() == []  # the same salt through a LoRA adapter
    assert c._lookup("x", q).tolist() == []  # tenant unknown: no cross lookup ...
    assert "x" not in c.cross.live  # ... and its tokens are not indexed
    assert c._lookup("a2", q).tolist() == [55, 56, 57]  # the same tenant
    assert c.metrics is None and "a2" in c._from_cross and "b" not in c._from_cross


def test_requests_that_leave_the_batch_are_finished_in_the_index():
    c = AdaptiveController(7, mode="both", cross_lookup=10_000)
    c._lookup("a", a(1, 2, 3, 4, 5))
    c._lookup("b", a(6, 7, 8, 9, 10))
    c._prune(["b"])
    assert list(c.cross.live) == ["b"] and list(c.cross.retired) == ["a"]
    c._lookup("a", a(1, 2, 3, 4, 5, 6))  # back (a preempted request): live again, not re-indexed
    assert sorted(c.cross.live) == ["a", "b"] and not c.cross.retired


def test_cross_lookup_setting_is_bounded():
    assert parse_value("cross_lookup", "off") == 0 and parse_value("cross_lookup", 1_000_000) == 1_000_000
    for bad in (1_000_001, -1, "lots", True):
        with pytest.raises(DFlashConfigError, match=r"cross_lookup.*up to 1000000.*or off"):
            parse_value("cross_lookup", bad)


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
