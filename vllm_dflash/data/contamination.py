# SPDX-License-Identifier: Apache-2.0
"""`vllm-dflash check-data`: no evaluation prompt may be in the training data, checked by hash.

A collection folder stores token ids only (vllm_dflash.data.collect: prompt_ids + response_ids per record, the
prompt rendered with the target's chat template), so the records are decoded with the target's tokenizer and
compared as text with the evaluation prompt sets the project reports on (`humaneval`, the held-out chat split
`chat`, the held-out ShareGPT split `sharegpt`; any JSONL prompt file too). Text is normalised first: whitespace
collapsed to one space, lowercase.

  id        an evaluation id among the training records' ids (a multi-turn record `ID#tK` counts as ID)
  exact     the SHA-1 of a normalised evaluation prompt (the user turn) equals that of a piece of a training
            prompt: the whole prompt, or a piece between two template markers (the tokenizer's special and added
            tokens, and any `<|...|>` tag), with a leading role line (`user`, ...) dropped. So any chat template
            (ChatML, Llama 3, Gemma, ...) and a plain prompt without one are covered, every turn of a multi-turn
            record included
  contained the evaluation text (HumanEval: the function signature + docstring without the instruction line;
            otherwise the user turn) inside a training prompt or response: at least `containment` of its hashed
            8-word shingles occur in one training record's text. Texts under `min_shingles` shingles (~11 words)
            are checked by `exact` only

The trainer's own held-out split (vllm_dflash.train.data: greedy records with id hash < 0.02, at most 64) is
compared with its training split the same way (its last user turn), reported as near-duplicates; those do not fail
the check (a multi-turn sibling `ID#tK` holds the earlier turns of ID in its context by design).
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_dflash.data.overlap import (CONTAINMENT, MIN_SHINGLES, SHINGLE_WORDS,  # noqa: F401 - re-exported
                                      normalize, shingles, text_hash)

DEFAULT_SETS = ("humaneval", "chat", "sharegpt", "math")  # open-chat is a subset of sharegpt
_TAG = re.compile(r"<\|[^<>|\s]{1,64}\|>")  # <|im_start|>, <|start_header_id|>, <|eot_id|>: any template's tags
_ROLES = frozenset({"user", "assistant", "system", "developer", "tool", "human", "gpt", "model"})
_TURN_SUFFIX = re.compile(r"#t\d+$")


def base_id(record_id: str) -> str:
    """The prompt id of a record: `ID#tK` (turn K of a conversation) -> ID."""
    return _TURN_SUFFIX.sub("", record_id)


@dataclass
class EvalPrompt:
    set: str
    id: str
    turn: str  # the user turn, compared by hash
    body: str  # the text searched for inside training texts


@dataclass
class TrainText:
    id: str
    turns: list[str]  # user turns of the prompt (the whole prompt when no template marks them)
    prompt: str  # the whole decoded prompt (system, user and earlier assistant turns)
    response: str
    pieces: list[str] = field(default_factory=list)  # compared by hash too: the prompt split at template markers


def template_markers(tokenizer: Any) -> list[str]:
    """The strings a chat template puts between turns: the tokenizer's special and added tokens, longest first."""
    found = set(getattr(tokenizer, "all_special_tokens", None) or [])
    try:
        found |= set(tokenizer.get_added_vocab())
    except (AttributeError, NotImplementedError):
        pass
    return sorted((t for t in found if isinstance(t, str) and t.strip()), key=len, reverse=True)


