# SPDX-License-Identifier: Apache-2.0
"""Real vLLM under a fixed adaptive plan, for the tests of the draft forward's trimming (tests/vllm/
test_vllm_block_rows.py, test_vllm_block_slots.py): `from support.block_plan import block_prompts, run_fixed_plan`.

Three runs in one process: the target alone, our drafter under the plan, and the same with one of the drafter's
trimming helpers forced off (the control). Every call of the draft forward records, per request that verifies DFlash
tokens (by order of arrival): [its span (lo, hi), its [K] drafts], with the rows the forward ran over (`ran`), the
batch rows (`batch`) and the mask id (`mask`)."""
from __future__ import annotations

import torch

from support.vllm_helpers import run_vllm

# plan: order of arrival % len(plan) -> (source, k); k None = k_max. control: the drafter's trimming helper (a
# block_rows.py function, patched where the drafter calls it: CONTROL_HOME) forced to return None (the untrimmed path)
# in the control run
CONTROL_HOME = {"block_subset": "vllm_dflash.integration.proposer",
                "verified_positions": "vllm_dflash.integration.drafting.step"}
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
        fixed = [fixed_plan[order[r] % len(fixed_plan)] for r in req_ids]
        p.sources = [s for s, _ in fixed]
        p.ks = [self.k_max if k is None else k for _, k in fixed]
        p.drop_context = False
        return p
    fixed_plan = {plan!r}
    C.AdaptiveController.plan = _fixed
    import importlib
    _home = importlib.import_module({home!r})  # the module whose global the drafter calls
    _helper = getattr(_home, {control!r})
    setattr(_home, {control!r}, lambda *a, **k: None if P._test_full else _helper(*a, **k))
    from vllm_dflash.integration.drafting.adaptive import AdaptiveDrafting
    _block = AdaptiveDrafting._block
    def _rec(self, step, rows, select=None, spans=None):
        out = _block(self, step, rows, select, spans)
        d = self.drafter
        ids = d._runner.input_batch.req_ids
        used = set(spans) if spans is not None else set(select or rows)
        P._test_blocks.append({{
            "ran": step.block_rows, "batch": len(rows), "mask": int(d.parallel_drafting_token_id),
            "rows": {{str(P._test_order[ids[r]]): [list(spans[r]) if spans else None, out[i].tolist()]
                     for i, r in enumerate(rows) if r in used}}}})
        return out
    AdaptiveDrafting._block = _rec
"""
PROBE = """
from vllm_dflash.integration import proposer as P
probe["blocks"] = P._test_blocks
"""


def block_prompts(seed: int, n: int = 4) -> list[list[int]]:
    """n prompts of repeated 5-token patterns (prompt lookup finds matches), 24 + 3 i tokens long."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(4, 384, (5,), generator=g).tolist() * 6)[: 24 + 3 * i] for i in range(n)]


def run_fixed_plan(pair, adaptive, plan: list[tuple[str, int | None]], control: str, prompts, max_tokens: int) -> dict:
    """-> {"base": target alone, "test": our drafter under `plan`, "control": the same with `control` forced off}."""
    spec = {"method": "dflash", "model": str(pair / "draft-b8"), "num_speculative_tokens": 7, "adaptive": adaptive}
    common = {"model": str(pair / "target"), "prompts": prompts, "max_tokens": max_tokens}
    env = {"DFLASH_CPU_GEMM_F32": "all"}  # our fp32 GEMM on every row count: a row's result ignores its neighbours
    home = CONTROL_HOME[control]
    patches = [PATCH.format(full=full, plan=plan, control=control, home=home) for full in (False, True)]
    runs = [common] + [{**common, "speculative_config": spec, "patch": patch, "after": PROBE, "env": env}
                       for patch in patches]
    base, test, control_run = run_vllm(runs)
    return {"base": base, "test": test, "control": control_run}
