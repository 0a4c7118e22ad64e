# SPDX-License-Identifier: Apache-2.0
"""Evaluation sets that look like real traffic: open-ended chat by category, and math word problems.

- `open-chat`: held-out ShareGPT first turns (`sources.sharegpt_eval_prompts`: 1 in 20 conversations by id hash,
  minus any whose text occurs in the training split), mostly-English ones, each given one category by the keyword
  rules below (MT-bench's categories plus coding advice), and taken round-robin over the categories so that any
  prefix of the set is an even mix. Unlike the `chat` set (web excerpts under "summarise / explain this text"),
  these answers have little to copy from their prompt.
- `math`: grade-school word problems from the GSM-Symbolic templates that ship in `reasoning-gym` (100 generator
  functions). Templates split by index: every 5th is held out for evaluation, the others are the `math-gsm`
  training source, so no eval question's template is ever trained on.

An item: {"id", "category", "messages"}.
"""
from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
import types
from pathlib import Path
from random import Random
from typing import Any, Callable, Iterator

from vllm_dflash.data import data_package_dir

# (category, pattern) in order: the first match wins. Case-insensitive, on the first 600 characters.
CATEGORY_RULES: tuple[tuple[str, str], ...] = (
    ("coding", r"```|\b(python|javascript|typescript|java|c\+\+|c#|sql|html|css|react|node\.?js|django|flask|"
               r"function|code|script|api|regex|bash|compile|bug|stack ?trace|exception|class|method|variable)\b"),
    ("roleplay", r"\b(act as|acting as|pretend|role-?play|play the role|imagine you are|you are an? |"
                 r"i want you to act)\b"),
    ("math", r"\b(calculate|solve|equation|integral|derivative|probability|percent|algebra|geometry|"
             r"math|arithmetic)\b|\d+\s*[-+*/^x]\s*\d+"),
    ("extraction", r"\b(extract|summari[sz]e|tl;?dr|key points|from the (following|text|article|passage)|"
                   r"classify|categori[sz]e|list all)\b"),
    ("writing", r"\b(write|essay|poem|story|blog|e-?mail|letter|article|slogan|lyrics|rewrite|paraphrase|"
                r"outline|caption|tweet|script|speech|cover letter)\b"),
    ("science", r"\b(physics|chemistry|biology|quantum|climate|molecule|cells?|scientific|science|medical|"
                r"disease|planet|evolution|dna|energy|gravity|atom)\b"),
    ("humanities", r"\b(history|historical|philosophy|religio\w*|literature|culture|politic\w*|war|economic\w*|"
                   r"music|law|society|ethic\w*|art)\b"),
    ("reasoning", r"\b(why|explain|what if|compare|difference between|pros and cons|should i|riddle|puzzle|"
                  r"logic\w*|reason\w*)\b"),
)
CATEGORIES = tuple(c for c, _ in CATEGORY_RULES) + ("general",)
_COMPILED = tuple((c, re.compile(p, re.IGNORECASE)) for c, p in CATEGORY_RULES)

MATH_HOLDOUT_EVERY = 5  # GSM-Symbolic template i is held out for evaluation when i % 5 == 0
MATH_INSTRUCTION = "Solve this problem step by step, then give the final answer.\n\n"


def category_of(text: str) -> str:
    """The first category whose keyword rule matches the text's first 600 characters; 'general' if none does."""
    head = text[:600]
    for name, rx in _COMPILED:
        if rx.search(head):
            return name
    return "general"


def mostly_english(text: str, ascii_share: float = 0.95) -> bool:
    """At least `ascii_share` of the characters are ASCII (the target is an English model)."""
    return bool(text) and sum(c.isascii() for c in text) >= ascii_share * len(text)


def _stable_key(item_id: str) -> str:
    return hashlib.sha1(item_id.encode()).hexdigest()


