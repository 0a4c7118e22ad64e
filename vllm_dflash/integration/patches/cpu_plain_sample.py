# SPDX-License-Identifier: Apache-2.0
"""Patch: a speculative step in which no request verifies a draft samples with vLLM's plain sampler.

With a speculative config, vLLM's V1 runner sends every step through the rejection sampler, drafts or not. On CPU
that path costs more than the plain sampler (bonus-token indexing, float32 copies of the target logits, its own
logprob handling) for the same result when the batch verifies nothing: each request's one sampled token comes from
its last position's logits. Adaptive drafting verifies nothing in most request-steps at high concurrency, and its
guard turns whole stretches of steps off, so those steps now cost what a step without speculation costs.

The shortcut is the runner's own non-speculative branch (`_sample(logits, None)`): same logits rows (with no drafts
the speculative logits indices are the last query token of every request, as without speculation), same sampler,
same generators, same output shape ([num_reqs, 1]), so greedy and seeded outputs are those of the plain path."""
from __future__ import annotations

import functools

from vllm_dflash.integration.patches.base import Patch, acts_for


def apply() -> None:
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    orig = CPUModelRunner._sample
    if getattr(orig, "_vllm_dflash_patched", False):
        return

    @functools.wraps(orig)
    def _sample(self, logits, spec_decode_metadata):
        if spec_decode_metadata is not None and spec_decode_metadata.max_spec_len == 0 and acts_for(self, "speedup"):
            self._vllm_dflash_plain_samples = getattr(self, "_vllm_dflash_plain_samples", 0) + 1
            return orig(self, logits, None)
        return orig(self, logits, spec_decode_metadata)

    _sample._vllm_dflash_patched = True
    CPUModelRunner._sample = _sample


PATCH = Patch(
    symbol="vllm.v1.worker.cpu_model_runner.CPUModelRunner._sample (wrapped)",
    why="with a speculative config every step goes through the rejection sampler, also when the batch verifies no "
        "draft; such a step now takes the runner's plain sampling branch (same logits rows, sampler and "
        "generators), so speculation steps that draft nothing cost what steps without speculation cost",
    removal="when vLLM's runner skips the rejection sampler for batches without drafts",
    apply=apply,
    kind="speedup",
)
