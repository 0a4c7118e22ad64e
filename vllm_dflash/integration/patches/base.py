# SPDX-License-Identifier: Apache-2.0
"""The ledger's entry type (every module in this package defines one PATCH), the error for an unsupported vLLM, and
the test every wrapper asks first: is this engine configured for our DFlash drafter?"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Patch:
    symbol: str  # the vLLM symbol replaced or wrapped
    why: str
    removal: str  # when the patch can go
    apply: Callable[[], None]
    kind: str = "dflash"  # who it acts for (KINDS below)

    @property
    def name(self) -> str:
        """The ledger module's name (integration/patches/<name>.py)."""
        return self.apply.__module__.rsplit(".", 1)[-1]

    def applies(self, vllm_config) -> bool:
        """Does this patch act in the engine of `vllm_config`?"""
        return acts(self.kind, vllm_config)


class UnsupportedVLLMError(RuntimeError):
    pass


def dflash_engine(vllm_config) -> bool:
    """An engine whose speculative config is `method: "dflash"` with our drafter (setting `drafter`, resolved by the
    front end into `additional_config["dflash"]`; only that setting is read here). A value that does not parse
    counts as ours: the drafter then reports it."""
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None or getattr(spec, "method", None) != "dflash":
        return False
    from vllm_dflash import settings
    from vllm_dflash.config import DFlashConfigError

    section = settings.additional_config_section(getattr(vllm_config, "additional_config", None))
    raw = section.get("drafter") if isinstance(section, dict) else None
    if raw is None:  # a config the front end did not resolve: the environment, else the default
        got = settings.raw_env("drafter")
        raw = got[1] if got else settings.DEPLOYMENT_FIELDS["drafter"].default
    try:
        return settings.parse_value("drafter", raw) == "ours"
    except DFlashConfigError:
        return True


# Patch.kind: who a patch acts for. "dflash": engines with our drafter only. "fix" (a vLLM bug fix) and "speedup" (a
# CPU speed-up): engines with our drafter, and every engine under the process-wide opt-in DFLASH_VLLM_EXTRAS
# (fixes: the fixes; all: both).
KINDS = ("dflash", "fix", "speedup")
_EXTRAS_FOR = {"fix": ("fixes", "all"), "speedup": ("all",), "dflash": ()}
_WARNED: set[str] = set()


def extras() -> str:
    """The opt-in DFLASH_VLLM_EXTRAS (off | fixes | all). A bad value never stops an engine: warned once, read as
    off."""
    from vllm_dflash import settings
    from vllm_dflash.config import DFlashConfigError

    try:
        return settings.process_setting("vllm_extras")
    except DFlashConfigError as e:
        _warn_once(f"vllm_dflash: {e}; read as off")
        return "off"


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        from vllm_dflash.utils import get_logger

        get_logger(__name__).warning(message)


def setting_for(name: str, vllm_config):
    """A process setting for the engine of `vllm_config`: a bad value raises for an engine with our drafter (the
    error names the variable and the fix) and is warned about once and replaced by the default in any other engine
    (the plugin must never stop an engine that did not ask for DFlash)."""
    from vllm_dflash import settings
    from vllm_dflash.config import DFlashConfigError

    try:
        return settings.process_setting(name)
    except DFlashConfigError as e:
        if vllm_config is not None and dflash_engine(vllm_config):
            raise
        default = settings.PROCESS_FIELDS[name].default
        _warn_once(f"vllm_dflash: {e}; using the default ({default!r}) in this engine")
        return default


def acts(kind: str, vllm_config) -> bool:
    """Does a patch of this kind act in the engine of `vllm_config` (None: outside any engine: only the opt-in)?"""
    return (vllm_config is not None and dflash_engine(vllm_config)) or extras() in _EXTRAS_FOR[kind]


def acts_for(obj, kind: str) -> bool:
    """`acts(kind, obj.vllm_config)`, decided once per object (a runner, scheduler or executor: one engine each)."""
    key = f"_vllm_dflash_acts_{kind}"
    got = obj.__dict__.get(key)
    if got is None:
        got = acts(kind, getattr(obj, "vllm_config", None))
        obj.__dict__[key] = got
    return got


def current_acts(kind: str) -> bool:
    """`acts` for the engine whose model is being loaded (vLLM's current config; none: only the opt-in)."""
    from vllm.config import get_current_vllm_config_or_none

    return acts(kind, get_current_vllm_config_or_none())
