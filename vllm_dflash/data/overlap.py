# SPDX-License-Identifier: Apache-2.0
"""Text overlap primitives shared by the held-out splits (data/sources.py) and `check-data` (data/contamination.py):
normalised text, its hash, and hashed word shingles. A leaf module: it imports nothing of the package."""
from __future__ import annotations

import hashlib

SHINGLE_WORDS = 8
MIN_SHINGLES = 4  # texts with fewer shingles (~11 words) are compared by exact hash only
CONTAINMENT = 0.8  # a text is contained in another when this share of its shingles occur there


def normalize(text: str) -> str:
    """Whitespace collapsed to single spaces, lowercase."""
    return " ".join(text.split()).lower()


def text_hash(text: str) -> str:
    """SHA-1 of the normalised text."""
    return hashlib.sha1(normalize(text).encode()).hexdigest()


def shingles(text: str, n: int = SHINGLE_WORDS) -> set[int]:
    """Hashes of every n-word window of the normalised text (empty below n words)."""
    w = normalize(text).split(" ")
    if len(w) < n:
        return set()
    return {hash(t) for t in zip(*(w[k:] for k in range(n)), strict=False)}
