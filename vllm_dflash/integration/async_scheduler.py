# SPDX-License-Identifier: Apache-2.0
"""`AdaptiveAsyncScheduler`: vLLM's AsyncScheduler with per-request draft lengths (adaptive drafting + overlap).

vLLM's AsyncScheduler gives every decoding request the same number of draft placeholders for the next step
(`spec_token_ids = [-1] * K`), and the next `schedule()` verifies exactly that many drafts of it. We subclass it
(set through vLLM's own `scheduler_config.scheduler_cls`, no monkey-patch) and, after vLLM has placed its
placeholders, replace each request's list with k_r placeholders from `LengthPlanner` (k_r = 0: no speculation).
The runner already handles per-request draft counts under async scheduling (`_prepare_input_ids` takes the first
k_r of the request's previous drafts), and the drafter still proposes a full block for everyone (its source choice:
DFlash block, prompt lookup or the two merged). When every k_r is 0 the step asks the drafter for no drafts at all
(`num_spec_tokens_to_schedule = 0`), so no draft forward runs. The planner learns from `update_from_output`: drafts
scheduled vs tokens produced per request, and the time between step outputs; where prompt lookup is a source, it
keeps those rates per context (does prompt lookup find a match in the request's tokens as the scheduler knows them). vLLM internals read: docs/CONTRACTS.md.
"""
from __future__ import annotations

from vllm.v1.core.sched.async_scheduler import AsyncScheduler

import numpy as np

from vllm_dflash.adaptive.lengths import LengthPlanner
from vllm_dflash.adaptive.ngram import prompt_lookup
from vllm_dflash.integration.drafting.mode import ADAPTIVE_SCHEDULER, drafting_mode
from vllm_dflash.serve.metrics import MetricsSink

QUALNAME = ADAPTIVE_SCHEDULER


class AdaptiveAsyncScheduler(AsyncScheduler):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._k_max = self.num_spec_tokens
        self._metrics = MetricsSink.get(self.vllm_config)
        from vllm_dflash.settings import from_vllm_config

        settings = from_vllm_config(self.vllm_config)
        self.planner = LengthPlanner(self._k_max, metrics=self._metrics, guard_threshold=settings.guard_threshold,
                                     guard_margin=settings.guard_margin, guard_confirm=settings.guard_confirm)
        self._placeholder_lists = [[-1] * k for k in range(self._k_max + 1)]  # shared read-only, as vLLM's
        self._next_decision: tuple | None = None  # the plan that set the coming step's drafts
        self._decisions: dict[int, tuple | None] = {}  # id(scheduler_output) -> its plan
        self._outputs = 0
        # prompt lookup is a source: plan per match context (setting `adaptive`, vllm_config.additional_config)
        self._lookup = drafting_mode(self.vllm_config, check=False).looks_up
        self._tokens: dict[str, tuple[np.ndarray, int]] = {}  # req_id -> (token ids buffer, length)

    def _update_after_schedule(self, scheduler_output) -> None:
        super()._update_after_schedule(scheduler_output)
        if not self._k_max:
            return
        if len(self._decisions) > 64:  # outputs that never came back (e.g. empty steps): do not leak
            self._decisions.clear()
        self._decisions[id(scheduler_output)] = self._next_decision
        decode, prefill_tokens = [], 0
        for req_id, n in scheduler_output.num_scheduled_tokens.items():
            request = self.requests[req_id]
            if request.is_prefill_chunk:
                prefill_tokens += n  # its next chunk likely shares the next step: a cost the plan sees
            else:
                decode.append(request)
        contexts = [self._context(r) for r in decode] if self._lookup else None
        # sampled requests (vLLM: greedy below a temperature of 1e-5) are planned from sampled requests' rates
        sampled = [r.sampling_params is not None and r.sampling_params.temperature >= 1e-5 for r in decode]
        ks, self._next_decision = self.planner.plan([r.request_id for r in decode], extra_tokens=prefill_tokens,
                                                    contexts=contexts, sampled=sampled)
        for request, k in zip(decode, ks):
            request.spec_token_ids = self._placeholder_lists[k]
        # the drafter drafts the whole block whenever anyone verifies (its block is trained at that size);
        # nobody: no drafts, no draft forward (the context K/V injection still runs)
        scheduler_output.num_spec_tokens_to_schedule = self._k_max if any(ks) else 0
        self._metrics.flush()

    def _context(self, request) -> str:
        """'match' if prompt lookup finds a continuation in the request's committed tokens, else 'nomatch'."""
        rid = request.request_id
        buf, n = self._tokens.get(rid, (None, 0))
        total = request.num_tokens
        if buf is None or total > len(buf):
            grown = np.empty(max(2 * total, 256), dtype=np.int64)
            if buf is not None:
                grown[:n] = buf[:n]
            buf = grown
        if total > n:
            buf[n:total] = request.all_token_ids[n:total]
        self._tokens[rid] = (buf, total)
        return "match" if len(prompt_lookup(buf[:total], 1)) else "nomatch"

    def update_from_output(self, scheduler_output, model_runner_output):
        if self._k_max:
            self._observe(scheduler_output, model_runner_output)
        return super().update_from_output(scheduler_output, model_runner_output)

    def _observe(self, so, mro) -> None:
        sampled, index = mro.sampled_token_ids, mro.req_id_to_index
        spec = so.scheduled_spec_decode_tokens
        outcomes, produced, num_spec = [], 0, 0
        for req_id in so.num_scheduled_tokens:
            i = index.get(req_id)
            if i is None or i >= len(sampled):
                continue
            got = len(sampled[i])
            produced += got
            k = len(spec.get(req_id, ()))
            num_spec += k
            if k and got:
                outcomes.append((req_id, k, got - 1))
        decode_only = (not so.scheduled_new_reqs
                       and so.total_num_scheduled_tokens == len(so.num_scheduled_tokens) + num_spec)
        self.planner.observe(self._decisions.pop(id(so), None), outcomes, so.total_num_scheduled_tokens, produced,
                             decode_only, num_reqs=len(so.num_scheduled_tokens))
        self._outputs += 1
        if self._outputs % 64 == 0:
            self.planner.forget(self.requests)
            for rid in [r for r in self._tokens if r not in self.requests]:
                del self._tokens[rid]