def round_robin(groups: dict[str, list[dict[str, Any]]], order: tuple[str, ...]) -> list[dict[str, Any]]:
    """One item of each group in `order` in turn until all are used (so any prefix is an even mix)."""
    out: list[dict[str, Any]] = []
    queues = [list(groups.get(name, [])) for name in order]
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def open_chat(held_out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Held-out chat first turns -> the `open-chat` set: mostly-English turns of 12+ characters, each with its
    category, round-robin over CATEGORIES (see the module docstring)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for it in held_out:
        text = it["messages"][-1]["content"]
        if len(text) < 12 or not mostly_english(text):
            continue
        cat = category_of(text)
        groups.setdefault(cat, []).append({"id": it["id"], "category": cat, "messages": it["messages"]})
    for items in groups.values():
        items.sort(key=lambda x: _stable_key(x["id"]))
    return round_robin(groups, CATEGORIES)


def _gsm_generators() -> list[Callable[..., dict[str, Any]]]:
    """The 100 GSM-Symbolic generator functions of reasoning-gym, loaded from their files. `import reasoning_gym`
    imports every task of the package (and optional dependencies this project does not install), so the two
    generator files and the helpers they use are loaded on their own, under private module names."""
    root = data_package_dir("reasoning_gym")
    gsm = root / "arithmetic" / "gsm_symbolic"

    def load(name: str, path: Path) -> types.ModuleType:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    utils = load("_vllm_dflash_rg_utils", root / "utils.py")
    saved = {k: sys.modules.get(k) for k in ("reasoning_gym", "reasoning_gym.utils")}
    if saved["reasoning_gym"] is None:  # a bare parent, so the generators' `from reasoning_gym.utils import` resolves
        sys.modules["reasoning_gym"] = types.ModuleType("reasoning_gym")
    sys.modules["reasoning_gym.utils"] = utils
    try:
        mods = [load(f"_vllm_dflash_rg_gsm_{i}", gsm / f) for i, f in
                enumerate(("generators_00_49.py", "generators_50_99.py"))]
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    gens = {}
    for mod in mods:
        for name in dir(mod):
            m = re.fullmatch(r"generate_(\d+)", name)
            if m:
                gens[int(m.group(1))] = getattr(mod, name)
    if sorted(gens) != list(range(len(gens))) or not gens:
        raise RuntimeError(f"reasoning-gym's GSM-Symbolic generators: expected generate_0..N, found {sorted(gens)}")
    return [gens[i] for i in range(len(gens))]


def _math_items(split: str, per_template: int, seed: int) -> Iterator[dict[str, Any]]:
    gens = _gsm_generators()
    held = [i for i in range(len(gens)) if (i % MATH_HOLDOUT_EVERY == 0) == (split == "eval")]
    for k in range(per_template):  # round-robin over templates: any prefix spans them all
        for i in held:
            rng = Random(seed * 1_000_003 + i * 1_009 + k)
            try:
                q = gens[i](rng)["question"]
            except Exception:  # noqa: BLE001 - a template that fails for this draw is skipped, not fatal
                continue
            yield {"id": f"gsm:{i}:{seed}:{k}", "category": "math-word",
                   "messages": [{"role": "user", "content": MATH_INSTRUCTION + q}]}


def math_eval_prompts(limit: int | None = None) -> list[dict[str, Any]]:
    """100 held-out math word problems: 20 held-out templates x 5 draws, round-robin over the templates."""
    items = list(_math_items("eval", per_template=5, seed=0))
    return items[:limit] if limit else items


def math_training_prompts(max_chars: int = 2000, variant: int = 0) -> Iterator[dict[str, Any]]:
    """Training prompts of the `math-gsm` source: the 80 other templates x 40 draws (disjoint from `math`)."""
    del max_chars
    for it in _math_items("train", per_template=40, seed=1 + variant):
        yield {"id": it["id"], "source": "math-gsm", "messages": it["messages"]}
