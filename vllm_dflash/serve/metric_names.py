# SPDX-License-Identifier: Apache-2.0
"""The names, help texts and histogram buckets of our Prometheus metrics (all prefixed `vllm_dflash:`; see
docs/METRICS.md): what a `MetricsSink` accumulates, a snapshot holds and the collector exports."""
from __future__ import annotations

PREFIX = "vllm_dflash:"
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
ACCEPT_BUCKETS = tuple(float(i) for i in range(0, 17))

HISTOGRAMS = {
    "draft_forward_seconds": ("Draft forward time per drafting step (all denoising passes).", LATENCY_BUCKETS),
    "kv_injection_seconds": ("Context K/V injection time per drafting step.", LATENCY_BUCKETS),
    "target_forward_seconds": ("Target model forward time per engine step (verification included); recorded with "
                               "DFLASH_PROFILE=1 on CPU only.", LATENCY_BUCKETS),
    "accepted_tokens_per_step": ("Accepted draft tokens per request per verify step.", ACCEPT_BUCKETS),
    "draft_tokens_per_request": ("Adaptive drafting: draft tokens chosen per request per step (0 = none).",
                                 ACCEPT_BUCKETS),
}
GAUGES = {
    "block_size": "Block size in use (anchor + draft tokens per request).",
    "diffusion_steps": "Denoising passes per draft block.",
    "cost_fixed_ms": "Adaptive drafting: fitted fixed cost of a step (alpha of T = alpha + beta*n + delta*B + "
                     "gamma*m), ms.",
    "cost_per_token_ms": "Adaptive drafting: fitted cost per query token of a step (beta), ms.",
    "cost_per_request_ms": "Adaptive drafting: fitted cost per request of a step beyond its query tokens (delta), ms.",
    "cost_per_output_token_ms": "Adaptive drafting: fitted cost per token a step produced (gamma), ms.",
    "guard_plan_tokens_per_s": "Adaptive drafting: measured output tokens/s while speculating per the plan.",
    "guard_off_tokens_per_s": "Adaptive drafting: measured output tokens/s without speculation (the guard's other "
                              "arm).",
}
COUNTERS = {
    "draft_steps": "Drafter invocations (one per engine step with drafting).",
    "request_steps": "Adaptive drafting: request-steps (a request's share of an engine step that gave it a token); "
                     "generated tokens / request-steps = tokens per target forward.",
    "proposals_dflash": "Adaptive drafting: request-steps that verified a DFlash block.",
    "proposals_ngram": "Adaptive drafting: request-steps that verified a prompt-lookup (n-gram) proposal.",
    "proposals_merged": "Adaptive drafting: request-steps that verified a merged proposal (prompt-lookup tokens first, "
                        "the DFlash block after them).",
    "proposals_none": "Adaptive drafting: request-steps without speculation (k = 0).",
    "drafted_tokens_dflash": "Adaptive drafting: DFlash draft tokens sent to verification.",
    "drafted_tokens_ngram": "Adaptive drafting: prompt-lookup draft tokens sent to verification.",
    "drafted_tokens_merged": "Adaptive drafting: merged-proposal draft tokens sent to verification.",
    "accepted_tokens_dflash": "Adaptive drafting: accepted DFlash draft tokens.",
    "accepted_tokens_ngram": "Adaptive drafting: accepted prompt-lookup draft tokens.",
    "accepted_tokens_merged": "Adaptive drafting: accepted merged-proposal draft tokens.",
    "cross_lookups": "Adaptive drafting: prompt-lookup continuations found in other requests' tokens where the "
                     "request's own history had none (setting cross_lookup), counted when planned.",
    "context_dropped_steps": "Adaptive drafting: steps whose context rows were dropped because no speculation was "
                             "measured faster at that batch size (their requests draft by prompt lookup only).",
    "context_released": "Adaptive drafting: requests that released their draft context after a lease of decode steps "
                        "without a DFlash token, where keeping the context rows cost a measurable share of a step "
                        "(they draft by prompt lookup only from then on).",
}
SKIPPED = "metrics_snapshots_skipped"  # counted by the collector itself, not merged from snapshots
SKIPPED_DOC = ("Files in the metrics folder that were not valid snapshots (wrong shape, unreadable) and were left out "
               "of these metrics; each distinct file (name, modification time, size) counts once.")
