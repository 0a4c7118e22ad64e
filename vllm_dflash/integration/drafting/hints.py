# SPDX-License-Identifier: Apache-2.0
"""A hinted draft (dflash_config.hint_ngram): its block is fed the prompt-lookup continuation of each request,
[anchor, h1 .. hm, MASK ..], instead of [anchor, MASK x K]."""
from __future__ import annotations

import numpy as np
import torch

from vllm_dflash.adaptive.ngram import prompt_lookup


def hint_tokens(hint_ngram: tuple[int, int] | None, controller, K: int, lookups,
                histories) -> list[np.ndarray] | None:
    """Per request the prompt-lookup continuation with the draft's own n-gram sizes `hint_ngram` (the controller's
    lookups of this step when they are the same lookup). None for a plain draft (hint_ngram None)."""
    if hint_ngram is None:
        return None
    if lookups is not None and controller is not None and controller.mode != "dflash" and (
            controller.ngram_min, controller.ngram_max) == hint_ngram:
        return [np.asarray(t) for t in lookups]
    return [prompt_lookup(h, K, *hint_ngram) if h is not None else np.zeros(0, np.int64) for h in histories]


def write_hints(input_ids: torch.Tensor, K: int, rows, hints: list[np.ndarray] | None) -> None:
    """Write hints into the draft's block inputs `input_ids` (the query slots r * (K + 1) + 1 .. + m of batch row r,
    which vLLM's set_inputs_first_pass filled with MASK)."""
    if not hints:
        return
    idx = [r * (K + 1) + 1 + j for r, h in zip(rows, hints) for j in range(min(len(h), K))]
    if not idx:
        return
    vals = np.concatenate([np.asarray(h[:K], dtype=np.int64) for h in hints])
    dev = input_ids.device
    input_ids[torch.tensor(idx, device=dev)] = torch.from_numpy(vals).to(dev, input_ids.dtype)
