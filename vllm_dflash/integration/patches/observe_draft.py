# SPDX-License-Identifier: Apache-2.0
"""Patch: a per-request accepted-length histogram beside vLLM's per-batch acceptance counters (engines with our
drafter only)."""
from __future__ import annotations

import functools

from vllm_dflash.integration.patches.base import Patch, acts_for


def apply() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_dflash.serve.metrics import MetricsSink

    orig = Scheduler.make_spec_decoding_stats
    if getattr(orig, "_vllm_dflash_patched", False):
        return

    @functools.wraps(orig)
    def make_spec_decoding_stats(self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens,
                                 num_invalid_spec_tokens, request_id):
        out = orig(self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens, num_invalid_spec_tokens,
                   request_id)
        if out is not None and acts_for(self, "dflash"):  # None: no stats logged or no draft verified
            sink = MetricsSink.get(self.vllm_config)
            sink.observe("accepted_tokens_per_step", float(num_accepted_tokens))
            sink.flush()
        return out

    make_spec_decoding_stats._vllm_dflash_patched = True
    Scheduler.make_spec_decoding_stats = make_spec_decoding_stats


PATCH = Patch(
    symbol="vllm.v1.core.sched.scheduler.Scheduler.make_spec_decoding_stats",
    why="vLLM aggregates acceptance per batch; we also record accepted tokens per request per verify step "
        "(histogram vllm_dflash:accepted_tokens_per_step), in the engine-core process, for engines with our drafter "
        "(the scheduler holds the engine's config; SpecDecodingStats, which vLLM fills here, does not)",
    removal="when vLLM exports a per-request accepted-length histogram",
    apply=apply,
)
