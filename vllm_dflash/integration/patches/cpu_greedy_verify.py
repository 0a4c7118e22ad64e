# SPDX-License-Identifier: Apache-2.0
"""Patch: on CPU, an all-greedy speculative step is verified with one argmax pass (integration/greedy_verify.py).

vLLM's rejection sampler copies the target logits three to four times on its greedy path (bonus rows through the
full sampler, target rows gathered, converted to float32, cloned) and then takes their argmax with torch's slower
argmax. On CPU those copies cost more than the verification itself (8 ms of a 125 ms step at batch 32, 2-core
Xeon). `RejectionSampler.forward` is wrapped: when the logits are on the CPU and `greedy_verify.eligible` holds (all
greedy, no logprobs, no penalties, bad words, allowed-token masks, active argmax-changing logits processors or
thinking budget, no synthetic acceptance), the output is `greedy_verify.greedy_verify`; otherwise vLLM's forward runs
unchanged. Both drafters (ours and vLLM's n-gram, EAGLE, ...) benefit; the output is the same tensor."""
from __future__ import annotations

import functools

from vllm_dflash.integration.patches.base import Patch, acts_for


def apply() -> None:
    from vllm.v1.outputs import SamplerOutput
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    from vllm_dflash.integration.greedy_verify import eligible, greedy_verify

    orig = RejectionSampler.forward
    if getattr(orig, "_vllm_dflash_patched", False):
        return

    @functools.wraps(orig)
    def forward(self, metadata, draft_probs, logits, sampling_metadata):
        if logits is not None and logits.device.type == "cpu" and self.__dict__.get("_vllm_dflash_on", False) and \
                eligible(sampling_metadata, getattr(self, "synthetic_mode", False)):
            self._vllm_dflash_greedy_steps = getattr(self, "_vllm_dflash_greedy_steps", 0) + 1
            return SamplerOutput(sampled_token_ids=greedy_verify(metadata, logits), logprobs_tensors=None)
        return orig(self, metadata, draft_probs, logits, sampling_metadata)

    sample = CPUModelRunner._sample

    @functools.wraps(sample)
    def _sample(self, logits, spec_decode_metadata):
        # the sampler has no config: its runner (one engine) says whether this engine gets the speed-up
        sampler = getattr(self, "rejection_sampler", None)
        if sampler is not None and "_vllm_dflash_on" not in sampler.__dict__:
            sampler._vllm_dflash_on = acts_for(self, "speedup")
        return sample(self, logits, spec_decode_metadata)

    forward._vllm_dflash_patched = True
    RejectionSampler.forward = forward
    CPUModelRunner._sample = _sample


PATCH = Patch(
    symbol="vllm.v1.sample.rejection_sampler.RejectionSampler.forward (wrapped; CPUModelRunner._sample wrapped to "
           "tell it whether its engine gets the speed-up)",
    why="on CPU its all-greedy path copies the target logits 3-4 times and uses torch's slow argmax; an eligible "
        "all-greedy batch is verified with one argmax pass over the logits and the greedy rule on the host "
        "(integration/greedy_verify.py), the same output tensor",
    removal="when vLLM's CPU rejection sampler takes the argmax of the logits in place for all-greedy batches",
    apply=apply,
    kind="speedup",
)
