# SPDX-License-Identifier: Apache-2.0
"""The value parsers of the settings in `vllm_dflash/settings.py` (one per kind of value).

Each takes a raw value (a JSON value from a config, or a string from the environment) and returns the canonical
value, or raises ValueError (settings.py turns it into a DFlashConfigError naming the source and the fix). No
state, no imports from the package: the settings tables and their readers sit above this module."""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

TRUE = ("true", "1", "on", "yes")
FALSE = ("false", "0", "off", "no", "none")


def bool_or(raw: Any, words: tuple[str, ...], aliases: Mapping[str, Any] = {}) -> Any:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int) and raw in (0, 1):
        return bool(raw)
    if isinstance(raw, str):
        v = raw.strip().lower()
        if v in TRUE:
            return True
        if v in FALSE:
            return False
        if v in aliases:
            return aliases[v]
        if v in words:
            return v
    raise ValueError


def adaptive(raw: Any) -> bool | str:
    return bool_or(raw, ("dflash", "ngram", "merged"), {"both": True})


def overlap(raw: Any) -> bool | str:
    return bool_or(raw, ("auto",))


def choice(*allowed: str) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        if isinstance(raw, str) and raw.strip().lower() in allowed:
            return raw.strip().lower()
        raise ValueError

    return parse


def flag(raw: Any) -> bool:
    v = bool_or(raw, ())
    if isinstance(v, bool):
        return v
    raise ValueError


def pos_int_or_none(raw: Any) -> int | None:
    if raw is None:
        return None
    if isinstance(raw, str) and raw.strip().lstrip("+").isdigit():
        raw = int(raw)
    if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 1:
        return raw
    raise ValueError


def float_where(ok: Callable[[float], bool]) -> Callable[[Any], float]:
    """A parser of a number (or its text) for which ok(value) holds; booleans are not numbers here."""
    def parse(raw: Any) -> float:
        if isinstance(raw, str):
            try:
                raw = float(raw)
            except ValueError:
                raise ValueError from None
        if isinstance(raw, (int, float)) and not isinstance(raw, bool) and ok(float(raw)):
            return float(raw)
        raise ValueError
    return parse


pos_float = float_where(lambda v: v > 0.0)
unit_float = float_where(lambda v: 0.0 < v <= 1.0)
speedup = float_where(lambda v: math.isfinite(v) and v >= 1.0)  # a speed-up factor: a finite number >= 1
non_negative = float_where(lambda v: math.isfinite(v) and v >= 0.0)


def text_or_none(raw: Any) -> str | None:
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    if isinstance(raw, str):
        return raw.strip()
    raise ValueError


def log_level(raw: Any) -> str:
    return choice("debug", "info", "warning", "error", "critical")(raw).upper()


DTYPES = ("auto", "float32", "float", "bfloat16", "float16", "half")


def cpu_gemv(raw: Any) -> int | str:
    """off / 0 -> 0; auto -> "auto"; an integer 1..16 -> that many rows."""
    if isinstance(raw, str) and raw.strip().lower() == "auto":
        return "auto"
    if isinstance(raw, str) and raw.strip().lower() in FALSE:
        return 0
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw)
    if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw <= 16:
        return raw
    raise ValueError


def cpu_gemm_f32(raw: Any) -> int | str:
    """off / 0 -> 0; auto -> "auto"; all -> "all"; an integer >= 1 -> that many rows."""
    if isinstance(raw, str) and raw.strip().lower() in ("auto", "all"):
        return raw.strip().lower()
    if isinstance(raw, str) and raw.strip().lower() in FALSE:
        return 0
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw)
    if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0:
        return raw
    raise ValueError


def onednn_cache(raw: Any) -> int:
    """off / 0 -> 0 (vLLM's own cache); an integer 32..8192 -> that many row counts."""
    if isinstance(raw, str) and raw.strip().lower() in FALSE:
        return 0
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw)
    if isinstance(raw, int) and not isinstance(raw, bool) and (raw == 0 or 32 <= raw <= 8192):
        return raw
    raise ValueError


def tokens_or_off(limit: int) -> Callable[[Any], int]:
    """A parser: off / false / 0 -> 0; a whole number 0 .. limit (or its text) -> itself."""
    def parse(raw: Any) -> int:
        if isinstance(raw, str) and raw.strip().lower() in FALSE:
            return 0
        if isinstance(raw, str) and raw.strip().lstrip("+").isdigit():
            raw = int(raw)
        if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw <= limit:
            return raw
        raise ValueError
    return parse


def dtype(raw: Any) -> str | None:
    return None if text_or_none(raw) is None else choice(*DTYPES)(raw)


def margin(raw: Any) -> float | str:
    """The guard's margin: "noise", or a share >= 0."""
    if isinstance(raw, str) and raw.strip().lower() == "noise":
        return "noise"
    return float_where(lambda v: math.isfinite(v) and v >= 0)(raw)
