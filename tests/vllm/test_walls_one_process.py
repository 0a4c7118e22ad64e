# SPDX-License-Identifier: Apache-2.0
"""The walls inside one process (issue 61): once an engine with our drafter has applied every patch in a process,
engines without it in the same process are still stock vLLM.

One process (offline LLM, in-process engines, float32, greedy with top-5 logprobs) builds, in order: no speculation
(the plugin never applied: no patch, collector or variable), our DFlash engine (every patch applied), vLLM's own DFlash
drafter chosen through our key (`drafter: "vllm"`), then n-gram (it runs the target's layers and the rejection sampler
as no speculation does, plus a drafter). Another process runs the same non-DFlash engines with the plugin excluded
(VLLM_PLUGINS=""): stock vLLM 0.32, whose built-in `dflash` serves the same draft checkpoint. Every non-DFlash engine
of the first process equals its stock twin bit for bit (tokens, logprobs, drafted and accepted counts), and vLLM's
drafter loads vLLM's own draft model class."""
import os

import pytest
from support.vllm_helpers import counter, run_vllm

pytestmark = pytest.mark.vllm

PROMPTS = [[5, 6, 7, 8] * 6, [9, 10, 11] * 8, [3, 17, 42, 8, 99, 5, 61, 7, 12, 250]]

# before each run: record the process marker while the engine builds its executor (the point where an engine core
# run in this process starts its workers)
SEEN = """
import os
from vllm.v1.executor.abstract import Executor
import vllm_dflash
if not hasattr(vllm_dflash, "_test_marker_seen"):
    _init = Executor.__init__
    def _seen(self, *a, **k):
        vllm_dflash._test_marker_seen.append(os.environ.get("DFLASH_PLUGIN_ACTIVE"))
        return _init(self, *a, **k)
    Executor.__init__ = _seen
vllm_dflash._test_marker_seen = []
"""
# after each run, in the engine's process (`llm`, `probe` in scope); "expand": vLLM's rejection-sampler expand kernel
# (its CPU override) run as inside this engine's sampler, on a float output pre-filled with -9 (vLLM's own kernel
# leaves a float output unwritten: patches/cpu_expand_kernel.py)
PROBE = """
import os, prometheus_client, torch, vllm_dflash
from vllm_dflash.integration import patches
from vllm_dflash.integration.patches import cpu_expand_kernel
from vllm.v1.sample import rejection_sampler as rs
runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
drafter = getattr(runner, "drafter", None)
model = getattr(drafter, "model", None)
sampler = getattr(runner, "rejection_sampler", None)
expand = None
if sampler is not None:
    out = torch.full((3,), -9.0)
    with cpu_expand_kernel.sampling_in(sampler):
        rs._expand(out, torch.tensor([0.5, 2.0]), torch.tensor([1, 3], dtype=torch.int32), 0, 0)
    expand = out.tolist()
probe.update(applied=patches._APPLIED, marker=os.environ.get(patches.ACTIVE_ENV),
             marker_at_start=vllm_dflash._test_marker_seen, expand=expand,
             families=sorted({m.name for m in prometheus_client.REGISTRY.collect()
                              if m.name.startswith("vllm_dflash")}),
             drafter=None if drafter is None else type(drafter).__name__, draft_class=None if model is None else
             f"{type(model).__module__}:{type(model).__qualname__}")
"""
UNWRITTEN, WRITTEN = [-9.0] * 3, [0.5, 2.0, 2.0]


@pytest.fixture(scope="module")
def runs(pair):
    draft = str(pair / "draft-b8")
    base = {"model": str(pair / "target"), "prompts": PROMPTS, "max_tokens": 16, "sampling": {"logprobs": 5}}
    ngram = {**base, "speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
                                            "prompt_lookup_max": 3}}
    vllm_dflash = {**base, "speculative_config": {"method": "dflash", "model": draft, "num_speculative_tokens": 7}}
    theirs = {**base, "speculative_config": {**vllm_dflash["speculative_config"], "drafter": "vllm"}}
    ours = {**base, "speculative_config": {"method": "dflash", "model": draft}}
    clean = {k: "" for k in os.environ if k.startswith(("DFLASH_", "VLLM_DFLASH_"))}
    # n-gram last in each process: once numba is imported, vLLM's CPU kernel overrides fail in the next engine's
    # worker (CpuPlatform.register_triton_kernel_overrides, stock vLLM 0.32)
    names = ["none_before", "ours", "theirs", "ngram"]
    specs = [base, ours, theirs, ngram]
    plugin = dict(zip(names, run_vllm([{**s, "patch": SEEN, "after": PROBE} for s in specs], env=clean),
                      strict=True))
    stock_runs = run_vllm([base, vllm_dflash, ngram], env={**clean, "VLLM_PLUGINS": ""})
    stock = dict(zip(["none", "theirs", "ngram"], stock_runs, strict=True))
    return plugin, stock


def _same(got: dict, want: dict) -> None:
    assert got["tokens"] == want["tokens"]
    assert got["logprobs"] == want["logprobs"]
    assert got["first_counters"] == want["first_counters"]  # the same drafts, accepted alike


def test_before_any_dflash_engine_nothing_is_applied(runs):
    plugin, stock = runs
    _same(plugin["none_before"], stock["none"])
    assert plugin["none_before"]["probe"] == {"applied": False, "marker": None, "marker_at_start": [None],
                                              "expand": None, "families": [], "drafter": None, "draft_class": None}


def test_our_engine_marks_only_its_own_start(runs):
    """Our engine: every patch applied, our drafter and draft class, the expand-kernel fix in its sampler; the process
    marker set while the engine started its executor (the workers it would start inherit it), and gone after."""
    plugin, _ = runs
    p = plugin["ours"]["probe"]
    assert p["applied"] and p["drafter"] == "DFlashDrafter", p
    assert p["draft_class"] == "vllm_dflash.integration.vllm_model:DFlashDraftForVllm", p
    assert p["expand"] == WRITTEN, p
    assert p["marker_at_start"] == ["1"] and p["marker"] is None, p
    assert counter(plugin["ours"], "vllm:spec_decode_num_accepted_tokens") > 0


@pytest.mark.parametrize("name", ["ngram", "theirs"])
def test_engines_after_ours_are_stock_vllm(runs, name):
    """Same process as our DFlash engine, every patch applied: still bit-identical to stock vLLM, no marker while the
    engine starts, vLLM's own expand kernel in its rejection sampler."""
    plugin, stock = runs
    _same(plugin[name], stock[name])
    p = plugin[name]["probe"]
    assert p["applied"] and p["marker_at_start"] == [None] and p["marker"] is None, p
    assert p["expand"] == UNWRITTEN, p


def test_vllms_own_drafter_through_our_key(runs):
    """`drafter: "vllm"` with the plugin loaded (NEW-10): vLLM's DFlash proposer and vLLM's own draft model class
    (not ours), drafts accepted, greedy tokens equal to stock vLLM's drafter on the same checkpoint."""
    plugin, stock = runs
    p = plugin["theirs"]["probe"]
    assert p["drafter"] == "DFlashProposer", p
    assert p["draft_class"] == "vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM", p
    assert counter(plugin["theirs"], "vllm:spec_decode_num_accepted_tokens") > 0
    assert plugin["theirs"]["tokens"] == stock["theirs"]["tokens"] == stock["none"]["tokens"]
