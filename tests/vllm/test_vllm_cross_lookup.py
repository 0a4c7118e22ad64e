# SPDX-License-Identifier: Apache-2.0
"""Cross-request lookup (setting cross_lookup) inside real vLLM (CPU, float32, engine core in-process with the `uni`
executor, where the drafter lives beside the scheduler): greedy output equals the target's own, continuations found
in other requests' tokens are planned (counter cross_lookups), and `LLM.reset_prefix_cache` (vLLM's prefix-cache
reset: the patch on Scheduler.reset_prefix_cache) empties the index. Off (cross_lookup 0) no index exists."""
import pytest
import torch

from support.vllm_helpers import run_vllm

pytestmark = pytest.mark.vllm

g = torch.Generator().manual_seed(11)
PHRASE = torch.randint(4, 384, (10,), generator=g).tolist()
# each prompt: its own random start, then a phrase all share, cut shorter in each later prompt: a later request's
# history ends inside the phrase where its own history has no earlier occurrence, but an earlier request's has
# history ends inside the phrase where its own history has no earlier occurrence, but an earlier request's has; the
# last prompt repeats the first (what a benchmark's second wave sends without a prefix-cache reset)
PROMPTS = [torch.randint(4, 384, (8,), generator=g).tolist() + PHRASE[: 10 - i] for i in range(6)]
PROMPTS.append(PROMPTS[0])

PROBE = """
import numpy as np
d = llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter
ctl = d.strategy.controller
probe["cross"] = ctl.cross is not None
probe["executor"] = llm.llm_engine.vllm_config.parallel_config.distributed_executor_backend
if ctl.cross is not None:
    probe["docs_before"] = len(ctl.cross.docs)
    probe["cross_lookups"] = d.metrics.counters["cross_lookups"]
    probe["reset"] = bool(llm.reset_prefix_cache())
    ctl.cross.lookup(np.arange(8), 4)  # the next use sees the reset
    probe["docs_after"] = len(ctl.cross.docs)
"""


def _spec(pair, **kw):
    return {"method": "dflash", "model": str(pair / "draft-b8"), "num_speculative_tokens": 7, "adaptive": True, **kw}


@pytest.fixture(scope="module")
def results(pair):
    t = str(pair / "target")
    common = {"model": t, "prompts": PROMPTS, "max_tokens": 48, "max_num_seqs": 2}
    runs = {"base": common,
            "on": {**common, "speculative_config": _spec(pair), "after": PROBE},
            "off": {**common, "speculative_config": _spec(pair, cross_lookup=0), "after": PROBE}}
    return dict(zip(runs, run_vllm(list(runs.values()))))


def test_lossless_with_and_without(results):
    assert results["on"]["tokens"] == results["base"]["tokens"]
    assert results["off"]["tokens"] == results["base"]["tokens"]


def test_other_requests_continuations_are_planned(results):
    p = results["on"]["probe"]
    assert p["executor"] == "uni" and p["cross"], p
    assert p["docs_before"] == len(PROMPTS), p  # every request indexed
    assert p["cross_lookups"] > 0, p


def test_prefix_cache_reset_empties_the_index(results):
    p = results["on"]["probe"]
    assert p["reset"] and p["docs_after"] == 0, p


def test_off_builds_no_index(results):
    assert results["off"]["probe"]["cross"] is False
