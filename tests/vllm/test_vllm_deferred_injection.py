# SPDX-License-Identifier: Apache-2.0
"""Deferred KV injection inside real vLLM (CPU, float32, adaptive drafting): steps whose plan runs no draft forward
hold their context rows, and the next draft forward injects them. After the generation (the held rows injected),
the draft's KV cache at every context position equals the cache of an engine that injects every step, the output
equals the target's greedy output, and steps were really deferred. Negative control: dropping the held rows leaves
the cache visibly different. With adaptive "ngram" (prompt lookup only: no draft forward ever reads the cache) no
row is combined or injected at all; nor where the guard measured no speculation faster ('off' won), and the request
is then planned without DFlash tokens."""
import pytest
import torch

from support.vllm_helpers import run_vllm

pytestmark = pytest.mark.vllm

g = torch.Generator().manual_seed(11)
PROMPT = (torch.randint(4, 384, (6,), generator=g).tolist() * 7)[:40]  # a repeated phrase: prompt lookup matches
MAX_TOKENS = 48
LAST = len(PROMPT) + MAX_TOKENS - 1  # context positions 0 .. LAST - 1 went through the target

# every third plan verifies no DFlash token (its lookup tokens only), so some steps run no draft forward whatever the
# cost model prefers on this tiny model (its step costs, fitted on the forward, make the block cheap enough to run on
# every step)
SOME_STEPS_WITHOUT_BLOCK = """
from vllm_dflash.adaptive import controller as C
if not getattr(C.AdaptiveController.plan, "_test_every_third", False):  # the runs share a process: patch once
    _plan = C.AdaptiveController.plan
    def _plan3(self, *a, **k):
        p = _plan(self, *a, **k)
        self._test_n = getattr(self, "_test_n", 0) + 1
        if self._test_n % 3 == 0:
            p.ks = [0 if s == "dflash" else min(n, len(t)) if s == "merged" else n
                    for s, n, t in zip(p.sources, p.ks, p.lookups)]
        return p
    _plan3._test_every_third = True
    C.AdaptiveController.plan = _plan3
"""
# record each position's slot as the drafter computes it (the latest write wins, like the cache)
RECORD = SOME_STEPS_WITHOUT_BLOCK + """
from vllm_dflash.integration import proposer as P
P._test_slots = {}
_orig = P.DFlashDrafter.set_inputs_first_pass
def _rec(self, **kw):
    out = _orig(self, **kw)
    n = self._dflash_num_context
    for p, s in zip(self._context_positions_buffer[:n].tolist(), self._context_slot_mapping_buffer[:n].tolist()):
        P._test_slots[p] = s
    return out
P.DFlashDrafter.set_inputs_first_pass = _rec
# a step that runs no draft forward and verified no draft holds its rows at the target's positions / slots without a
# first pass (integration/padded_inputs.py): record those too
from vllm_dflash.integration.deferred_context import DeferredContext
_push = DeferredContext.push
def _rec_push(self, hidden, positions, slots):
    for p, s in zip(positions.tolist(), slots.tolist()):
        P._test_slots[p] = s
    return _push(self, hidden, positions, slots)
DeferredContext.push = _rec_push
"""
DROP_HELD = RECORD + """
from vllm_dflash.integration.deferred_context import DeferredContext
_take = DeferredContext.take
def _drop(self, hidden=None, positions=None, slots=None):
    self.rows = 0  # fault: the held rows are lost
    return _take(self, hidden, positions, slots)
DeferredContext.take = _drop
"""
# count the context rows combined (fc) and injected into the draft's cache, whichever path does it
COUNT = SOME_STEPS_WITHOUT_BLOCK + """
from vllm_dflash.integration import proposer as P
from vllm_dflash.integration import vllm_model as VM
P._test_rows = {"combined": 0, "injected": 0}
for _name, _key in (("combine_hidden_states", "combined"), ("precompute_and_store_context_kv", "injected")):
    def _counted(self, x, *a, _f=getattr(VM.DFlashDraftForVllm, _name), _key=_key, **k):
        P._test_rows[_key] += int(x.shape[0])
        return _f(self, x, *a, **k)
    setattr(VM.DFlashDraftForVllm, _name, _counted)
"""
COUNT_PROBE = """
from vllm_dflash.integration import proposer as P
d = llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter
probe["rows"] = dict(P._test_rows, held=d._deferred.deferred_total if d._deferred is not None else 0)
probe["dropped_steps"] = d.metrics.counters.get("context_dropped_steps", 0.0)  # declared where drops can happen
probe["sources"] = {k.split("/")[1]: v for k, v in d.metrics.counters.items() if k.startswith("proposals/")}
"""
# every batch-size bucket's guard starts with 'off' measured faster than the plan (as after a window that showed it)
OFF_WON = COUNT + """
from vllm_dflash.serve.metrics import MetricsSink
_c = MetricsSink.get().counters  # the runs share a process: count this run's events only
for _k in _c:
    _c[_k] = 0.0
from vllm_dflash.adaptive.policy import SpeculationGuard
_init = SpeculationGuard.__init__
def _off_won(self, *a, **k):
    _init(self, *a, **k)
    self.arm, self.rate = "off", {"plan": 1.0, "off": 2.0}
    self.gap = 1  # re-measure the plan after every window of 'off'
SpeculationGuard.__init__ = _off_won
"""
# every guard pinned to a measured 'off' (no plan ever re-measured); count what vLLM's padded-batch preparation and the
# draft's first pass compute (integration/padded_inputs.py): vLLM's preparation wrapped on vLLM's class, under our
# overrides that defer it
PINNED_OFF = """
import functools
from vllm.v1.spec_decode.dflash import DFlashProposer
from vllm_dflash.adaptive.policy import SpeculationGuard
from vllm_dflash.integration import proposer as P
_init = SpeculationGuard.__init__
def _pinned(self, *a, **k):
    _init(self, *a, **k)
    self.arm, self.rate = "off", {"plan": 0.0, "off": 1.0}
    self.record = lambda *a, **k: None
SpeculationGuard.__init__ = _pinned
if not hasattr(P, "_test_calls"):  # the runs share a process: wrap once, count from zero in each run
    for _cls, _name, _key in ((P.DFlashDrafter, "propose", "propose"),
                              (DFlashProposer, "prepare_next_token_ids_padded", "next_tokens"),
                              (DFlashProposer, "prepare_inputs_padded", "padding"),
                              (P.DFlashDrafter, "set_inputs_first_pass", "first_pass")):  # RECORD's, if set
        def _counted(self, *a, _f=getattr(_cls, _name), _key=_key, **k):
            P._test_calls[_key] += 1
            return _f(self, *a, **k)
        setattr(_cls, _name, functools.wraps(getattr(_cls, _name))(_counted))
P._test_calls = dict.fromkeys(("propose", "next_tokens", "padding", "first_pass"), 0)
"""
CALLS_PROBE = """
from vllm_dflash.integration import proposer as P
probe["calls"] = dict(P._test_calls)
"""
# inject what is still held, then read K/V of every context position from each draft layer's cache (CPU "vec" layout)
PROBE = f"""
import torch
from vllm_dflash.integration import proposer as P
runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
d = runner.drafter
if d._deferred is not None:
    probe["deferred_steps"] = d._deferred.deferred_total
    d._inject(d._deferred.take())
ctx = runner.compilation_config.static_forward_context
slots = torch.tensor([P._test_slots[p] for p in range({LAST})])
rows = []
for name in d._draft_attn_layer_names:
    kv = ctx[name].kv_cache
    cache = kv[0] if isinstance(kv, list) else kv
    nb, nkv, bs, two_hd = cache.shape
    hd = two_hd // 2
    kc = cache.view(nb, nkv, 2, bs * hd)[:, :, 0].view(nb, nkv, hd, bs)
    vc = cache.view(nb, nkv, 2, bs * hd)[:, :, 1].view(nb, nkv, bs, hd)
    blk, off = slots // bs, slots % bs
    rows.append(torch.cat([kc[blk, :, :, off].flatten(1), vc[blk, :, off].flatten(1)], 1))
probe["kv"] = torch.stack(rows).tolist()
"""


