# SPDX-License-Identifier: Apache-2.0
"""The one place that turns vLLM's counters into τ and tokens per target forward.

Two sources give the same counters under different names: a Prometheus scrape of `/metrics` (`parse_metrics`;
counters end in `_total`, per-position acceptance is labelled `position="k"`) and `LLM.get_metrics()` (no suffix,
per-position acceptance as one vector). `counter()` reads either.

Two figures, never to be confused:
- τ (vLLM's acceptance length) = 1 + accepted / drafts: counts only request-steps that verified a proposal.
- tokens per target forward = generated tokens / request-steps (a request's share of an engine step that gave it
  tokens, with or without drafts). Our adaptive drafting counts request-steps (`vllm_dflash:request_steps`); for other
  methods the engine's step count stands in at concurrency 1, where one engine step is one request-step.
"""
from __future__ import annotations

from typing import Any

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
GENERATED = "vllm:generation_tokens"
ENGINE_STEPS = "vllm:iteration_tokens_total_count"  # histogram count: one per engine step
REQUEST_STEPS = "vllm_dflash:request_steps"  # ours, counted under adaptive drafting
# vLLM's labels on every series (and ours): a scrape is summed over them (one server, every engine)
IDENTITY = ("model_name", "engine")


def series(sample: str, **labels: str) -> str:
    """The key `parse_metrics` gives a sample summed over vLLM's labels: `sample{a="x",b="y"}` (labels sorted; no
    braces without labels)."""
    if not labels:
        return sample
    return sample + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text (prometheus_client's parser) -> {key: value}, summed over vLLM's labels (`IDENTITY`: every
    engine and model of the server): `name` sums every sample of that name, `series(name, **labels)` every sample
    with those other labels (e.g. `vllm_dflash:proposals_total{source="dflash"}`, a bucket's `{le="0.5"}`)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
            own = {k: v for k, v in s.labels.items() if k not in IDENTITY}
            if own:
                key = series(s.name, **own)
                out[key] = out.get(key, 0.0) + s.value
    return out


def label_values(m: dict[str, float], sample: str, label: str) -> dict[str, float]:
    """{value of `label`: sum} over the samples of `sample` that carry `label` and no other label of their own (a
    `parse_metrics` result)."""
    head = sample + "{" + label + '="'
    return {k[len(head):-2]: v for k, v in m.items()
            if k.startswith(head) and k.endswith('"}') and '"' not in k[len(head):-2]}


def counter(m: dict[str, Any], name: str) -> float:
    """A counter by its base name from either source (`name_total` in a scrape, `name` from LLM.get_metrics())."""
    v = m.get(name + "_total", m.get(name))
    return float(v or 0.0) if not isinstance(v, (list, tuple)) else float(sum(v))


def _delta(after: dict[str, Any], before: dict[str, Any], name: str) -> float:
    d = counter(after, name) - counter(before, name)
    if d < 0:
        raise ValueError(f"metrics: counter {name} went backwards ({counter(before, name)} -> {counter(after, name)}); "
                         "was the server restarted between the scrapes?")
    return d


def per_position_accepted(m: dict[str, Any]) -> dict[int, float]:
    """Accepted tokens per draft position (summed over engines) from either source."""
    vec = m.get(PER_POS)
    if isinstance(vec, (list, tuple)):
        return {k: float(v) for k, v in enumerate(vec)}
    return {int(k): v for k, v in label_values(m, PER_POS + "_total", "position").items() if k.isdigit()}


def tau(accepted: float, drafts: float) -> float | None:
    """vLLM's acceptance length 1 + accepted / drafts (bonus token included); None when nothing was drafted."""
    return 1.0 + accepted / drafts if drafts > 0 else None


def tokens_per_forward(generated_tokens: float, request_steps: float) -> float | None:
    """Tokens per target forward = generated tokens / request-steps. vLLM's τ counts only the request-steps that
    verified drafts, so where adaptive drafting skips speculation τ stays high while this falls towards 1. None
    without request-steps."""
    return generated_tokens / request_steps if request_steps > 0 else None


def spec_decode(after: dict[str, Any], before: dict[str, Any] | None = None) -> dict[str, Any]:
    """vLLM's spec-decode counters over one run (after minus before; before None: since start): drafts, draft tokens,
    accepted, τ, draft acceptance rate, per-position acceptance (accepted at position k / drafts), generated tokens,
    request-steps (ours; 0 where not counted), engine steps, and tokens per target forward from request-steps
    (`tokens_per_forward`; None where not counted) and from engine steps (`tokens_per_engine_step`: the same figure
    at concurrency 1, for any method)."""
    before = before or {}
    drafts, draft_tokens = _delta(after, before, DRAFTS), _delta(after, before, DRAFT_TOKENS)
    accepted = _delta(after, before, ACCEPTED)
    pos_after, pos_before = per_position_accepted(after), per_position_accepted(before)
    per_pos = []
    for k in sorted(pos_after):
        d = pos_after[k] - pos_before.get(k, 0.0)
        if d < 0:
            raise ValueError(f"metrics: per-position counter {k} went backwards")
        per_pos.append(d)
    generated, request_steps = _delta(after, before, GENERATED), _delta(after, before, REQUEST_STEPS)
    engine_steps = counter(after, ENGINE_STEPS) - counter(before, ENGINE_STEPS)
    return {"drafts": drafts, "draft_tokens": draft_tokens, "accepted": accepted, "tau": tau(accepted, drafts),
            "generated_tokens": generated, "request_steps": request_steps, "engine_steps": engine_steps,
            "tokens_per_forward": tokens_per_forward(generated, request_steps),
            "tokens_per_engine_step": tokens_per_forward(generated, engine_steps),
            "draft_acceptance_rate": accepted / draft_tokens if draft_tokens > 0 else None,
            "per_position_accepted": per_pos,
            "per_position_rate": [p / drafts for p in per_pos] if drafts > 0 else []}
