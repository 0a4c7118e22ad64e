# SPDX-License-Identifier: Apache-2.0
"""Patch: with DFLASH_PROFILE=1, the CPU worker times every target forward, whatever the speculative method.

The serving benchmark sets DFLASH_PROFILE=1 for every configuration, so its time split (target forward = verification
against host work: sampling, rejection, input preparation, drafting) compares our drafter with vLLM's n-gram drafter
and with no speculation on the same footing. The timer wraps the loaded target model instance's `forward` (not a vLLM
class) right after `CPUModelRunner.load_model`: the runner calls that module once per engine step, and vLLM's
torch.compile unit is the inner decoder that `forward` calls. On CPU a forward, eager or compiled, has finished when
it returns, so a host clock measures it; the first observation includes the compile (readers take deltas).

The observations go to the worker's metrics sink (`vllm_dflash:target_forward_seconds` on /metrics), from the output
rank only (the other TP ranks run the same forward in lockstep)."""
from __future__ import annotations

import functools

from vllm_dflash.integration.forward_timer import time_forward_calls
from vllm_dflash.integration.patches.base import Patch, acts_for, setting_for


def time_forward(model, sink) -> None:
    """Wrap `model.forward` (this instance only) to observe its wall time into `sink`'s target_forward_seconds."""
    def observe(seconds: float) -> None:
        sink.observe("target_forward_seconds", seconds)
        sink.flush()  # marks the values changed; the sink's own thread writes them (no I/O here)

    time_forward_calls(model, observe)


def apply() -> None:
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    load = CPUModelRunner.load_model
    if getattr(load, "_vllm_dflash_patched", False):
        return

    @functools.wraps(load)
    def load_model(self, *args, **kwargs):
        load(self, *args, **kwargs)
        if not acts_for(self, "speedup") or not setting_for("profile", self.vllm_config):
            return
        import torch

        from vllm_dflash.serve.metrics import MetricsSink, is_output_rank
        from vllm_dflash.utils import get_logger

        if isinstance(self.model, torch.nn.Module) and is_output_rank():
            sink = MetricsSink.get(self.vllm_config)
            sink.declare("target_forward_seconds")
            time_forward(self.model, sink)
            get_logger(__name__).info("vllm_dflash: DFLASH_PROFILE=1: timing the target forward (metric "
                                      "target_forward_seconds)")

    load_model._vllm_dflash_patched = True
    CPUModelRunner.load_model = load_model


PATCH = Patch(
    symbol="vllm.v1.worker.cpu_model_runner.CPUModelRunner.load_model (wrapped)",
    why="DFLASH_PROFILE=1: time the target forward in the CPU worker for every configuration (none, n-gram, ours), so "
        "the serving benchmark splits verification from host work on the same footing; vLLM has no such timer on CPU "
        "(its model-forward trace times need an OpenTelemetry collector)",
    removal="when vLLM publishes a per-step model-forward time on CPU in its Prometheus metrics",
    apply=apply,
    kind="speedup",
)
