# SPDX-License-Identifier: Apache-2.0
"""Every monkey-patch of vLLM: one module per patch, each with its ledger entry (`PATCH`: the symbol, why, when it can
go, and who it acts for), collected here in the order they are applied.

The walls: installing the plugin changes nothing in an engine that did not ask for our DFlash drafter.
- `register_plugin()` runs from the plugin entry point in every vLLM process. It only hooks
  `EngineArgs.create_speculative_config` (the front end; cheap) and applies the patches when this process belongs to
  a DFlash engine already (the marker ACTIVE_ENV in the environment it started with: set by the front end only
  while that engine starts its engine core and workers, speculative_config.py) or the opt-in DFLASH_VLLM_EXTRAS is
  on.
- The front-end hook, on a speculative config with `method: "dflash"` and our drafter, calls `apply_patches()`:
  the seam check (integration/seam.py: the vLLM version and every symbol, signature and attribute the plugin relies
  on), then every patch, our draft model's registry entry; then the metrics collector and folder.
- Every patch acts per engine (`Patch.applies`, base.py): in an engine with our drafter, or under the opt-in (fixes:
  the bug fixes, all: the CPU speed-ups too). Anything else calls vLLM's own code, also in a process where an
  engine with our drafter applied them (tests/vllm/test_walls_one_process.py). The registry entry too: our class
  builds vLLM's own `DFlashQwen3ForCausalLM` for an engine without our drafter (vllm_model.py).
On a seam mismatch no patch is applied, one warning is logged, and only configuring DFlash fails
(UnsupportedVLLMError naming the problems and the fix): vLLM without DFlash keeps working.
"""
from __future__ import annotations

import os

from vllm_dflash import settings
from vllm_dflash.integration.patches import (aot_compile_load, async_scheduling, cpu_expand_kernel, cpu_gemv,
                                             cpu_greedy_verify, cpu_lora_no_adapter, cpu_omp_threads,
                                             cpu_onednn_cache, cpu_plain_sample, cpu_sampled_verify, cpu_uniproc,
                                             cross_lookup_salt, drafter_class, engine_config, generator_rewind,
                                             lora_prompt_logprobs, observe_draft, prefix_cache_reset,
                                             profile_forward, prometheus_registry, ray_cpu, speculative_config)
from vllm_dflash.integration.patches.base import Patch, UnsupportedVLLMError, extras
from vllm_dflash.integration.patches.async_scheduling import overlap_wanted, use_adaptive_scheduler  # noqa: F401
from vllm_dflash.integration.patches.speculative_config import keep_prefix_block  # noqa: F401
from vllm_dflash.integration.seam import SUPPORTED_VLLM  # noqa: F401 - vllm 0.32.x (re-exported)
from vllm_dflash.utils import get_logger

logger = get_logger(__name__)

# cpu_uniproc after async_scheduling: it wraps the same CPU platform hook and reads the final async decision
PATCHES: list[Patch] = [m.PATCH for m in (generator_rewind, drafter_class, speculative_config, observe_draft,
                                          prefix_cache_reset, cross_lookup_salt,
                                          cpu_expand_kernel, async_scheduling, cpu_uniproc, engine_config, ray_cpu,
                                          cpu_onednn_cache, cpu_gemv, cpu_omp_threads, cpu_plain_sample,
                                          cpu_greedy_verify, cpu_sampled_verify, lora_prompt_logprobs,
                                          cpu_lora_no_adapter, aot_compile_load, profile_forward,
                                          prometheus_registry)]


_APPLIED = False
# "1": this process belongs to an engine with our drafter (set by its front end while it starts the engine's processes)
ACTIVE_ENV = "DFLASH_PLUGIN_ACTIVE"


def register_plugin() -> None:
    """The entry point's work in every process (never raises): the front-end hook, and the patches where this process
    serves a DFlash engine already or the opt-in is on. Nothing else: a process that never configures DFlash imports
    no further vLLM module and changes nothing."""
    try:
        speculative_config.apply()
    except Exception as e:  # noqa: BLE001 - the plugin must not break vLLM; the seam check names the problem
        logger.warning("vllm_dflash: cannot hook vLLM's EngineArgs.create_speculative_config (%s: %s); DFlash is "
                       "unavailable in this process", type(e).__name__, e)
    if os.environ.get(ACTIVE_ENV) == "1" or extras() != "off":
        apply_patches()


