# SPDX-License-Identifier: Apache-2.0
"""The names, help texts, labels and histogram buckets of our Prometheus metrics (all prefixed `vllm_dflash:`; see
docs/METRICS.md): what a `MetricsSink` accumulates, a snapshot holds and the collector exports.

Every series carries vLLM's own labels (`IDENTITY`: `model_name`, the served model name, and `engine`, the engine's
index), as vLLM's series do, so PromQL can divide one by the other. A family in `LABELS` has labels of its own after
them (the proposal source, the guard's arm). Inside a sink and a snapshot a series is keyed by `series_key`: the
family name, then each of its own labels' values after a "/" (`proposals/dflash`)."""
from __future__ import annotations

PREFIX = "vllm_dflash:"
IDENTITY = ("model_name", "engine")  # vLLM's labels (vllm/v1/metrics/loggers.py: PrometheusStatLogger)
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
    "cost_fixed_seconds": "Adaptive drafting: fitted fixed cost of a step (alpha of T = alpha + beta*n + delta*B + "
                          "gamma*m), seconds.",
    "cost_per_token_seconds": "Adaptive drafting: fitted cost per query token of a step (beta), seconds.",
    "cost_per_request_seconds": "Adaptive drafting: fitted cost per request of a step beyond its query tokens "
                                "(delta), seconds.",
    "cost_per_output_token_seconds": "Adaptive drafting: fitted cost per token a step produced (gamma), seconds.",
    "guard_tokens_per_second": "Adaptive drafting: the guard's measured output tokens/s per arm (plan: speculating "
                               "per the plan; off: without speculation).",
}
COUNTERS = {
    "draft_steps": "Drafter invocations (one per engine step with drafting).",
    "request_steps": "Adaptive drafting: request-steps (a request's share of an engine step that gave it a token); "
                     "generated tokens / request-steps = tokens per target forward.",
    "proposals": "Adaptive drafting: request-steps per proposal verified (source: dflash = a DFlash block, ngram = a "
                 "prompt-lookup proposal, merged = prompt-lookup tokens first and the DFlash block after them, "
                 "none = no speculation).",
    "drafted_tokens": "Adaptive drafting: draft tokens sent to verification, per proposal source.",
    "accepted_tokens": "Adaptive drafting: accepted draft tokens, per proposal source.",
    "cross_lookups": "Adaptive drafting: prompt-lookup continuations found in other requests' tokens where the "
                     "request's own history had none (setting cross_lookup), counted when planned.",
    "context_dropped_steps": "Adaptive drafting: steps whose context rows were dropped because no speculation was "
                             "measured faster at that batch size (their requests draft by prompt lookup only).",
    "context_released": "Adaptive drafting: requests that released their draft context after a lease of decode steps "
                        "without a DFlash token, where keeping the context rows cost a measurable share of a step "
                        "(they draft by prompt lookup only from then on).",
}
# the labels of a family beyond IDENTITY, in key order
LABELS = {"proposals": ("source",), "drafted_tokens": ("source",), "accepted_tokens": ("source",),
          "guard_tokens_per_second": ("arm",)}
SOURCES = ("dflash", "ngram", "merged")  # the proposal sources (proposals_total also counts source="none")
SKIPPED = "metrics_snapshots_skipped"  # counted by the collector itself, not merged from snapshots
SKIPPED_DOC = ("Files in the metrics folder that were not valid snapshots (wrong shape, unreadable) and were left out "
               "of these metrics; each distinct file (name, modification time, size) counts once.")


def series_key(name: str, labels: dict[str, str]) -> str:
    """The key of one series of family `name` in a sink or a snapshot: `name`, then the value of each label the family
    has (`LABELS`) after a "/". KeyError / ValueError for a label the family lacks or a value with a "/" in it."""
    names = LABELS.get(name, ())
    if len(labels) != len(names):
        raise ValueError(f"metric {name}: labels {sorted(labels)}, expected {list(names)}")
    values = [str(labels[n]) for n in names]
    if any("/" in v or not v for v in values):
        raise ValueError(f"metric {name}: label values {values} must be non-empty and free of '/'")
    return "/".join((name, *values))


def split_key(key: str) -> tuple[str, tuple[str, ...]]:
    """`series_key` undone: (family name, its label values)."""
    name, *values = key.split("/")
    return name, tuple(values)


def known_key(key: str, family: dict) -> bool:
    """Is `key` a series of a family in `family` (GAUGES or COUNTERS) with that family's labels?"""
    name, values = split_key(key)
    return name in family and len(values) == len(LABELS.get(name, ())) and all(values)
