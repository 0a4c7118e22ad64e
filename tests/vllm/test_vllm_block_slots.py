# SPDX-License-Identifier: Apache-2.0
"""The draft-vocabulary argmax at the verified block slots alone (integration/block_rows.py `verified_positions`),
inside real vLLM (CPU, float32, adaptive drafting, synchronous scheduling).

Four requests decode together under a fixed plan (by arrival): request 0 verifies 2 DFlash tokens, request 1 none,
request 2 five, request 3 a merged proposal of every slot (its lookup tokens first). Checked: at every verified slot
the draft is the same token as with the argmax over every slot (`verified_positions` forced off, the control); the
slots left out hold the mask id in the trimmed run and real drafts in the control (so the trimmed path ran); the
output is the target's greedy output in both."""
import pytest
import torch

from support.vllm_helpers import run_vllm

pytestmark = pytest.mark.vllm

g = torch.Generator().manual_seed(7)
PROMPTS = [(torch.randint(4, 384, (5,), generator=g).tolist() * 6)[: 24 + 3 * i] for i in range(4)]
MAX_TOKENS = 24

PATCH = """
from vllm_dflash.adaptive import controller as C
from vllm_dflash.integration import proposer as P
P._test_full = {full}
P._test_blocks = []
P._test_order = {{}}  # request id -> order of arrival in this run
if not getattr(P, "_test_patched", False):  # the runs share a process: patch once
    P._test_patched = True
    _plan = C.AdaptiveController.plan
    def _fixed(self, req_ids, *a, **k):
        p = _plan(self, req_ids, *a, **k)
        order = P._test_order
        for r in req_ids:
            order.setdefault(r, len(order))
        fixed = {{0: ("dflash", 2), 1: ("none", 0), 2: ("dflash", 5), 3: ("merged", self.k_max)}}
        p.sources = [fixed[order[r] % 4][0] for r in req_ids]
        p.ks = [fixed[order[r] % 4][1] for r in req_ids]
        p.drop_context = False
        return p
    C.AdaptiveController.plan = _fixed
    _positions = P.verified_positions
    P.verified_positions = lambda *a, **k: None if P._test_full else _positions(*a, **k)
    _block = P.DFlashDrafter._block
    def _rec(self, draft, rows, select=None, spans=None):
        out = _block(self, draft, rows, select, spans)
        ids = self._runner.input_batch.req_ids
        P._test_blocks.append({{"mask": int(self.parallel_drafting_token_id),
                               "rows": {{str(P._test_order[ids[r]]): [list(spans[r]), out[i].tolist()]
                                        for i, r in enumerate(rows) if r in spans}}}})
        return out
    P.DFlashDrafter._block = _rec
"""
PROBE = """
from vllm_dflash.integration import proposer as P
probe["blocks"] = P._test_blocks
"""


@pytest.fixture(scope="module")
def results(pair):
    spec = {"method": "dflash", "model": str(pair / "draft-b8"), "num_speculative_tokens": 7, "adaptive": True}
    common = {"model": str(pair / "target"), "prompts": PROMPTS, "max_tokens": MAX_TOKENS}
    env = {"DFLASH_CPU_GEMM_F32": "all"}  # our fp32 GEMM on every row count: a row's result ignores its neighbours
    runs = [common,
            {**common, "speculative_config": spec, "patch": PATCH.format(full=False), "after": PROBE, "env": env},
            {**common, "speculative_config": spec, "patch": PATCH.format(full=True), "after": PROBE, "env": env}]
    base, trimmed, full = run_vllm(runs)
    return {"base": base, "trimmed": trimmed, "full": full}


def test_output_is_the_targets(results):
    assert results["trimmed"]["tokens"] == results["base"]["tokens"]
    assert results["full"]["tokens"] == results["base"]["tokens"]


def test_verified_slots_equal_the_full_argmax(results):
    trimmed, full = results["trimmed"]["probe"]["blocks"], results["full"]["probe"]["blocks"]
    assert trimmed and len(trimmed) == len(full)
    for i, (a, b) in enumerate(zip(trimmed, full)):
        assert a["rows"].keys() == b["rows"].keys(), i
        for req, ((lo, hi), drafts) in a["rows"].items():
            assert b["rows"][req][0] == [lo, hi]
            assert drafts[lo:hi] == b["rows"][req][1][lo:hi], (i, req, lo, hi)


def test_slots_left_out_hold_the_mask_in_the_trimmed_run_only(results):
    def left_out(blocks):
        return [t for b in blocks for (lo, hi), d in b["rows"].values() for t in d[:lo] + d[hi:]]

    trimmed, full = results["trimmed"]["probe"]["blocks"], results["full"]["probe"]["blocks"]
    mask = trimmed[0]["mask"]
    assert any(hi - lo < 7 for b in trimmed for (lo, hi), _ in b["rows"].values())  # the plan left slots out
    assert left_out(trimmed) and all(t == mask for t in left_out(trimmed))
    assert any(t != mask for t in left_out(full))  # the control drafted them
