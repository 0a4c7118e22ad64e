# SPDX-License-Identifier: Apache-2.0
"""Cross-request lookup (setting cross_lookup) inside real vLLM (CPU, float32, engine core in-process with the `uni`
executor, where the drafter lives beside the scheduler): greedy output equals the target's own, continuations found
in other requests' tokens are planned (counter cross_lookups), and `LLM.reset_prefix_cache` (vLLM's prefix-cache
reset: the patch on Scheduler.reset_prefix_cache) empties the index. Off (cross_lookup 0) no index exists.

Tenants (review NEW-3): the same prompts, each with its own cache_salt, take no cross lookup at all (each request's
text is another tenant's to the others; with the salt ignored they took 2); all with one salt they take them as
unsalted requests do. The drafter reads each request's salt through the patch on Scheduler.add_request
(patches/cross_lookup_salt.py); requests through a LoRA adapter are indexed apart from base-model requests."""
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
    probe["tenants"] = sorted({repr(doc.tenant) for doc in ctl.cross.docs.values()})
    # this engine's count: the sink is the process's, its counters add up over the file's runs
    total = d.metrics.counters["cross_lookups"]
    probe["cross_lookups"] = total - d.metrics.__dict__.get("_test_cross_lookups", 0.0)
    d.metrics._test_cross_lookups = total
    probe["reset"] = bool(llm.reset_prefix_cache())
    ctl.cross.lookup(np.arange(8), 4)  # the next use sees the reset
    probe["docs_after"] = len(ctl.cross.docs)
"""


def _spec(pair, **kw):
    return {"method": "dflash", "model": str(pair / "draft-b8"), "num_speculative_tokens": 7, "adaptive": True, **kw}


@pytest.fixture(scope="module")
def results(pair, tmp_path_factory):
    from vllm_dflash.bench.soak.lora import make_lora

    lora = make_lora(pair / "target", tmp_path_factory.mktemp("lora") / "adapter", rank=4, seed=0, scale=0.5)
    t = str(pair / "target")
    common = {"model": t, "prompts": PROMPTS, "max_tokens": 48, "max_num_seqs": 2}
    runs = {"base": common,
            "on": {**common, "speculative_config": _spec(pair), "after": PROBE},
            "off": {**common, "speculative_config": _spec(pair, cross_lookup=0), "after": PROBE},
            # each request its own tenant; then all one tenant
            "salted": {**common, "speculative_config": _spec(pair), "after": PROBE,
                       "salt_list": [f"user-{i}" for i in range(len(PROMPTS))]},
            "one_salt": {**common, "speculative_config": _spec(pair), "after": PROBE,
                         "salt_list": ["team"] * len(PROMPTS)},
            # every other request through a LoRA adapter
            "lora": {**common, "speculative_config": _spec(pair), "after": PROBE, "lora": str(lora),
                     "lora_list": [i % 2 == 0 for i in range(len(PROMPTS))],
                     "llm_kwargs": {"enable_lora": True, "max_lora_rank": 8, "max_loras": 1}}}
    return dict(zip(runs, run_vllm(list(runs.values()))))


def test_lossless_with_and_without(results):
    for name in ("on", "off", "salted", "one_salt"):
        assert results[name]["tokens"] == results["base"]["tokens"], name


def test_other_requests_continuations_are_planned(results):
    p = results["on"]["probe"]
    assert p["executor"] == "uni" and p["cross"], p
    assert p["docs_before"] == len(PROMPTS), p  # every request indexed
    assert p["cross_lookups"] > 0, p
    assert p["tenants"] == ["(None, None)"], p  # unsalted, no LoRA adapter: one tenant


def test_requests_of_other_cache_salts_never_draft_from_each_other(results):
    p = results["salted"]["probe"]
    assert p["docs_before"] == len(PROMPTS), p  # every request indexed, each under its own salt
    assert p["tenants"] == sorted(repr((f"user-{i}", None)) for i in range(len(PROMPTS))), p
    assert p["cross_lookups"] == 0, p


def test_base_and_adapter_requests_are_other_tenants(results):
    p = results["lora"]["probe"]
    assert p["docs_before"] == len(PROMPTS), p
    assert len(p["tenants"]) == 2 and "(None, None)" in p["tenants"], p
    assert any("test-lora" in t for t in p["tenants"]), p


def test_requests_of_one_cache_salt_draft_from_each_other(results):
    p = results["one_salt"]["probe"]
    assert p["tenants"] == [repr(("team", None))], p
    assert p["cross_lookups"] == results["on"]["probe"]["cross_lookups"] > 0, p


def test_prefix_cache_reset_empties_the_index(results):
    p = results["on"]["probe"]
    assert p["reset"] and p["docs_after"] == 0, p


def test_off_builds_no_index(results):
    assert results["off"]["probe"]["cross"] is False
