# SPDX-License-Identifier: Apache-2.0
"""Patch: a per-request accepted-length histogram beside vLLM's per-batch acceptance counters."""
from __future__ import annotations

from vllm_dflash.integration.patches.base import Patch


def apply() -> None:
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    from vllm_dflash.serve.metrics import MetricsSink

    orig = SpecDecodingStats.observe_draft
    if getattr(orig, "_vllm_dflash_patched", False):
        return

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int):
        orig(self, num_draft_tokens, num_accepted_tokens)
        sink = MetricsSink.get()
        sink.observe("accepted_tokens_per_step", float(num_accepted_tokens))
        sink.flush()

    observe_draft._vllm_dflash_patched = True
    SpecDecodingStats.observe_draft = observe_draft


PATCH = Patch(
    symbol="vllm.v1.spec_decode.metrics.SpecDecodingStats.observe_draft",
    why="vLLM aggregates acceptance per batch; we also record accepted tokens per request per verify step "
        "(histogram vllm_dflash:accepted_tokens_per_step), in the engine-core process.",
    removal="when vLLM exports a per-request accepted-length histogram",
    apply=apply,
)
