# SPDX-License-Identifier: Apache-2.0
"""Patch: each new request's cache_salt reaches our drafter, so cross-request lookup keeps tenants apart (engines
with our drafter only)."""
from __future__ import annotations

import functools

from vllm_dflash.integration.patches.base import Patch, acts_for


def apply() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_dflash.adaptive.cross_lookup import SALT_ATTR

    orig = Scheduler.add_request
    if getattr(orig, "_vllm_dflash_patched", False):
        return

    @functools.wraps(orig)
    def add_request(self, request):
        params = request.sampling_params
        if params is not None and acts_for(self, "dflash"):
            # not a SamplingParams field: never serialised, so no client can set it (dict=True allows attributes)
            setattr(params, SALT_ATTR, request.cache_salt or None)  # "": unsalted, as in vLLM's block hashes
        return orig(self, request)

    add_request._vllm_dflash_patched = True
    Scheduler.add_request = add_request


PATCH = Patch(
    symbol="vllm.v1.core.sched.scheduler.Scheduler.add_request",
    why="cross-request lookup (setting cross_lookup, adaptive/cross_lookup.py) drafts a request from other requests' "
        "tokens; it must keep to the request's tenant, as vLLM's prefix cache does (its block hashes include the "
        "cache_salt), or a draft's acceptance would tell one user whether their text matched another's. vLLM does "
        "not send cache_salt to the worker; the request's SamplingParams is the object the runner's request state "
        "holds where the drafter runs in the engine core (the `uni` executor, the only place the index is used), so "
        "the salt is set on it as an attribute as the request arrives, for engines with our drafter",
    removal="when vLLM passes cache_salt to the worker (NewRequestData / CachedRequestState)",
    apply=apply,
)
