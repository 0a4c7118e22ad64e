# SPDX-License-Identifier: Apache-2.0
"""Prefix caching and adaptive drafting's dropped context rows (issues 51.12 and 62).

Adaptive drafting may drop a step's context rows ('off' won at this batch size) or release a request's draft context
(its lease). With prefix caching those blocks still enter the cache, and a later request sharing the prefix would
draft against whatever draft K/V the blocks hold (another request's, from before the block was reallocated). The
drafter records the blocks with a dropped row (`integration/draft_cache_record.py`); a request whose prefix hit covers
one drafts without DFlash tokens (it is stale, as a request whose own rows were dropped).

The same 140-token prompts twice in one engine, under a fixed plan: the cold pass plans no speculation and, in the
`drop` runs, drops its context every step; the warm pass (a prefix-cache hit on 4 of each prompt's 32-token blocks)
drafts the DFlash block every step for every request that still holds its draft context (`wants_context`).
- rows kept in the cold pass: the warm drafts and acceptance equal those of a run with prefix caching off (which
  recomputes, and injects, the whole prompt);
- rows dropped: every warm request is stale from its first step and drafts no DFlash token;
- control, rows dropped with the record's verdict ignored: the warm pass drafts DFlash tokens against K/V that are
  not its prompt's, and drafts and accepts differently from the run with prefix caching off."""
import pytest
import torch

from support.vllm_helpers import run_vllm

pytestmark = pytest.mark.vllm

g = torch.Generator().manual_seed(11)
PROMPTS = [torch.randint(4, 384, (140,), generator=g).tolist() for _ in range(4)]
PATCH = """
from vllm_dflash.adaptive import controller as C
from vllm_dflash.integration import draft_cache_record as R
C._test_order = {{}}  # request id -> order of arrival in this run
C._test_drop = {drop}
R._test_ignore = {ignore}
if not getattr(C, "_test_patched", False):  # the runs share a process: patch once
    C._test_patched = True
    _plan = C.AdaptiveController.plan
    def _fixed(self, req_ids, *a, **k):
        p = _plan(self, req_ids, *a, **k)
        order = C._test_order
        for r in req_ids:
            order.setdefault(r, len(order))
        warm = [order[r] >= {n} for r in req_ids]
        drafts = [w and self.wants_context(r) for w, r in zip(warm, req_ids)]
        p.sources = ["dflash" if d else "none" for d in drafts]
        p.ks = [self.k_max if d else 0 for d in drafts]
        p.drop_context = C._test_drop and not any(warm)
        return p
    C.AdaptiveController.plan = _fixed
    _admit = R.DraftCacheRecord.admit
    def _admit_test(self, *a, **k):
        out = _admit(self, *a, **k)
        return [] if R._test_ignore else out
    R.DraftCacheRecord.admit = _admit_test
"""


@pytest.fixture(scope="module")
def results(pair):
    spec = {"method": "dflash", "model": str(pair / "draft-b8"), "num_speculative_tokens": 7, "adaptive": True}
    common = {"model": str(pair / "target"), "prompts": PROMPTS, "max_tokens": 24, "repeat": 1,
              "llm_kwargs": {"block_size": 32, "dtype": "float32"}}
    ours = {**common, "speculative_config": spec}
    n = len(PROMPTS)
    runs = {
        "base": common,
        "kept": {**ours, "patch": PATCH.format(drop=False, ignore=False, n=n)},
        "dropped": {**ours, "patch": PATCH.format(drop=True, ignore=False, n=n)},
        "uncached": {**ours, "patch": PATCH.format(drop=True, ignore=False, n=n),
                     "llm_kwargs": {**common["llm_kwargs"], "enable_prefix_caching": False}},
        "control": {**ours, "patch": PATCH.format(drop=True, ignore=True, n=n)},
    }
    names = list(runs)
    return dict(zip(names, run_vllm([runs[n] for n in names])))


def _warm(r) -> tuple[float, float]:
    c = r["repeats"][0]["counters"]
    return c["vllm:spec_decode_num_draft_tokens"], c["vllm:spec_decode_num_accepted_tokens"]


def test_outputs_are_the_targets(results):
    base = results["base"]["tokens"]
    for name in ("kept", "dropped", "uncached", "control"):
        assert results[name]["tokens"] == base, name
        assert results[name]["repeats"][0]["tokens"] == base, name


def test_cache_hit_on_kept_rows_keeps_acceptance(results):
    """Rows kept: the warm pass hits the prefix cache (4 blocks per prompt) and drafts and accepts exactly as the run
    with prefix caching off."""
    for name in ("kept", "dropped", "control"):
        assert all(c >= 128 for c in results[name]["repeats"][0]["cached_tokens"]), name
    assert all(c == 0 for c in results["uncached"]["repeats"][0]["cached_tokens"])
    assert _warm(results["kept"])[1] > 0
    assert _warm(results["kept"]) == _warm(results["uncached"])


def test_cache_hit_on_dropped_rows_drafts_no_dflash(results):
    """Rows dropped: every warm request's prefix hit covers blocks without draft K/V, so none drafts a DFlash token;
    the control (the record ignored) drafts against stale K/V and accepts differently."""
    assert _warm(results["dropped"]) == (0, 0)
    assert _warm(results["control"])[0] > 0
    assert _warm(results["control"]) != _warm(results["uncached"])
