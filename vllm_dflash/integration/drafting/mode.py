# SPDX-License-Identifier: Apache-2.0
"""The drafting mode of an engine, resolved once from its frozen settings (settings.py, `adaptive`) and its scheduler
config: the fixed block, adaptive drafting (synchronous scheduling: the drafter plans lengths) or adaptive drafting
under overlap (async) scheduling (our scheduler plans lengths). The drafter (integration/proposer.py), the async
scheduler (integration/async_scheduler.py) and the patches (integration/patches/async_scheduling.py,
engine_config.py) read it here. Imports neither vLLM nor torch."""
from __future__ import annotations

from dataclasses import dataclass

from vllm_dflash import settings

# the scheduler of adaptive drafting under overlap (integration/async_scheduler.py; named here so that reading the
# mode imports no vLLM)
ADAPTIVE_SCHEDULER = "vllm_dflash.integration.async_scheduler.AdaptiveAsyncScheduler"
FIXED, ADAPTIVE, OVERLAP = "fixed", "adaptive", "overlap"


@dataclass(frozen=True)
class DraftingMode:
    """sources: the setting `adaptive` as a mode (`DFlashSettings.adaptive_mode`): None = the fixed block, 'both'
    (per request-step the DFlash block, prompt lookup or the two merged), 'dflash', 'ngram' or 'merged' (that source
    only, still adaptive lengths). async_scheduling: the engine schedules with overlap (vLLM's async scheduling)."""

    sources: str | None
    async_scheduling: bool = False

    @property
    def adaptive(self) -> bool:
        return self.sources is not None

    @property
    def overlap(self) -> bool:
        """Adaptive drafting under overlap scheduling: the lengths are the scheduler's, the drafter picks sources."""
        return self.adaptive and self.async_scheduling

    @property
    def name(self) -> str:
        return OVERLAP if self.overlap else ADAPTIVE if self.adaptive else FIXED

    @property
    def looks_up(self) -> bool:
        """Is prompt lookup one of the sources?"""
        return self.sources in ("both", "ngram", "merged")


def drafting_mode(vllm_config=None, *, check: bool = True) -> DraftingMode:
    """The drafting mode of the engine of `vllm_config` (without a config: the environment / default settings,
    synchronous). check: refuse a config the drafter cannot run (adaptive drafting under async scheduling needs our
    scheduler, which decides each request's draft length); the patches read the mode while the config is still
    being decided, unchecked."""
    sched = getattr(vllm_config, "scheduler_config", None)
    mode = DraftingMode(settings.from_vllm_config(vllm_config).adaptive_mode,
                        bool(getattr(sched, "async_scheduling", False)))
    if check and mode.overlap and sched.scheduler_cls != ADAPTIVE_SCHEDULER:
        raise ValueError("vllm_dflash: adaptive drafting with async scheduling needs our scheduler (it decides each "
                         f"request's draft length); this engine's scheduler is {sched.scheduler_cls!r}. Fix: "
                         f"--scheduler-cls {ADAPTIVE_SCHEDULER}, or --no-async-scheduling, or set "
                         "speculative_config.adaptive to false")
    return mode
