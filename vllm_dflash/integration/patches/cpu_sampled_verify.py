# SPDX-License-Identifier: Apache-2.0
"""Patch: on CPU, an all-sampled speculative step draws the recovered token only where it is used
(integration/sampled_verify.py).

vLLM's `rejection_sample` draws a recovered token at every draft position ([T, V] exponentials and a softmax of
every target row) although each request uses at most one; on CPU that made a sampled speculative step's rejection
sampling 10× the plain sampler (dev/studies/rejection_cost.py), so sampled requests lost speed with any drafter.
The module function `rejection_sample` is replaced by a wrapper: in an engine where the plugin acts, for CPU logits,
an all-sampled batch and no synthetic acceptance, it returns `sampled_verify.rejection_sample_sampled` (same rule,
same distribution); everything else calls vLLM's function unchanged. `RejectionSampler.forward` is wrapped only to
say, for the duration of the call, whether its engine gets the speed-up (`_vllm_dflash_on`, set on the sampler by
cpu_greedy_verify's runner hook)."""
from __future__ import annotations

import contextvars
import functools
import time

from vllm_dflash.integration.patches.base import Patch

# during a RejectionSampler.forward call: {"on": its engine gets the speed-up, "used": our path ran}
_CALL: contextvars.ContextVar[dict | None] = contextvars.ContextVar("vllm_dflash_sampled_verify", default=None)


def eligible(sampling_metadata, target_logits, synthetic_mode: bool) -> bool:
    call = _CALL.get()
    return (call is not None and call["on"] and not synthetic_mode and bool(sampling_metadata.all_random)
            and target_logits.device.type == "cpu")


def apply() -> None:
    from vllm.v1.sample import rejection_sampler as rs

    from vllm_dflash.integration.sampled_verify import rejection_sample_sampled

    orig_fn = rs.rejection_sample
    if getattr(orig_fn, "_vllm_dflash_sampled_patched", False):
        return

    @functools.wraps(orig_fn)
    def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                         target_logits, bonus_token_ids, sampling_metadata, synthetic_mode=False,
                         synthetic_conditional_rates=None, use_fp64_gumbel=False):
        if eligible(sampling_metadata, target_logits, synthetic_mode):
            _CALL.get()["used"] = True
            return rejection_sample_sampled(
                draft_token_ids, num_draft_tokens, max_spec_len, draft_probs, target_logits, bonus_token_ids,
                sampling_metadata.generators,
                lambda: rs.generate_uniform_probs(draft_token_ids.shape[0], num_draft_tokens,
                                                  sampling_metadata.generators, target_logits.device))
        return orig_fn(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                       target_logits, bonus_token_ids, sampling_metadata, synthetic_mode=synthetic_mode,
                       synthetic_conditional_rates=synthetic_conditional_rates, use_fp64_gumbel=use_fp64_gumbel)

    orig_forward = rs.RejectionSampler.forward

    @functools.wraps(orig_forward)
    def forward(self, metadata, draft_probs, logits, sampling_metadata):
        call = {"on": bool(self.__dict__.get("_vllm_dflash_on", False)), "used": False}
        token = _CALL.set(call)
        t0 = time.perf_counter()
        try:
            return orig_forward(self, metadata, draft_probs, logits, sampling_metadata)
        finally:
            _CALL.reset(token)
            if call["used"]:  # steps verified here (tests read it)
                self._vllm_dflash_sampled_steps = getattr(self, "_vllm_dflash_sampled_steps", 0) + 1
            if call["on"] and not sampling_metadata.all_greedy and metadata.max_spec_len > 0:
                # seconds per verified row (drafts + bonus rows) of a step with sampled requests, as an EMA: what a
                # sampled request's draft costs in verification (the adaptive planner charges it: AdaptiveController
                # .sampled_row_s)
                rows = len(metadata.draft_token_ids) + len(metadata.num_draft_tokens)
                row_s = (time.perf_counter() - t0) / max(rows, 1)
                old = self.__dict__.get("_vllm_dflash_sampled_row_s")
                self._vllm_dflash_sampled_row_s = row_s if old is None else 0.8 * old + 0.2 * row_s

    rejection_sample._vllm_dflash_sampled_patched = True
    forward._vllm_dflash_sampled_patched = True
    rs.rejection_sample = rejection_sample
    rs.RejectionSampler.forward = forward


PATCH = Patch(
    symbol="vllm.v1.sample.rejection_sampler.rejection_sample (replaced by a wrapper; RejectionSampler.forward "
           "wrapped to pass whether its engine gets the speed-up)",
    why="on CPU it draws a recovered token at every draft position ([T, V] exponentials, a softmax of every target "
        "row) though a request uses at most one: 33 ms against the plain sampler's 3 ms at batch 8, K = 7 "
        "(dev/studies/rejection_cost.py); an all-sampled batch gets the same rule and distribution with the "
        "recovered token drawn only at each request's first rejection (integration/sampled_verify.py)",
    removal="when vLLM's CPU rejection sampler draws recovered tokens lazily",
    apply=apply,
    kind="speedup",
)
