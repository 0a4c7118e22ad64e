# SPDX-License-Identifier: Apache-2.0
"""Patch: overlap (async) scheduling on CPU, which vLLM 0.32 forces off, for our drafter (setting `overlap`)."""
from __future__ import annotations

from vllm_dflash import settings
from vllm_dflash.integration.drafting.mode import ADAPTIVE_SCHEDULER, drafting_mode
from vllm_dflash.integration.patches.base import Patch, dflash_engine
from vllm_dflash.utils import get_logger

logger = get_logger(__name__)


def overlap_wanted(vllm_config, vllm_decided: bool) -> bool:
    """Overlap (async) scheduling on CPU for an engine with our DFlash drafter, setting `overlap`
    (vllm_config.additional_config["dflash"]): "auto" (default) turns it on for the fixed block (adaptive drafting
    stays synchronous under auto: see docs/ADAPTIVE.md for the measurement), true wherever vLLM's own rules allow it
    (adaptive included: lengths then come from our scheduler), false never (vLLM's CPU default). Any other engine
    keeps vLLM's CPU default. `--no-async-scheduling` always wins: vLLM has already decided False before the hook
    runs."""
    if not vllm_decided or not dflash_engine(vllm_config):
        return False
    overlap = settings.from_vllm_config(vllm_config).overlap
    return overlap is True or (overlap == "auto" and not drafting_mode(vllm_config, check=False).adaptive)


def use_adaptive_scheduler(vllm_config) -> None:
    """Adaptive drafting under async scheduling: each request's draft length is the scheduler's decision, so our
    drafter comes with our AsyncScheduler subclass, set through vLLM's own `scheduler_config.scheduler_cls`
    (a user's explicit class is kept; the drafter then refuses to start with a clear error)."""
    sched = vllm_config.scheduler_config
    if not (sched.async_scheduling and sched.scheduler_cls is None and dflash_engine(vllm_config)):
        return
    if drafting_mode(vllm_config, check=False).adaptive:  # the config is still being decided: unchecked
        sched.scheduler_cls = ADAPTIVE_SCHEDULER
        logger.info("vllm_dflash: adaptive drafting with overlap: per-request draft lengths from %s",
                    ADAPTIVE_SCHEDULER)


def apply() -> None:
    from vllm.platforms import cpu

    platform = cpu.CpuPlatform
    orig = platform.check_and_update_config.__func__
    if getattr(orig, "_vllm_dflash_patched", False):
        return

    def check_and_update_config(cls, vllm_config) -> None:
        decided = bool(vllm_config.scheduler_config.async_scheduling)  # vLLM's decision (flag or its default)
        orig(cls, vllm_config)  # sets async_scheduling = False on CPU
        if overlap_wanted(vllm_config, decided):
            vllm_config.scheduler_config.async_scheduling = True
            logger.info("vllm_dflash: overlap (async) scheduling ON on CPU (speculative_config.overlap=false or "
                        "DFLASH_OVERLAP=0 turns it off)")
        use_adaptive_scheduler(vllm_config)

    check_and_update_config._vllm_dflash_patched = True
    platform.check_and_update_config = classmethod(check_and_update_config)


PATCH = Patch(
    symbol="vllm.platforms.cpu.CpuPlatform.check_and_update_config",
    why="vLLM 0.32 forces async scheduling off on CPU ('not required'). With speculation, the engine process "
        "(its own core in vLLM's CPU layout) can schedule step N+1 and process step N-1's output while the "
        "worker runs step N. We keep vLLM's own async decision for our fixed-block DFlash drafter "
        "(setting overlap: auto|true|false; adaptive drafting is synchronous under auto and, with true, gets our "
        "AsyncScheduler subclass through scheduler_config.scheduler_cls); vLLM's V1 async path (batch "
        "queue, draft-token placeholders) is used unchanged.",
    removal="when vLLM enables async scheduling on CPU itself (or exposes a platform opt-in)",
    apply=apply,
)
