# SPDX-License-Identifier: Apache-2.0
"""Prompt lookup (n-gram) proposals: the continuation of the latest earlier occurrence of the history's suffix.

Pure numpy, one request at a time; the cost is O(len(history) * max_n) comparisons, well under a millisecond for
the few-thousand-token histories served here."""
from __future__ import annotations

import numpy as np


def prompt_lookup(history: np.ndarray, k: int, min_n: int = 2, max_n: int = 4) -> np.ndarray:
    """history: [L] int token ids (prompt + output so far, last = the newest token).

    For n = max_n .. min_n: find the most recent earlier position where history[-n:] occurred (the occurrence must
    end before the last token) and return up to k tokens that followed it. Longest n wins. -> [<= k] (may be empty).

    One vectorised pass finds the positions c < L-1 holding the newest token; the match is then extended backwards
    over those candidates only (at most max_n - 1 more comparisons each)."""
    L = int(history.shape[0])
    if k <= 0 or L < min_n + 1:
        return history[:0]
    cand = np.flatnonzero(history[: L - 1] == history[L - 1])  # occurrences ending at c, c <= L-2
    if cand.size == 0:
        return history[:0]
    n_max = min(max_n, L - 1)
    m = np.ones(cand.size, dtype=np.int64)  # matched length so far (the newest token)
    alive = np.ones(cand.size, dtype=bool)
    for j in range(1, n_max):
        pos = cand - j
        ok = alive & (pos >= 0)
        ok[ok] = history[pos[ok]] == history[L - 1 - j]
        m += ok
        alive = ok
    best = int(m.max())
    if best < min_n:
        return history[:0]
    c = int(cand[np.flatnonzero(m >= best)[-1]])  # the latest occurrence of the longest match
    return history[c + 1: c + 1 + k]


def anchor_hints(tokens: np.ndarray, anchors: np.ndarray, k: int, min_n: int = 2, max_n: int = 4) -> np.ndarray:
    """The prompt-lookup continuation at each anchor, as a hinted draft block sees it (training and replay; serving
    takes the same lookup from the adaptive controller): tokens [L] (prompt + response), anchors [A] positions.
    For anchor a the history is tokens[: a + 1]. -> [A, k] int64, -1 past each lookup's length."""
    out = np.full((len(anchors), k), -1, dtype=np.int64)
    for i, a in enumerate(np.asarray(anchors).tolist()):
        h = prompt_lookup(tokens[: a + 1], k, min_n, max_n)
        out[i, : len(h)] = h
    return out
