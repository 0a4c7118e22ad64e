# SPDX-License-Identifier: Apache-2.0
"""`vllm-dflash check-data` (vllm_dflash/data/contamination.py): evaluation prompts planted in a collection folder
(written in the collector's part format, prompts rendered with the tiny target's chat template) are found, verbatim
(hash) and inside a longer prompt (shingles); a clean folder reports none; the CLI exits 1 on a hit, 0 when clean."""
import json

import pytest

from vllm_dflash.data.collect import encode_part
from vllm_dflash.data.contamination import check_data, eval_prompts, format_report, text_hash
from vllm_dflash.data.prompts import humaneval_prompts

CLEAN_PROMPTS = [
    "Explain what this Python function does, step by step:\n```python\ndef add(a, b):\n"
    "    \"\"\"Add two numbers.\"\"\"\n    return a + b\n```",
    "Summarize the following text in a few sentences:\n\nThe river runs past the old mill and into the valley, where "
    "farmers have grown wheat for centuries.",
    "Write a Python function for this task.\nGiven a list of integers, return the largest product of two of them.",
]


@pytest.fixture(scope="module")
def tok(pair):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(pair / "target"))


def _render(tok, text: str) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _folder(path, tok, prompts: dict[str, str]):
    """A collection folder in the collector's format: manifest + one npz part, greedy records."""
    path.mkdir(parents=True)
    resp = tok.encode(" ok, done.")[:8] * 2
    recs = [{"id": rid, "source": "test", "prompt_ids": _render(tok, text), "response_ids": resp, "temperature": 0.0,
             "finish_reason": "stop", "turn": 0} for rid, text in prompts.items()]
    (path / "part-00000.npz").write_bytes(encode_part(recs))
    (path / "manifest.json").write_text(json.dumps({"done_ids": list(prompts), "num_records": len(recs), "parts": 1}))
    return path


@pytest.fixture(scope="module")
def humaneval():
    return {"humaneval": eval_prompts("humaneval", humaneval_prompts())}


def test_normalised_hash_ignores_whitespace_and_case():
    assert text_hash("def  f(x):\n    Return X") == text_hash("DEF f(x): return x")
    assert text_hash("def f(x): return x") != text_hash("def f(y): return y")


def test_planted_humaneval_prompts_are_found(tmp_path, tok, humaneval):
    he = humaneval_prompts()
    verbatim = he[0]["messages"][0]["content"]  # 'Complete this Python function:\n' + signature + docstring
    inside = ("Write a few unit tests for this Python function:\n```python\n" + he[2]["messages"][0]["content"]
              .split("\n", 1)[1] + "    return number % 1.0\n```\nUse pytest.")
    d = _folder(tmp_path / "dirty", tok, {"code:clean-0": CLEAN_PROMPTS[0], "code:verbatim": verbatim,
                                          "code:inside": inside, "chat:clean-1": CLEAN_PROMPTS[1]})
    report = check_data([d], tok, sets=humaneval, heldout=False)
    s = report["sets"]["humaneval"]
    assert s["prompts"] == 164
    assert s["hits"] == ["HumanEval/0", "HumanEval/2"]
    assert s["exact"] == {"HumanEval/0": ["code:verbatim"]}  # the longer prompt is not an exact match ...
    assert [c[0] for c in s["contained"]["HumanEval/2"]] == ["code:inside"]  # ... but contained
    assert s["contained"]["HumanEval/0"][0][:2] == ["code:verbatim", "prompt"]
    assert not report["clean"] and report["hits"] == 2
    text = format_report(report)
    assert "CONTAMINATED: 2" in text and "HumanEval/2: contained -> code:inside (prompt, 100%)" in text


def test_an_edited_copy_and_an_evaluation_id_are_found(tmp_path, tok, humaneval):
    """Changed whitespace and case, one docstring line dropped: still >= 80% of the shingles. A record carrying an
    evaluation id (turn 1 of it) is named by id."""
    body = humaneval["humaneval"][10].body
    lines = body.splitlines()
    edited = "\n".join(ln.upper() for ln in lines[:-2] + lines[-1:])  # one docstring line less, upper case
    d = _folder(tmp_path / "edited", tok, {"code:edited": "Rewrite this:\n" + edited,
                                           "HumanEval/7#t1": CLEAN_PROMPTS[2]})
    s = check_data([d], tok, sets=humaneval, heldout=False)["sets"]["humaneval"]
    assert s["hits"] == ["HumanEval/10", "HumanEval/7"]
    assert s["id"] == {"HumanEval/7": ["HumanEval/7#t1"]}


