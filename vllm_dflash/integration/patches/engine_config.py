# SPDX-License-Identifier: Apache-2.0
"""Patch: an engine configured for our DFlash drafter starts on every platform: the scheduling rule of the setting
`overlap` and the V1 model runner, decided where vLLM builds the engine config (`VllmConfig`).

vLLM 0.32 turns async scheduling on for `method: "dflash"` wherever its executor supports it; only the CPU platform
hook turns it off again (our CPU hook, patches/async_scheduling.py, then applies `overlap`). On CUDA nothing did, so
the default adaptive drafter refused to start (it needs synchronous scheduling or our scheduler). After vLLM's
`__post_init__` (the platform hook included), `resolve_scheduling` applies the same rule on every platform:
- adaptive drafting with `overlap: auto` (the default) or `false` runs synchronously: async scheduling OFF, logged;
- adaptive drafting with `overlap: true` gets our AsyncScheduler subclass through `scheduler_config.scheduler_cls`;
- the fixed block keeps vLLM's decision, except `overlap: false`, which turns it off.
A user's own `--scheduler-cls` is kept (the drafter then refuses to start with the fix named).

On a GPU with Triton, vLLM 0.32 defaults to Model Runner V2, whose DFlash speculator is vLLM's: our drafter replaces
the V1 runner's `DFlashProposer` only. `_get_v2_model_runner_unsupported_features` (wrapped) names our drafter, so
vLLM picks the V1 runner and logs why; `VLLM_USE_V2_MODEL_RUNNER=1` (or a feature that needs V2) then fails at
start-up with the conflict and the fix instead of serving without our drafter.
"""
from __future__ import annotations

from vllm_dflash import settings
from vllm_dflash.integration.drafting.mode import drafting_mode
from vllm_dflash.integration.patches.base import Patch, dflash_engine
from vllm_dflash.utils import get_logger

logger = get_logger(__name__)

V2_UNSUPPORTED = "vllm_dflash's DFlash drafter (it replaces the V1 runner's DFlashProposer)"


def resolve_scheduling(vllm_config) -> None:
    """The scheduling rule of `overlap` for our drafter, on any platform, after vLLM's own decision (see the module
    docstring). Idempotent: the CPU hook has applied the same rule already on CPU."""
    if not dflash_engine(vllm_config):
        return
    from vllm_dflash.integration.patches.async_scheduling import use_adaptive_scheduler

    s = settings.from_vllm_config(vllm_config)
    sched = vllm_config.scheduler_config
    if not sched.async_scheduling:
        return
    if s.overlap is False or (drafting_mode(vllm_config, check=False).adaptive and s.overlap == "auto"):
        sched.async_scheduling = False
        why = ("speculative_config.overlap is false" if s.overlap is False else
               "adaptive drafting runs synchronously under speculative_config.overlap auto; overlap: true gives "
               "overlap with our scheduler, adaptive: false the fixed block with vLLM's async scheduling")
        logger.info("vllm_dflash: async scheduling OFF for our DFlash drafter (%s)", why)
        return
    use_adaptive_scheduler(vllm_config)


def check_runner(vllm_config, forced_only: bool = False) -> None:
    """Our drafter runs in the V1 model runner only: refuse a config that selects Model Runner V2 (forced_only: only
    through VLLM_USE_V2_MODEL_RUNNER=1, checked before vLLM's own checks, which would name no fix)."""
    import vllm.envs as envs

    v2 = envs.VLLM_USE_V2_MODEL_RUNNER is True if forced_only else vllm_config.use_v2_model_runner
    if v2 and dflash_engine(vllm_config):
        raise ValueError(
            "vllm_dflash: this engine uses vLLM's Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1, or a feature that "
            "needs it), but our DFlash drafter plugs into the V1 model runner only, so it would not run. Fix: unset "
            "VLLM_USE_V2_MODEL_RUNNER (or set it to 0) and drop the V2-only feature, or set "
            "speculative_config.drafter to 'vllm' to serve vLLM's built-in DFlash drafter on Model Runner V2")


def apply() -> None:
    from vllm.config.vllm import VllmConfig

    post_init = VllmConfig.__post_init__
    if getattr(post_init, "_vllm_dflash_patched", False):
        return
    unsupported = VllmConfig._get_v2_model_runner_unsupported_features

    def _get_v2_model_runner_unsupported_features(self) -> list[str]:
        out = unsupported(self)
        if dflash_engine(self):
            out.append(V2_UNSUPPORTED)  # vLLM then picks the V1 runner and logs it
        return out

    def __post_init__(self) -> None:
        ours = self.speculative_config is not None and not getattr(self.model_config, "is_submodel_config", False)
        if ours:
            check_runner(self, forced_only=True)
        post_init(self)
        if not ours:
            return
        check_runner(self)
        resolve_scheduling(self)

    __post_init__._vllm_dflash_patched = True
    _get_v2_model_runner_unsupported_features._vllm_dflash_patched = True
    VllmConfig.__post_init__ = __post_init__
    VllmConfig._get_v2_model_runner_unsupported_features = _get_v2_model_runner_unsupported_features


PATCH = Patch(
    symbol="vllm.config.vllm.VllmConfig.__post_init__ (wrapped; and VllmConfig._get_v2_model_runner_unsupported_"
           "features)",
    why="vLLM 0.32 turns async scheduling on for dflash on CUDA and selects Model Runner V2 on a GPU with Triton; "
        "our adaptive drafter needs synchronous scheduling or our scheduler, and our drafter lives in the V1 runner. "
        "After vLLM's config checks we apply the `overlap` rule on every platform and name our drafter among V2's "
        "unsupported features (V1 is then chosen and logged; a forced V2 fails with the fix)",
    removal="when vLLM offers a drafter plugin hook for Model Runner V2 and a platform-independent scheduler choice "
            "for adaptive draft lengths",
    apply=apply,
)
