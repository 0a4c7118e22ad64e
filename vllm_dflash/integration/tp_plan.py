# SPDX-License-Identifier: Apache-2.0
"""The adaptive plan across tensor-parallel ranks: every TP rank runs its own adaptive controller on the same tokens,
but with its own wall clock, and the draft forward holds collectives; so TP rank 0's plan is broadcast and adopted by
every rank before the forward is decided (`StepPlan.encode` / `StepPlan.adopt`). Used by
integration/drafting/adaptive.py."""
from __future__ import annotations

import torch


def tp_group():
    """vLLM's tensor-parallel group of this worker when TP > 1; None at TP = 1 (and without vLLM's distributed
    state, e.g. a drafter built by a test)."""
    try:
        from vllm.distributed.parallel_state import get_tp_group, model_parallel_is_initialized

        if not model_parallel_is_initialized():
            return None
        group = get_tp_group()
    except Exception:  # noqa: BLE001 - no distributed state: a single rank
        return None
    return group if group.world_size > 1 else None


def sync_plan_across_tp(plan, group):
    """Every TP rank adopts TP rank 0's adaptive plan (sources, lengths, whether the draft forward runs), so the
    forward, with its all-reduces / all-gathers, runs on every rank or on none, whatever made the plans differ (each
    rank's own wall clock today). One [2 * B + 1] int64 broadcast over the TP CPU group (gloo; no device sync).
    group None (TP = 1): the plan as it is, no communication.

    Invariant: every rank of the group reaches this call at the same drafting step (the batch, K and the query
    tokens are identical on all ranks, so the drafter's early returns are too). -> the plan (adopted in place)."""
    if group is None:
        return plan
    code = torch.from_numpy(plan.encode())
    torch.distributed.broadcast(code, src=group.ranks[0], group=group.cpu_group)
    if group.rank_in_group != 0:
        plan.adopt(code.numpy())
    return plan
