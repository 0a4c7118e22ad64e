# SPDX-License-Identifier: Apache-2.0
"""Where a draft comes from: a folder, the trained draft of a source checkout (default target only), or an untrained
draft shaped for the target (built once in the cache). Shared by the CLI, the demo, the bench and the soak."""
from __future__ import annotations

import json
from pathlib import Path


# The trained SmolLM2 draft ships with a source checkout (models/<name> beside the package), not with an installed
# package. Only the default target uses it, and only after resolve_draft_arg() found it there.
BUNDLED_DRAFT_NAME = "SmolLM2-135M-Instruct-DFlash-b8"
UNTRAINED = "untrained"  # --draft untrained: a random draft shaped for the target (expect τ ≈ 1)


def checkout_root() -> Path:
    """The folder above the package: a source checkout's root (setup.py, csrc/, models/) when the package runs from
    one (pip install -e .), else site-packages. Callers check what they look for there."""
    return Path(__file__).resolve().parent.parent


def checkout_draft_dir() -> Path:
    """Where a source checkout keeps its trained draft for the default target. The folder exists only when the
    package runs from a checkout (pip install -e .); callers must check (resolve_draft_arg does)."""
    return checkout_root() / "models" / BUNDLED_DRAFT_NAME


def untrained_draft(target_dir: Path, block_size: int = 8, mask_token_id: int | None = None) -> Path:
    """A random (untrained) draft shaped for the target, built once in the cache (one folder per target config).
    mask_token_id None: the id known for the target family; any other target raises, naming --mask-token-id."""
    import hashlib

    from vllm_dflash.config import DFlashConfig
    from vllm_dflash.model import DFlashDraftModel
    from vllm_dflash.target import cache_root

    raw = (Path(target_dir) / "config.json").read_text()
    cfg = DFlashConfig.for_target(json.loads(raw), num_layers=1, block_size=block_size, mask_token_id=mask_token_id)
    key = hashlib.sha1(raw.encode() + f"|{cfg.mask_token_id}".encode()).hexdigest()[:10]
    out = cache_root() / f"untrained-draft-b{block_size}-{key}"
    if not (out / "model.safetensors").is_file():
        DFlashDraftModel(cfg).save_pretrained(out)
    return out


def ensure_draft(draft: str | Path, target_dir: Path) -> tuple[Path, bool]:
    """The draft folder, or an untrained draft for the target (created once in the cache) if it is missing.
    (path, untrained?). For scripts that want that fallback; the CLI resolves --draft with resolve_draft_arg."""
    draft = Path(draft)
    if (draft / "config.json").is_file():
        return draft, False
    return untrained_draft(target_dir), True


def resolve_draft_arg(draft: str | Path | None, target_dir: Path, *, default_target: bool = True,
                      flag: str = "--draft") -> tuple[Path, bool]:
    """A --draft value -> (draft folder, untrained?).

    A folder: must hold config.json. 'untrained': a random draft shaped for the target (built once in the cache).
    None: the trained draft of a source checkout, for the default target only; anything missing fails naming the fix
    (an installed package has no bundled draft)."""
    if draft is not None and str(draft) == UNTRAINED:
        return untrained_draft(target_dir), True
    if draft is not None:
        if not (Path(draft) / "config.json").is_file():
            raise FileNotFoundError(f"{flag} {str(draft)!r} has no config.json. Fix: pass a DFlash draft folder "
                                    f"(`vllm-dflash train` writes <out>/draft), or {flag} {UNTRAINED}")
        return Path(draft), False
    if not default_target:
        raise ValueError(f"no {flag} given: the bundled draft is for the default target only. Fix: pass {flag} "
                         f"<draft folder trained for this target>, or {flag} {UNTRAINED}")
    bundled = checkout_draft_dir()
    if not (bundled / "config.json").is_file():
        raise FileNotFoundError(
            f"no {flag} given and no bundled draft at {bundled} (it comes with a source checkout of vllm-dflash, not "
            f"with an installed package). Fix: pass {flag} <draft folder> (e.g. `vllm-dflash train` then "
            f"`vllm-dflash export`), or {flag} {UNTRAINED} for a random draft (τ ≈ 1, a slowdown)")
    return bundled, False
