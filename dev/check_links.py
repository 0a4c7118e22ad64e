# SPDX-License-Identifier: Apache-2.0
"""Check the relative links of markdown files: the target file or folder exists, and a `#anchor` names a heading of
the target markdown file (GitHub's anchor rules). Exit 1 if any link is broken.

    python dev/check_links.py README.md CHANGELOG.md docs/*.md dev/*.md models/*/MODEL_CARD.md
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def anchors(md: Path) -> set[str]:
    """GitHub-style heading anchors of a markdown file (duplicates get -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", md.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if not m:
            continue
        text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))
        text = re.sub(r"(?<!\w)_+|_+(?!\w)", "", text).strip().lower()  # emphasis; DFLASH_CPU_GEMV keeps its _
        slug = "".join(ch for ch in text.replace(" ", "-") if ch.isalnum() or ch in "-_")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def check(md: Path) -> list[str]:
    text = CODE.sub("", FENCE.sub("", md.read_text()))
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve() if path else md.resolve()
        if not dest.exists():
            bad.append(f"{md}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{md}: {target} (no heading #{anchor})")
    return bad


def main(argv: list[str]) -> int:
    bad = [b for f in argv for b in check(Path(f))]
    print("\n".join(bad) if bad else f"{len(argv)} files: every relative link resolves")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
