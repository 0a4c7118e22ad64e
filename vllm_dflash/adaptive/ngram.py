# SPDX-License-Identifier: Apache-2.0
"""Prompt lookup (n-gram) proposals: the continuation of the latest earlier occurrence of the history's suffix.

Pure numpy, one request at a time; the cost is O(len(history) * max_n) comparisons, well under a millisecond for
the few-thousand-token histories served here."""
from __future__ import annotations

import numpy as np


def prompt_lookup(history: np.ndarray, k: int, min_n: int = 2, max_n: int = 4) -> np.ndarray:
    """history: [L] int token ids (prompt + output so far, last = the newest token).

    For n = max_n .. min_n: find the most recent earlier position where history[-n:] occurred (the occurrence must
    end before the last token) and return up to k tokens that followed it. Longest n wins. -> [<= k] (may be empty)."""
    L = int(history.shape[0])
    if k <= 0 or L < min_n + 1:
        return history[:0]
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        suffix = history[L - n:]
        # windows over history[:-1] so the match is strictly earlier than the suffix itself: [L-n, n]
        win = np.lib.stride_tricks.sliding_window_view(history[: L - 1], n)
        hits = np.flatnonzero((win == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n  # the token after the latest match
            return history[start: start + k]
    return history[:0]
