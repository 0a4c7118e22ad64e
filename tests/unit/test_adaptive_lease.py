# SPDX-License-Identifier: Apache-2.0
"""The context lease: a request given no DFlash token for a while releases its draft context, where keeping it costs."""
import numpy as np

from vllm_dflash.adaptive.controller import AdaptiveController
from vllm_dflash.integration.deferred_context import kept_rows

COPY = np.tile(np.arange(10), 8)  # a history prompt lookup always continues (so the plan never needs the block)


def _run(c: AdaptiveController, steps: int, hists: dict[str, np.ndarray]) -> list:
    plans = []
    for _ in range(steps):
        ids = list(hists)
        plan = c.plan(ids, [hists[r] for r in ids], query_tokens=len(ids), decode_only=True)
        c.propose(plan, np.zeros((len(ids), c.k_max), dtype=np.int64) if plan.needs_block else None)
        plans.append(plan)
    return plans


def test_a_request_living_on_lookup_releases_its_context_where_rows_cost():
    """Injection at 1 ms a row against ~30 ms steps (the 2 % share is passed): after `lease_steps` steps on prompt
    lookup alone the request is stale (its rows are no longer kept), and it is planned without DFlash tokens."""
    c = AdaptiveController(4, mode="both")
    c.observe_injection(100, 0.1)
    _run(c, c.lease_steps - 1, {"copy": COPY})
    assert c.wants_context("copy")
    _run(c, 1, {"copy": COPY})
    assert not c.wants_context("copy") and c.stale == {"copy"}
    c.finished(["copy"])
    assert c.wants_context("copy") and not c.stale


def test_no_release_where_rows_are_cheap_or_nothing_was_measured():
    """At 1 us a row (concurrency 1: well under 2 % of a step) or before any injection was timed, the lease never
    runs out: a request's DFlash tokens may be worth far more after a long prompt-lookup span."""
    cheap = AdaptiveController(4, mode="both")
    cheap.observe_injection(1000, 0.001)
    unknown = AdaptiveController(4, mode="both")
    for c in (cheap, unknown):
        _run(c, 3 * c.lease_steps, {"copy": COPY})
        assert c.wants_context("copy") and not c.stale


def test_a_request_given_dflash_tokens_keeps_its_lease():
    """Fresh random tokens (never a lookup match) whose DFlash drafts the target accepts: the plan keeps giving the
    request the block, which renews its lease."""
    t = [0.0]
    c = AdaptiveController(4, mode="both", clock=lambda: t[0])
    c.observe_injection(100, 0.1)
    rng = np.random.default_rng(0)
    hist = rng.integers(1000, 100000, size=200)
    blocks = 0
    for _ in range(2 * c.lease_steps):
        t[0] += 0.03  # every step 30 ms, whatever it verifies: drafts are free to verify
        plan = c.plan(["free"], [hist], query_tokens=1, decode_only=True)
        block = rng.integers(1000, 100000, size=(1, c.k_max))
        (toks,) = c.propose(plan, block if plan.needs_block else None)
        blocks += plan.needs_block
        hist = np.concatenate([hist, toks, rng.integers(1000, 100000, size=1)])  # all drafts accepted, then a bonus
    assert blocks >= 2 * c.lease_steps - c.guard.window  # every step but the guard's one window of 'off'
    assert c.wants_context("free")


def test_dflash_mode_never_releases():
    """Adaptive 'dflash' has no other source: a stale request could never draft again, so there is no lease."""
    c = AdaptiveController(4, mode="dflash")
    c.observe_injection(100, 0.1)
    assert c.lease_steps == 0
    _run(c, 100, {"copy": COPY})
    assert c.wants_context("copy")


def test_kept_rows_selects_the_rows_of_kept_requests():
    qsl = [0, 3, 4, 9]  # three requests: 3, 1 and 5 rows
    assert kept_rows(qsl, [True, True, True]) is None
    assert kept_rows(qsl, [True, False, True]) == [0, 1, 2, 4, 5, 6, 7, 8]
    assert kept_rows(qsl, [False, True, False]) == [3]
    assert kept_rows(qsl, [False, False, False]) == []

