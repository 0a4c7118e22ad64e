# SPDX-License-Identifier: Apache-2.0
"""Prefix caching and adaptive drafting's dropped context rows (issue 51.12).

Adaptive drafting may drop a step's context rows ('off' won at this batch size) or release a request's draft context
(its lease). With prefix caching those blocks still enter the cache, and a later request sharing the prefix drafts
against whatever draft K/V the blocks hold. With prefix caching on, the drafter therefore holds every row for the
next draft forward instead (`DFlashDrafter._keep_context`).

The same 140-token prompts twice in one engine, under a fixed plan: the cold pass plans no speculation and asks to
drop its context every step; the warm pass (a prefix-cache hit on 4 of each prompt's 32-token blocks) drafts the
DFlash block every step. Its drafts and acceptance must equal those of a run with prefix caching off (which
recomputes, and injects, the whole prompt). Control: with the fix forced off, the warm drafts differ."""
import pytest
import torch

from support.vllm_helpers import run_vllm

pytestmark = pytest.mark.vllm

g = torch.Generator().manual_seed(11)
PROMPTS = [torch.randint(4, 384, (140,), generator=g).tolist() for _ in range(4)]
PATCH = """
from vllm_dflash.adaptive import controller as C
from vllm_dflash.integration import proposer as P
P._test_order = {{}}  # request id -> order of arrival in this run
P._test_keep = {keep}
if not getattr(P, "_test_patched", False):  # the runs share a process: patch once
    P._test_patched = True
    _plan = C.AdaptiveController.plan
    def _fixed(self, req_ids, *a, **k):
        p = _plan(self, req_ids, *a, **k)
        order = P._test_order
        for r in req_ids:
            order.setdefault(r, len(order))
        warm = [order[r] >= {n} for r in req_ids]
        p.sources = ["dflash" if w else "none" for w in warm]
        p.ks = [self.k_max if w else 0 for w in warm]
        p.drop_context = not any(warm)
        return p
    C.AdaptiveController.plan = _fixed
    _init = P.DFlashDrafter.__init__
    def _init_keep(self, *a, **k):
        _init(self, *a, **k)
        if P._test_keep is not None:
            self._keep_context = P._test_keep
    P.DFlashDrafter.__init__ = _init_keep
"""


@pytest.fixture(scope="module")
def results(pair):
    spec = {"method": "dflash", "model": str(pair / "draft-b8"), "num_speculative_tokens": 7, "adaptive": True}
    common = {"model": str(pair / "target"), "prompts": PROMPTS, "max_tokens": 24, "repeat": 1,
              "llm_kwargs": {"block_size": 32, "dtype": "float32"}}
    ours = {**common, "speculative_config": spec}
    runs = {
        "base": common,
        "cached": {**ours, "patch": PATCH.format(keep=None, n=len(PROMPTS))},
        "uncached": {**ours, "patch": PATCH.format(keep=None, n=len(PROMPTS)),
                     "llm_kwargs": {**common["llm_kwargs"], "enable_prefix_caching": False}},
        "cached_bug": {**ours, "patch": PATCH.format(keep=False, n=len(PROMPTS))},
    }
    names = list(runs)
    return dict(zip(names, run_vllm([runs[n] for n in names])))


def _warm(r) -> tuple[float, float]:
    c = r["repeats"][0]["counters"]
    return c["vllm:spec_decode_num_draft_tokens"], c["vllm:spec_decode_num_accepted_tokens"]


def test_outputs_are_the_targets(results):
    base = results["base"]["tokens"]
    for name in ("cached", "uncached", "cached_bug"):
        assert results[name]["tokens"] == base, name
        assert results[name]["repeats"][0]["tokens"] == base, name


def test_cache_hit_keeps_acceptance(results):
    """The warm pass hits the prefix cache (4 blocks per prompt) and still drafts and accepts exactly as the run
    with prefix caching off; the control (rows dropped in the cold pass) accepts differently."""
    assert all(c >= 128 for c in results["cached"]["repeats"][0]["cached_tokens"])
    assert all(c == 0 for c in results["uncached"]["repeats"][0]["cached_tokens"])
    assert _warm(results["cached"])[1] > 0
    assert _warm(results["cached"]) == _warm(results["uncached"])
    assert _warm(results["cached_bug"]) != _warm(results["cached"])