@pytest.fixture(scope="module")
def results(pair):
    spec = {"method": "dflash", "model": str(pair / "draft-b8"), "num_speculative_tokens": 7, "adaptive": True}
    common = {"model": str(pair / "target"), "prompts": [PROMPT], "max_tokens": MAX_TOKENS, "after": PROBE}
    runs = {
        "base": {"model": str(pair / "target"), "prompts": [PROMPT], "max_tokens": MAX_TOKENS},
        "eager": {**common, "speculative_config": {**spec, "defer_injection": False}, "patch": RECORD},
        "deferred": {**common, "speculative_config": spec, "patch": RECORD},
        "dropped": {**common, "speculative_config": spec, "patch": DROP_HELD},
        "ngram_mode": {"model": str(pair / "target"), "prompts": [PROMPT], "max_tokens": MAX_TOKENS,
                       "speculative_config": {**spec, "adaptive": "ngram"}, "patch": COUNT, "after": COUNT_PROBE},
        "counted": {"model": str(pair / "target"), "prompts": [PROMPT], "max_tokens": MAX_TOKENS,
                    "speculative_config": spec, "patch": COUNT, "after": COUNT_PROBE},
        "off_won": {"model": str(pair / "target"), "prompts": [PROMPT], "max_tokens": MAX_TOKENS,
                    "speculative_config": spec, "patch": OFF_WON, "after": COUNT_PROBE},  # prefix caching on
        "pinned_off": {"model": str(pair / "target"), "prompts": [PROMPT], "max_tokens": MAX_TOKENS,
                       "speculative_config": spec, "patch": PINNED_OFF, "after": CALLS_PROBE},
        "fixed_block": {"model": str(pair / "target"), "prompts": [PROMPT], "max_tokens": MAX_TOKENS,
                        "speculative_config": {**spec, "adaptive": False}, "patch": PINNED_OFF,
                        "after": CALLS_PROBE},
    }
    names = list(runs)
    return dict(zip(names, run_vllm([runs[n] for n in names])))