def split_prompt(prompt: str, markers: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """(user turns, pieces) of a rendered prompt, whatever its template: the prompt is cut at every marker and
    `<|...|>` tag; a piece whose first line is a role name (`user`, `assistant`, ...) loses that line, and a piece
    that is only a role name labels the next one (Llama 3: `<|start_header_id|>user<|end_header_id|>\n\nTEXT`).
    The user turns are the pieces labelled `user` (none found: the whole prompt is the one turn); the pieces are every
    labelled or unlabelled piece and the whole prompt."""
    pattern = "|".join([re.escape(m) for m in markers] + [_TAG.pattern])
    raw = [p for p in re.split(pattern, prompt) if p.strip()]
    turns, pieces, role = [], [prompt], None
    for p in raw:
        head, _, rest = p.strip().partition("\n")
        if head.strip().lower() in _ROLES:
            role, p = head.strip().lower(), rest
            if not p.strip():
                continue  # the role alone: it labels the next piece
        pieces.append(p)
        if role == "user":
            turns.append(p)
        role = None
    return turns or [prompt], pieces


def eval_prompts(name: str, items: Iterable[dict[str, Any]]) -> list[EvalPrompt]:
    """Prompt items (vllm_dflash.data.prompts) -> EvalPrompts: the last user turn (or raw `prompt`); HumanEval's body
    drops the 'Complete this Python function' line, leaving signature + docstring."""
    from vllm_dflash.data.prompts import HUMANEVAL_INSTRUCTION

    out = []
    for it in items:
        if "messages" in it:
            users = [m["content"] for m in it["messages"] if m.get("role") == "user"]
            turn = users[-1] if users else ""
        else:
            turn = it["prompt"]
        body = turn[len(HUMANEVAL_INSTRUCTION):] if turn.startswith(HUMANEVAL_INSTRUCTION) else turn
        out.append(EvalPrompt(name, str(it["id"]), turn, body))
    return out


def load_eval_sets(names: Sequence[str] = DEFAULT_SETS) -> dict[str, list[EvalPrompt]]:
    """Every prompt of each set (get_prompts: humaneval, chat, sharegpt or a JSONL file), no limit."""
    from vllm_dflash.data.prompts import get_prompts

    return {n: eval_prompts(n, get_prompts(n)) for n in names}


def load_training_records(folders: Sequence[str | Path]) -> list[dict[str, Any]]:
    """Records of the folders as the trainer reads them (a later folder's record replaces an earlier one's id)."""
    from vllm_dflash.data.collect import load_records

    by_id: dict[str, dict[str, Any]] = {}
    for folder in folders:
        if not (Path(folder) / "manifest.json").is_file():
            raise FileNotFoundError(f"check-data: {folder} is not a collection folder (no manifest.json). Fix: pass "
                                    "folders written by vllm-dflash collect")
        for r in load_records(folder):
            by_id.pop(r["id"], None)
            by_id[r["id"]] = r
    return list(by_id.values())


def decode_records(records: Sequence[dict[str, Any]], tokenizer: Any) -> list[TrainText]:
    """Token ids -> text with the target's tokenizer (special tokens kept: they mark the turns, `split_prompt`)."""
    kw = {"skip_special_tokens": False, "clean_up_tokenization_spaces": False}
    prompts = tokenizer.batch_decode([list(r["prompt_ids"]) for r in records], **kw)
    responses = tokenizer.batch_decode([list(r["response_ids"]) for r in records], **kw)
    markers = template_markers(tokenizer)
    out = []
    for r, p, resp in zip(records, prompts, responses, strict=True):
        turns, pieces = split_prompt(p, markers)
        out.append(TrainText(r["id"], turns, p, resp, pieces))
    return out


def find_hits(evals: Sequence[EvalPrompt], train: Sequence[TrainText], containment: float = CONTAINMENT,
              min_shingles: int = MIN_SHINGLES) -> dict[str, Any]:
    """Which evaluation prompts occur in the training texts: by id, by exact hash, by shingle containment."""
    train_ids = defaultdict(list)
    by_hash: dict[str, list[str]] = defaultdict(list)
    for t in train:
        train_ids[base_id(t.id)].append(t.id)
        for h in {text_hash(u) for u in [*t.turns, *t.pieces]}:
            by_hash[h].append(t.id)
    id_hits = {e.id: sorted(train_ids[e.id]) for e in evals if e.id in train_ids}
    exact = {e.id: sorted(by_hash[h]) for e in evals if (h := text_hash(e.turn)) in by_hash}
    ev_sh = [shingles(e.body) for e in evals]
    index: dict[int, list[int]] = defaultdict(list)
    for i, s in enumerate(ev_sh):
        if len(s) >= min_shingles:
            for h in s:
                index[h].append(i)
    contained: dict[str, list[list[Any]]] = defaultdict(list)
    for t in train:
        for where, text in (("prompt", t.prompt), ("response", t.response)):
            counts: Counter = Counter()
            for h in shingles(text) & index.keys():
                counts.update(index[h])
            for i, c in counts.items():
                frac = c / len(ev_sh[i])
                if frac >= containment:
                    contained[evals[i].id].append([t.id, where, round(frac, 3)])
    hit_ids = sorted(set(id_hits) | set(exact) | set(contained))
    return {"prompts": len(evals), "containment_checked": sum(len(s) >= min_shingles for s in ev_sh),
            "id": id_hits, "exact": exact, "contained": dict(contained), "hits": hit_ids}


def heldout_split(records: Sequence[dict[str, Any]]) -> tuple[set[str], set[str]]:
    """(held-out ids, training ids) exactly as `vllm-dflash train` splits these records (default max_len, greedy
    only; records in the held-out hash range past its 64 neither train nor evaluate)."""
    from vllm_dflash.train.data import TrajectoryDataset

    tr, ev = TrajectoryDataset(records).split()
    return {s.id for s in ev.items}, {s.id for s in tr.greedy_only().items}


def check_data(folders: Sequence[str | Path], tokenizer: Any, sets: Sequence[str] | dict[str, list[EvalPrompt]]
               = DEFAULT_SETS, containment: float = CONTAINMENT, min_shingles: int = MIN_SHINGLES,
               heldout: bool = True) -> dict[str, Any]:
    """The contamination report of collection folders against evaluation prompt sets (names or EvalPrompt lists)."""
    records = load_training_records(folders)
    texts = decode_records(records, tokenizer)
    eval_sets = sets if isinstance(sets, dict) else load_eval_sets(sets)
    report: dict[str, Any] = {
        "data": [str(f) for f in folders], "records": len(records),
        "method": f"normalised text (whitespace collapsed, lowercase); id match; SHA-1 of the prompt and its "
                  f"pieces between template markers; >= "
                  f"{containment:.0%} of {SHINGLE_WORDS}-word shingles inside one training prompt or response "
                  f"(texts of >= {min_shingles} shingles)",
        "sets": {name: find_hits(ev, texts, containment, min_shingles) for name, ev in eval_sets.items()}}
    report["hits"] = sum(len(s["hits"]) for s in report["sets"].values())
    report["clean"] = report["hits"] == 0
    if heldout:
        held_ids, train_ids = heldout_split(records)
        by_id = {t.id: t for t in texts}
        held = [EvalPrompt("heldout", i, by_id[i].turns[-1], by_id[i].turns[-1]) for i in sorted(held_ids)]
        res = find_hits(held, [by_id[i] for i in sorted(train_ids)], containment, min_shingles)
        res.pop("id")  # a held-out record's id is never a training id
        dups = set(res["hits"])
        siblings = {h for h in dups if all(base_id(t) == base_id(h) for t in res["exact"].get(h, []) +
                                           [c[0] for c in res["contained"].get(h, [])])}
        res.update(train=len(train_ids), same_conversation_only=sorted(siblings))
        report["heldout"] = res
    return report


def load_tokenizer(target: str | None) -> Any:
    from transformers import AutoTokenizer

    from vllm_dflash.target import resolve_target

    return AutoTokenizer.from_pretrained(str(resolve_target(target)))


def _ids(xs: Iterable[Any], n: int = 5) -> str:
    xs = list(xs)
    return ", ".join(map(str, xs[:n])) + (f", ... ({len(xs)} in all)" if len(xs) > n else "")


def format_report(report: dict[str, Any], max_ids: int = 5) -> str:
    lines = [f"check-data: {report['records']} training records in {', '.join(report['data'])}",
             f"method: {report['method']}"]
    for name, s in report["sets"].items():
        lines.append(f"  {name}: {s['prompts']} prompts ({s['containment_checked']} long enough for containment): "
                     f"{len(s['hits'])} in the training data (id {len(s['id'])}, exact {len(s['exact'])}, "
                     f"contained {len(s['contained'])})")
        for eid in s["hits"]:
            where = ([f"id -> {_ids(s['id'][eid], max_ids)}"] if eid in s["id"] else []) + \
                    ([f"exact -> {_ids(s['exact'][eid], max_ids)}"] if eid in s["exact"] else []) + \
                    ([f"contained -> {_ids((f'{c[0]} ({c[1]}, {c[2]:.0%})' for c in s['contained'][eid]), max_ids)}"]
                     if eid in s["contained"] else [])
            lines.append(f"    {eid}: " + "; ".join(where))
    h = report.get("heldout")
    if h is not None:
        lines.append(f"  trainer's held-out split: {h['prompts']} sequences vs {h['train']} training sequences: "
                     f"{len(h['hits'])} near-duplicates (exact {len(h['exact'])}, contained {len(h['contained'])}; "
                     f"{len(h['same_conversation_only'])} only with turns of their own conversation) (not a failure)")
        for eid in h["hits"]:
            if eid not in h["same_conversation_only"]:
                ids = h["exact"].get(eid, []) + [c[0] for c in h["contained"].get(eid, [])]
                lines.append(f"    {eid}: {_ids(sorted(set(ids)), max_ids)}")
    lines.append("CLEAN: no evaluation prompt in the training data" if report["clean"] else
                 f"CONTAMINATED: {report['hits']} evaluation prompts in the training data")
    return "\n".join(lines)
