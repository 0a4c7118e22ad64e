# SPDX-License-Identifier: Apache-2.0
"""Patch: a prefix-cache reset also empties the cross-request lookup index (engines with our drafter only)."""
from __future__ import annotations

import functools

from vllm_dflash.integration.patches.base import Patch, acts_for


def apply() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_dflash.adaptive.cross_lookup import note_prefix_cache_reset

    orig = Scheduler.reset_prefix_cache
    if getattr(orig, "_vllm_dflash_patched", False):
        return

    @functools.wraps(orig)
    def reset_prefix_cache(self, *args, **kwargs):
        ok = orig(self, *args, **kwargs)
        if ok and acts_for(self, "dflash"):
            note_prefix_cache_reset()
        return ok

    reset_prefix_cache._vllm_dflash_patched = True
    Scheduler.reset_prefix_cache = reset_prefix_cache


PATCH = Patch(
    symbol="vllm.v1.core.sched.scheduler.Scheduler.reset_prefix_cache",
    why="the cross-request lookup index (setting cross_lookup, adaptive/cross_lookup.py) holds earlier requests' "
        "tokens; it lives as long as the prefix cache, so that a benchmark that resets the cache between waves does "
        "not find each repeated prompt's own earlier answer. A successful reset bumps the index's epoch in the "
        "engine-core process, for engines with our drafter",
    removal="when vLLM's drafters get a reset hook (or when cross-request lookup moves into vLLM)",
    apply=apply,
)
