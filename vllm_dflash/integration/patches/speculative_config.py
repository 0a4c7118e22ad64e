# SPDX-License-Identifier: Apache-2.0
"""Patch: the front end's hook. A speculative config for our DFlash drafter applies the plugin (seam check, patches,
metrics) in this process; our speculative-config keys become validated settings in vLLM's additional_config; the draft
is validated against the target before any engine process starts. Every other configuration passes through untouched
(one log line per process says the plugin is inactive).

The engine's own processes are marked, and no other process: the plugin loads in every vLLM process before that
process sees its engine's config, so an engine core or worker started for our drafter learns it from the marker
ACTIVE_ENV in the environment it starts with. The marker is set only while such an engine starts its processes
(`CoreEngineProcManager.__init__`: the engine core processes; `EngineCore.__init__`: an engine core run in this
process, whose executor starts the workers) and removed after, so processes this one starts later (`vllm serve`
subprocesses, multiprocessing children, the engine cores of later engines without our drafter) never inherit it. An
engine core process keeps it for its lifetime: it serves that one engine, and its workers inherit it."""
from __future__ import annotations

import contextlib
import functools
import inspect
import os

from vllm_dflash import settings
from vllm_dflash.integration.patches.base import Patch
from vllm_dflash.utils import get_logger

logger = get_logger(__name__)
_INACTIVE_LOGGED = False


def apply() -> None:
    from vllm.engine.arg_utils import EngineArgs

    orig = EngineArgs.create_speculative_config
    if getattr(orig, "_vllm_dflash_patched", False):
        return

    def create_speculative_config(self, target_model_config, target_parallel_config):
        from vllm_dflash.integration import patches

        spec = getattr(self, "speculative_config", None)
        flags = {k: v for k, v in (("method", getattr(self, "spec_method", None)),
                                   ("model", getattr(self, "spec_model", None))) if v is not None}
        merged = {**(spec if isinstance(spec, dict) else {}), **flags} if flags else spec  # vLLM merges the flags
        if not patches.wants_our_dflash(merged, getattr(self, "additional_config", None)):
            from vllm_dflash.integration.patches.base import extras

            if extras() != "off":  # the opt-in, set after this process loaded the plugin
                patches.activate()
            _log_inactive()
            return orig(self, target_model_config, target_parallel_config)
        if patches.activate():  # the seam check failed: no patch applied
            raise patches.UnsupportedVLLMError(patches.SEAM_REPORT[0])
        if isinstance(spec, dict):
            self.speculative_config = prepare_spec(self, spec, target_model_config, target_parallel_config)
        from vllm_dflash.serve.metrics import register_collector

        register_collector()
        logger.info("vllm_dflash: DFlash engine (our drafter): patches active: %s",
                    ", ".join(patches.active_patches(dflash=True)))
        return orig(self, target_model_config, target_parallel_config)

    create_speculative_config._vllm_dflash_patched = True
    EngineArgs.create_speculative_config = create_speculative_config


def apply_with_marker() -> None:
    """The ledger's apply (with the other patches, where DFlash is configured): the front-end hook, and the marker
    around the start of a DFlash engine's processes."""
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.engine.utils import CoreEngineProcManager

    apply()
    for cls in (CoreEngineProcManager, EngineCore):
        orig = cls.__init__
        if getattr(orig, "_vllm_dflash_patched", False):
            continue
        cls.__init__ = _marking(orig)


def _marking(init):
    sig = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        with engine_marker(sig.bind(self, *args, **kwargs).arguments.get("vllm_config")):
            init(self, *args, **kwargs)

    __init__._vllm_dflash_patched = True
    return __init__


@contextlib.contextmanager
def engine_marker(vllm_config):
    """ACTIVE_ENV=1 in this process's environment for the duration, when `vllm_config` is an engine with our
    drafter (the processes started meanwhile inherit it); the previous value restored after."""
    from vllm_dflash.integration import patches
    from vllm_dflash.integration.patches.base import dflash_engine

    before = os.environ.get(patches.ACTIVE_ENV)
    if before == "1" or vllm_config is None or not dflash_engine(vllm_config):
        yield
        return
    os.environ[patches.ACTIVE_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(patches.ACTIVE_ENV, None)
        else:
            os.environ[patches.ACTIVE_ENV] = before


def _log_inactive() -> None:
    """At most one line per process for engines without our drafter."""
    global _INACTIVE_LOGGED
    if _INACTIVE_LOGGED:
        return
    _INACTIVE_LOGGED = True
    from vllm_dflash.integration import patches
    from vllm_dflash.integration.patches.base import extras

    level = extras()
    if level == "off":
        logger.info("vllm_dflash: inactive for this engine (no `method: dflash` with our drafter): vLLM runs "
                    "unpatched (%s=fixes|all opts in to our vLLM fixes / CPU speed-ups)",
                    settings.env_name("vllm_extras"))
    else:
        logger.info("vllm_dflash: not a DFlash engine; %s=%s: patches active: %s", settings.env_name("vllm_extras"),
                    level, ", ".join(patches.active_patches(dflash=False)))


def prepare_spec(engine_args, spec: dict, target_model_config, target_parallel_config) -> dict:
    """Our keys -> validated settings (key > additional_config["dflash"] > DFLASH_* env > default) in vLLM's own
    additional_config, which reaches the engine core and every worker; the draft validated against the target. A new
    spec dict and a new additional_config dict: a caller's dicts shared between LLM(...) calls are never changed."""
    from vllm_dflash.integration.validation import validate_dflash_spec

    spec = {k.replace("-", "_"): v for k, v in spec.items()}
    section = settings.additional_config_section(engine_args.additional_config)
    ours = settings.resolve(settings.pop_spec_keys(spec), section)
    engine_args.additional_config = settings.with_settings(engine_args.additional_config, ours)
    if ours.drafter == "ours":
        cfg = validate_dflash_spec(spec, target_model_config.hf_config,
                                   tp_size=getattr(target_parallel_config, "tensor_parallel_size", None))
        spec.setdefault("num_speculative_tokens", cfg.block_size - 1)
        keep_prefix_block(spec)
    return spec


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


PATCH = Patch(
    symbol="vllm.engine.arg_utils.EngineArgs.create_speculative_config (+ vllm.v1.engine.utils.CoreEngineProcManager"
           ".__init__ and vllm.v1.engine.core.EngineCore.__init__, wrapped to mark a DFlash engine's processes)",
    why="the front end's one hook, installed in every process at plugin load: a config for our DFlash drafter "
        "applies the plugin (seam check, patches, metrics) here; the processes that engine starts get the marker "
        "DFLASH_PLUGIN_ACTIVE in their environment (set only while they start: no later process inherits it) and "
        "apply the patches when they load the plugin, before they see the engine's config; vLLM's "
        "SpeculativeConfig forbids unknown keys, so we strip ours (adaptive, diffusion_steps, confidence_threshold, "
        "overlap, kv_injection, drafter, ...), resolve them into vLLM's own additional_config['dflash'] "
        "(settings.py), and validate the DFlash draft against the target before any engine process starts (clear "
        "error, non-zero exit). Any other config passes through untouched",
    removal="when SpeculativeConfig accepts plugin-owned extra keys and a pre-engine validation hook, and vLLM "
            "hands general plugins the engine's config",
    apply=apply_with_marker,
)
