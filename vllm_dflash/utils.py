# SPDX-License-Identifier: Apache-2.0
"""Small shared helpers: logging, seeding, JSON lines."""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
from pathlib import Path
from typing import Any, Iterable, Iterator

_LOG_FORMAT = "%(levelname)s %(asctime)s [%(name)s] %(message)s"


def get_logger(name: str) -> logging.Logger:
    logger = logging.getLogger(name)
    root = logging.getLogger("vllm_dflash")
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(_LOG_FORMAT, "%m-%d %H:%M:%S"))
        root.addHandler(handler)
        root.propagate = False
        from vllm_dflash.settings import process_setting  # after the handler: a deprecation warning can print

        from vllm_dflash.config import DFlashConfigError

        try:
            root.setLevel(process_setting("log_level"))
        except DFlashConfigError as e:  # the plugin loads in every vLLM process: a bad value must not stop one
            root.setLevel("INFO")
            root.warning("vllm_dflash: %s; using INFO", e)
    return logger


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def read_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    import gzip

    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> int:
    n = 0
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
            n += 1
    return n


def cpu_has_bf16() -> bool:
    """True when the CPU has native bf16 matmul (AVX512-BF16 or AMX); on AVX2-only CPUs bf16 is ~4x slower."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_class(flags: str | None = None) -> str:
    """The CPU kind every figure names, by its fastest matmul ISA: 'AMX' (amx_bf16), 'avx512_bf16', or 'AVX2' (no
    native bf16: the tools run float32 there). flags: /proc/cpuinfo's text (default: this machine's)."""
    if flags is None:
        try:
            flags = Path("/proc/cpuinfo").read_text()
        except OSError:
            flags = ""
    return "AMX" if "amx_bf16" in flags else "avx512_bf16" if "avx512_bf16" in flags else "AVX2"


def cpu_kind() -> str:
    """The CPU class every figure should name: model name and whether bf16 is native."""
    name = "?"
    try:
        name = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                     if ln.startswith("model name")), "?")
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores, {'avx512_bf16' if cpu_has_bf16() else 'no native bf16 (AVX2-class)'}"


def default_dtype() -> str:
    """vLLM / model dtype: $DFLASH_DTYPE, else bfloat16 on GPUs and bf16-capable CPUs, else float32."""
    from vllm_dflash.settings import process_setting

    env = process_setting("dtype")
    if env:
        return env
    import torch

    if torch.cuda.is_available() or cpu_has_bf16():
        return "bfloat16"
    return "float32"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help shows its default: appended as '(default: X)' unless the help already says what the
    default is (options whose default is computed, e.g. 'default: the machine's fastest'). Shared by the
    `vllm-dflash` CLI and the scripts under benchmarks/."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("default" in text or action.default is argparse.SUPPRESS or not action.option_strings
                or action.required):
            return text
        return super()._get_help_string(action)
