# SPDX-License-Identifier: Apache-2.0
"""Where the draft named in `speculative_config.model` lives: a local folder, or a Hugging Face Hub repository
resolved as vLLM resolves it (`huggingface_hub`: HF_HUB_OFFLINE, HF_HOME / HF_HUB_CACHE, HF_TOKEN, and the
speculative config's `revision`; vllm/transformers_utils/config.py reads config.json the same way, with
`local_files_only=HF_HUB_OFFLINE`).

Only config.json is fetched here, into the Hub cache; the weights are vLLM's to download when it loads the draft
(into the same cache), so checking a draft before the engine starts costs one small file. Offline, nothing can be
downloaded later: the cached snapshot must hold the weights too (`weights_known_missing`). Every error is a
DFlashConfigError naming `speculative_config.model` (or `.revision`) and the fix."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from vllm_dflash.config import CONFIG_NAME, DFlashConfigError

FIELD = "speculative_config.model"
LOCAL_FIX = "pass a local draft folder (config.json and model.safetensors) or a Hugging Face Hub id such as 'org/name'"


@dataclass(frozen=True)
class DraftSource:
    folder: Path  # the folder holding config.json: the local folder, or the Hub snapshot in the cache
    repo_id: str | None = None  # the Hub id (None: a local folder)
    revision: str | None = None

    def describe(self) -> str:
        if self.repo_id is None:
            return str(self.folder)
        return f"{self.repo_id}" + (f" (revision {self.revision})" if self.revision else "") + f" at {self.folder}"


def offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub (and so vLLM) read it when they were imported."""
    import huggingface_hub

    return bool(huggingface_hub.constants.HF_HUB_OFFLINE)


def _is_repo_id(model: str) -> bool:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(model)  # 'org/name' or 'name'; no path ('/x', './x', 'a/b/c')
    except HFValidationError:
        return False
    return True


def resolve(model: str, revision: str | None = None) -> DraftSource:
    """The draft's config.json folder: `model` itself when it is a local folder, else the Hub snapshot of repo
    `model` at `revision` (None: the default branch), fetched into the cache unless HF_HUB_OFFLINE is set."""
    path = Path(model).expanduser()
    if path.is_dir():
        return DraftSource(path)
    if path.exists():
        raise DFlashConfigError(FIELD, f"{model!r} is a file, not a draft folder", LOCAL_FIX)
    if not _is_repo_id(model):
        raise DFlashConfigError(FIELD, f"draft folder {model!r} does not exist", LOCAL_FIX)
    if os.environ.get("VLLM_USE_MODELSCOPE", "").strip().lower() in ("1", "true"):
        raise DFlashConfigError(FIELD, f"{model!r} is not a local folder, and VLLM_USE_MODELSCOPE is set (our "
                                "drafter reads Hugging Face Hub ids only)",
                                'download the draft to a local folder and pass that, or add "drafter": "vllm"')
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = f" at revision {revision!r}" if revision else ""
    try:
        cfg = hf_hub_download(model, CONFIG_NAME, revision=revision, local_files_only=offline())
    except (LocalEntryNotFoundError, OfflineModeIsEnabled):
        why = "HF_HUB_OFFLINE is set" if offline() else "the Hub could not be reached"
        raise DFlashConfigError(
            FIELD, f"{model!r} is not a local folder, and the Hugging Face Hub repository {model}{at} is not in the "
            f"cache {constants.HF_HUB_CACHE} ({why})",
            f"download it first (`hf download {model}{' --revision ' + revision if revision else ''}`), point "
            "HF_HOME or HF_HUB_CACHE at the cache that holds it, or pass a local draft folder") from None
    except RevisionNotFoundError:
        raise DFlashConfigError("speculative_config.revision", f"{revision!r} is not a revision of {model}",
                                "use a branch, tag or commit of the draft's repository, or drop the key") from None
    except GatedRepoError:
        raise DFlashConfigError(FIELD, f"the Hub repository {model} is gated", "accept its terms on the Hub and "
                                "set HF_TOKEN to a token of that account") from None
    except RepositoryNotFoundError:
        raise DFlashConfigError(FIELD, f"{model!r} is neither a local folder nor a Hugging Face Hub repository "
                                "(or it is private)", f"{LOCAL_FIX} (for a private repository set HF_TOKEN)") from None
    except EntryNotFoundError:
        raise DFlashConfigError(FIELD, f"the Hub repository {model}{at} has no {CONFIG_NAME}",
                                "use the repository of a DFlash draft") from None
    except (HfHubHTTPError, OSError) as e:
        raise DFlashConfigError(FIELD, f"cannot fetch {CONFIG_NAME} of {model}{at} from the Hugging Face Hub "
                                f"({type(e).__name__}: {e})", "check the network and HF_TOKEN, or set "
                                "HF_HUB_OFFLINE=1 to use the cache, or pass a local folder") from None
    return DraftSource(Path(cfg).parent, model, revision)


def weights_known_missing(src: DraftSource) -> bool:
    """No *.safetensors beside config.json where nothing more can be fetched: a local folder, or a Hub snapshot
    while HF_HUB_OFFLINE is set (online, vLLM downloads the weights when it loads the draft)."""
    if src.repo_id is not None and not offline():
        return False
    return not any(src.folder.glob("*.safetensors"))