def active_patches(dflash: bool) -> list[str]:
    """Names of the patches that act in an engine with (dflash) or without our drafter, under this process's opt-in."""
    return [p.name for p in PATCHES if dflash or p.kind in {"off": (), "fixes": ("fix",),
                                                              "all": ("fix", "speedup")}[extras()]]


def apply_patches() -> None:
    """Check the seam once per process; apply every patch if it holds, else only the DFlash guard (never raises)."""
    global _APPLIED
    if _APPLIED:
        return
    _APPLIED = True
    from vllm_dflash.integration import seam

    try:
        problems = seam.check()
    except Exception as e:  # noqa: BLE001 - a bug in the check must not break vLLM either
        problems = [f"the seam check failed: {type(e).__name__}: {e}"]
    if not problems:
        try:
            for p in PATCHES:
                p.apply()
            from vllm import ModelRegistry

            # Our draft model class for the published architecture name (EAGLEConfig keeps names starting
            # with "DFlash"); vLLM's registry maps the name to a "module:Class" string, loaded lazily. For the
            # whole process: the class builds vLLM's own DFlashQwen3ForCausalLM for an engine without our drafter.
            ModelRegistry.register_model("DFlashDraftModel", "vllm_dflash.integration.vllm_model:DFlashDraftForVllm")
            return
        except Exception as e:  # noqa: BLE001 - the plugin must not break vLLM without DFlash
            problems = [f"applying the patches failed: {type(e).__name__}: {e}"]
    SEAM_PROBLEMS[:] = problems
    message = seam.report(problems, partly_applied=problems[0].startswith("applying the patches failed"))
    SEAM_REPORT[:] = [message]
    guarded = install_guard(message)
    logger.warning("%s\n%s", message, "Configuring DFlash (speculative method 'dflash' with our drafter) will fail "
                   "with this message." if guarded else "vLLM's EngineArgs.create_speculative_config is missing too, "
                   "so configuring DFlash cannot be refused early: expect vLLM's own errors.")


SEAM_PROBLEMS: list[str] = []  # what the seam check found in this process (empty: the patches are applied)
SEAM_REPORT: list[str] = []  # the message configuring DFlash fails with (set with SEAM_PROBLEMS)


def activate() -> list[str]:
    """Check the seam and apply the patches (once per process); returns the seam's problems (empty: applied)."""
    apply_patches()
    return list(SEAM_PROBLEMS)


def wants_our_dflash(spec, additional_config) -> bool:
    """A speculative config that needs this plugin: method dflash (or a model path naming dflash) with our drafter, or
    with any of our keys (vLLM's SpeculativeConfig rejects them). vLLM's own DFlash drafter (drafter=vllm set
    through additional_config or DFLASH_DRAFTER, no key of ours) does not."""
    if not isinstance(spec, dict):
        return False
    spec = {str(k).replace("-", "_"): v for k, v in spec.items()}
    method = spec.get("method") or ("dflash" if "dflash" in str(spec.get("model", "")).lower() else None)
    if method != "dflash":
        return False
    if any(k in settings.SPEC_KEYS for k in spec):
        return True
    try:
        return settings.resolve({}, settings.additional_config_section(additional_config)).drafter == "ours"
    except Exception:  # noqa: BLE001 - an invalid setting: still ours
        return True


def install_guard(message: str) -> bool:
    """Wrap EngineArgs.create_speculative_config so that configuring our DFlash raises UnsupportedVLLMError(message)
    before any engine starts; other configurations pass through untouched. False: the hook point is missing."""
    try:
        from vllm.engine.arg_utils import EngineArgs

        orig = EngineArgs.create_speculative_config
    except Exception:  # noqa: BLE001 - the seam check has reported it
        return False
    if getattr(orig, "_vllm_dflash_guard", False) or getattr(orig, "_vllm_dflash_patched", False):
        return True  # our front-end hook: it raises with the seam's problems itself

    def create_speculative_config(self, *args, **kwargs):
        spec = getattr(self, "speculative_config", None)
        flags = {k: v for k, v in (("method", getattr(self, "spec_method", None)),
                                   ("model", getattr(self, "spec_model", None))) if v is not None}
        if flags:  # --spec-method / --spec-model (vLLM merges them into the dict inside the method)
            spec = {**(spec if isinstance(spec, dict) else {}), **flags}
        if wants_our_dflash(spec, getattr(self, "additional_config", None)):
            raise UnsupportedVLLMError(message)
        return orig(self, *args, **kwargs)

    create_speculative_config._vllm_dflash_guard = True
    EngineArgs.create_speculative_config = create_speculative_config
    return True