def test_clean_folder_reports_nothing(tmp_path, tok, humaneval):
    he = humaneval_prompts()
    # the same function name and the first docstring words only: a mention, not the prompt
    mention = "Explain the idea behind " + he[0]["messages"][0]["content"].split('"""')[0].split("\n")[-2]
    d = _folder(tmp_path / "clean", tok, {f"c{i}": p for i, p in enumerate(CLEAN_PROMPTS + [mention])})
    report = check_data([d], tok, sets=humaneval, heldout=False)
    assert report["clean"] and report["hits"] == 0 and report["records"] == 4
    assert report["sets"]["humaneval"]["hits"] == [] and "CLEAN" in format_report(report)


def test_cli_exit_code_and_heldout_section(tmp_path, pair, capsys):
    """The CLI exits 1 on a hit and 0 when clean (so the check can fail); it prints the trainer's held-out split."""
    from transformers import AutoTokenizer

    from vllm_dflash.cli import main

    tok = AutoTokenizer.from_pretrained(str(pair / "target"))
    clean = _folder(tmp_path / "clean", tok, {f"c{i}": p for i, p in enumerate(CLEAN_PROMPTS)})
    dirty = _folder(tmp_path / "dirty", tok, {"x": humaneval_prompts()[5]["messages"][0]["content"]})
    args = ["check-data", "--sets", "humaneval", "--target", str(pair / "target")]
    assert main(args + ["--data", str(clean)]) == 0
    assert "CLEAN" in capsys.readouterr().out
    assert main(args + ["--data", f"{clean},{dirty}"]) == 1
    out = capsys.readouterr().out
    assert "HumanEval/5: exact -> x" in out and "held-out split" in out
    assert main(args + ["--data", str(tmp_path / "nope")]) == 2  # not a collection folder: named, exit 2


def test_sharegpt_eval_split_has_no_training_duplicates():
    """ShareGPT repeats conversations under other ids: the held-out split leaves out every first turn whose text is a
    human turn of a training-split conversation (an id split alone leaked 28 of 463 prompts into the collections)."""
    from vllm_dflash.data.contamination import normalize
    from vllm_dflash.data.sources import sharegpt_conversations, sharegpt_eval_prompts, split_of

    train = {normalize(t) for it in sharegpt_conversations() if split_of(it["id"]) == "train"
             for t in [it["messages"][-1]["content"], *it["followups"]]}
    held = sharegpt_eval_prompts()
    assert len(held) > 300
    assert not [it["id"] for it in held if normalize(it["messages"][-1]["content"]) in train]
    assert all(split_of(it["id"]) == "eval" for it in held)


LLAMA3_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                   "{{ m['content'] | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


@pytest.fixture(scope="module")
def llama3_tok(pair):
    """The tiny target's tokenizer with Llama 3's turn markers as special tokens and its chat template."""
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(str(pair / "target"))
    t.add_special_tokens({"bos_token": "<|begin_of_text|>",
                         "additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]})
    t.chat_template = LLAMA3_TEMPLATE
    return t


def test_a_verbatim_prompt_is_an_exact_hit_whatever_the_template(tmp_path, tok, llama3_tok, humaneval):
    """A HumanEval prompt verbatim in a Llama-3-rendered record (with a system turn before it), and in a plain prompt
    rendered with no template at all: both are `exact` hits, and the Llama 3 record's user turn is found as such.
    Regression (issue 51 item 11, review L-5): the user-turn regex knew ChatML only, so neither was an exact hit
    (the whole rendered prompt was compared as one turn)."""
    from vllm_dflash.data.contamination import decode_records

    he = humaneval_prompts()
    verbatim = he[0]["messages"][0]["content"]
    msgs = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": verbatim}]
    ids = llama3_tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    assert "<|start_header_id|>user<|end_header_id|>" in llama3_tok.decode(ids)
    d = _folder(tmp_path / "llama3", llama3_tok, {"code:clean-0": CLEAN_PROMPTS[0]})
    plain = tok.encode(verbatim)
    recs = [{"id": "code:llama3", "source": "test", "prompt_ids": ids, "response_ids": plain[:4], "temperature": 0.0,
             "finish_reason": "stop", "turn": 0},
            {"id": "code:plain", "source": "test", "prompt_ids": plain, "response_ids": plain[:4],
             "temperature": 0.0, "finish_reason": "stop", "turn": 0}]
    (d / "part-00001.npz").write_bytes(encode_part(recs))
    (d / "manifest.json").write_text(json.dumps({"done_ids": ["code:clean-0", "code:llama3", "code:plain"],
                                                 "num_records": 3, "parts": 2}))
    s = check_data([d], llama3_tok, sets=humaneval, heldout=False)["sets"]["humaneval"]
    assert s["exact"] == {"HumanEval/0": ["code:llama3", "code:plain"]}
    assert s["hits"] == ["HumanEval/0"]
    (llama3,) = [t for t in decode_records(recs[:1], llama3_tok)]
    assert [text_hash(u) for u in llama3.turns] == [text_hash(verbatim)]  # the user turn, not the system one
