# SPDX-License-Identifier: Apache-2.0
"""DFLASH_PROFILE=1 under vLLM's default torch.compile (not only --enforce-eager), for every speculative method: the
CPU worker times every target forward (patches/profile_forward.py), so the benchmark's time split separates
verification from host work for our drafter, vLLM's n-gram drafter and no speculation alike.

Three compiled engines on the tiny pair, in one process (the worker's metrics sink is per process, so each engine's
counts are read as increments over the previous one's): our drafter without the setting (nothing timed), our drafter
with it (at least one target forward per draft forward, since every draft forward follows one, and a positive
total), vLLM's n-gram drafter with it (one target forward per engine step at least, with a positive total)."""
import pytest

from support.vllm_helpers import run_vllm

pytestmark = pytest.mark.vllm

PROMPTS = [[5, 9, 13, 17, 21, 9, 13, 17], [7, 11, 7, 11, 7, 11, 30]]
PROBE = """
runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
snap = runner.drafter.metrics.snapshot()["hists"]
probe.update(mode=int(llm.llm_engine.vllm_config.compilation_config.mode),
             hists={k: {"count": v["count"], "sum": v["sum"]} for k, v in snap.items()})
"""


@pytest.fixture(scope="module")
def runs(pair):
    spec = {"method": "dflash", "model": str(pair / "draft-b8"), "num_speculative_tokens": 7, "adaptive": False}
    common = {"model": str(pair / "target"), "prompts": PROMPTS, "max_tokens": 16, "speculative_config": spec,
              "after": PROBE, "llm_kwargs": {"enforce_eager": False}}
    ngram = {**common, "speculative_config": {"method": "ngram", "num_speculative_tokens": 4,
                                              "prompt_lookup_min": 2, "prompt_lookup_max": 4},
             "env": {"DFLASH_PROFILE": "1", "DFLASH_VLLM_EXTRAS": "all"},  # without our drafter: the opt-in
             "after": PROBE.replace("runner.drafter.metrics", "MetricsSink.get()")}
    ngram["after"] = "from vllm_dflash.serve.metrics import MetricsSink\n" + ngram["after"]
    return run_vllm([common, {**common, "env": {"DFLASH_PROFILE": "1"}}, ngram])


def _count(run: dict, hist: str) -> int:
    return run["probe"]["hists"].get(hist, {"count": 0})["count"]


def test_target_forward_timed_when_compiled(runs):
    """Compiled engine (compilation mode > 0) with DFLASH_PROFILE=1: target forwards observed, at least one per
    draft forward, with a positive summed time."""
    before, after = runs[:2]
    assert after["probe"]["mode"] > 0, "the engine was not compiled; this test is about the compiled path"
    drafts = _count(after, "draft_forward_seconds") - _count(before, "draft_forward_seconds")
    targets = _count(after, "target_forward_seconds") - _count(before, "target_forward_seconds")
    assert drafts > 0 and targets >= drafts, after["probe"]
    assert after["probe"]["hists"]["target_forward_seconds"]["sum"] > 0, after["probe"]


def test_no_timer_without_the_setting(runs):
    """Negative control: the same compiled engine without DFLASH_PROFILE times no target forward."""
    assert runs[0]["probe"]["mode"] > 0
    assert _count(runs[0], "draft_forward_seconds") > 0, runs[0]["probe"]
    assert _count(runs[0], "target_forward_seconds") == 0, runs[0]["probe"]


def test_target_forward_timed_for_ngram(runs):
    """vLLM's n-gram drafter, compiled, DFLASH_PROFILE=1: its target forwards are timed too (the timer is not tied to
    our drafter): more observations than the previous engine left, with a positive added time."""
    before, after = runs[1:]
    assert after["probe"]["mode"] > 0
    assert _count(after, "target_forward_seconds") > _count(before, "target_forward_seconds"), after["probe"]
    added = (after["probe"]["hists"]["target_forward_seconds"]["sum"]
             - before["probe"]["hists"]["target_forward_seconds"]["sum"])
    assert added > 0, after["probe"]
    assert _count(after, "draft_forward_seconds") == _count(before, "draft_forward_seconds"), "n-gram ran no draft"