def test_output_is_the_targets(results):
    for name in ("eager", "deferred", "dropped", "ngram_mode", "counted", "off_won", "pinned_off", "fixed_block"):
        assert results[name]["tokens"] == results["base"]["tokens"], name


def test_deferred_cache_equals_per_step_injection(results):
    assert "deferred_steps" not in results["eager"]["probe"]  # defer_injection false: nothing held
    assert results["deferred"]["probe"]["deferred_steps"] > 0  # some steps ran no draft forward and were held
    eager = torch.tensor(results["eager"]["probe"]["kv"])  # [layers, LAST, 2 * kv heads * head_dim]
    deferred = torch.tensor(results["deferred"]["probe"]["kv"])
    # up to the rounding of fc / the K/V GEMM at another row count (float32)
    torch.testing.assert_close(deferred, eager, atol=1e-4, rtol=1e-4)


def test_lost_rows_would_be_caught(results):
    assert results["dropped"]["probe"]["deferred_steps"] > 0
    eager = torch.tensor(results["eager"]["probe"]["kv"])
    dropped = torch.tensor(results["dropped"]["probe"]["kv"])
    assert float((dropped - eager).abs().max()) > 0.01


def test_prompt_lookup_only_keeps_no_context(results):
    """adaptive "ngram": no draft forward runs, so no step's rows are held, combined or injected; the default adaptive
    mode on the same prompt holds, combines and injects rows (the counters see them: the check can fail)."""
    assert results["ngram_mode"]["probe"]["rows"] == {"combined": 0, "injected": 0, "held": 0}
    counted = results["counted"]["probe"]["rows"]
    assert counted["combined"] > 0 and counted["injected"] > 0 and counted["held"] > 0, counted


def test_no_context_is_kept_where_no_speculation_won(results):
    """With 'off' measured faster (the guard starts there and re-measures the plan after every window), the steps
    without speculation drop their context rows, with vLLM's prefix caching on (a later request whose prefix hit
    covers a dropped block drafts without DFlash: test_vllm_prefix_context.py); once the guard re-measures the plan, the request, whose draft context
    now has holes, drafts by prompt lookup only (no DFlash or merged proposal), so no row is ever combined or
    injected. (Rows are held only while 'off' is re-measured after the plan won.) The default run on the same prompt
    proposes DFlash tokens (`counted`), so the source check can fail."""
    off = results["off_won"]["probe"]
    assert off["dropped_steps"] > 0, off
    assert off["rows"]["combined"] == 0 and off["rows"]["injected"] == 0, off
    assert off["sources"]["ngram"] > 0, off  # the plan was re-measured: the request drafted
    assert off["sources"]["dflash"] == 0 and off["sources"]["merged"] == 0, off
    counted = results["counted"]["probe"]["sources"]
    assert counted["dflash"] + counted["merged"] > 0, counted


def test_a_step_that_drafts_nothing_prepares_nothing(results):
    """Every guard pinned to a measured 'off': no step drafts, so none reads vLLM's padded-batch inputs or the draft's
    query rows, and none of them is computed (integration/padded_inputs.py: before, each ran on every drafter call,
    0.5 ms of a 30 ms step at c8 on a 2-core EPYC). The fixed block, which drafts every step, computes each on every
    call: the counters see them (the check can fail)."""
    off = results["pinned_off"]["probe"]["calls"]
    assert off["propose"] > 0, off
    assert off["next_tokens"] == off["padding"] == off["first_pass"] == 0, off
    fixed = results["fixed_block"]["probe"]["calls"]
    assert fixed["propose"] > 0 and fixed["next_tokens"] == fixed["first_pass"] == fixed["propose"], fixed
