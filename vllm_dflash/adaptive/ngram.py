# SPDX-License-Identifier: Apache-2.0
"""Prompt lookup (n-gram) proposals: the continuation of the latest earlier occurrence of the history's suffix.

One request at a time, a C-speed byte search per n-gram size: a few microseconds for the few-thousand-token
histories served here."""
from __future__ import annotations

import numpy as np


def prompt_lookup(history: np.ndarray, k: int, min_n: int = 2, max_n: int = 4) -> np.ndarray:
    """history: [L] int token ids (prompt + output so far, last = the newest token).

    For n = max_n .. min_n: find the most recent earlier position where history[-n:] occurred (the occurrence must
    end before the last token) and return up to k tokens that followed it. Longest n wins. -> [<= k] (may be empty).

    The search is `bytes.rfind` over the ids as int64 bytes (C speed; a hit not on an 8-byte boundary is a false
    match across two ids and the search goes on before it): the planner runs it for every request of every step."""
    L = int(history.shape[0])
    if k <= 0 or L < min_n + 1:
        return history[:0]
    buf = np.ascontiguousarray(history, dtype=np.int64).tobytes()
    W = 8
    for n in range(min(max_n, L - 1), max(min_n, 1) - 1, -1):
        pat = buf[(L - n) * W:]
        end = (L - 1) * W  # the occurrence must end before the last token
        while (b := buf.rfind(pat, 0, end)) >= 0:
            if b % W == 0:
                c = b // W + n - 1  # the occurrence ends at c
                return history[c + 1: c + 1 + k]
            end = b + len(pat) - 1  # only matches starting before b
    return history[:0]


def anchor_hints(tokens: np.ndarray, anchors: np.ndarray, k: int, min_n: int = 2, max_n: int = 4) -> np.ndarray:
    """The prompt-lookup continuation at each anchor, as a hinted draft block sees it (training and replay; serving
    takes the same lookup from the adaptive controller): tokens [L] (prompt + response), anchors [A] positions.
    For anchor a the history is tokens[: a + 1]. -> [A, k] int64, -1 past each lookup's length."""
    out = np.full((len(anchors), k), -1, dtype=np.int64)
    for i, a in enumerate(np.asarray(anchors).tolist()):
        h = prompt_lookup(tokens[: a + 1], k, min_n, max_n)
        out[i, : len(h)] = h
    return out
