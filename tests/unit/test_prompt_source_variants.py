# SPDX-License-Identifier: Apache-2.0
"""The `*-alt` prompt sources: the material of a source under the next prompt template, as new items. Every prompt
of the original sources is answered, so these are what a new collection can draw on; they must be new prompts (new
ids, another instruction) and must never carry a held-out chat excerpt."""
import itertools

from vllm_dflash.data.sources import (CHAT_TEMPLATES, CODE_TEMPLATES, SOURCES, split_of, stdlib_code_prompts,
                                      web_chat_prompts)


def _first(it, n):
    return list(itertools.islice(it, n))


def test_alt_code_items_are_the_same_functions_under_another_template():
    base, alt = _first(stdlib_code_prompts(), 40), _first(stdlib_code_prompts(variant=1), 40)
    assert [a["id"] for a in alt] == [f"{b['id']}@1" for b in base]
    assert all(a["source"] == "code-stdlib-alt" for a in alt)

    def template(item):
        text = item["messages"][0]["content"]
        return next(i for i, t in enumerate(CODE_TEMPLATES) if text.startswith(t.split("{code}")[0]))

    assert all(template(a) == (template(b) + 1) % len(CODE_TEMPLATES) for a, b in zip(alt, base))
    assert all(a["messages"] != b["messages"] for a, b in zip(alt, base))


def test_alt_web_chats_leave_out_every_held_out_excerpt():
    base = list(web_chat_prompts())
    alt = list(web_chat_prompts(variant=1))
    held = {b["id"] for b in base if split_of(b["id"]) == "eval"}
    assert held, "the web source should hold some held-out excerpts"
    assert not {a["id"].rsplit("@", 1)[0] for a in alt} & held
    assert len(alt) == len(base) - len(held)
    starts = [t.split("{text}")[0] for t in CHAT_TEMPLATES]
    by_id = {b["id"]: b for b in base}
    for a in alt[:50]:
        b = by_id[a["id"].rsplit("@", 1)[0]]
        ta = next(i for i, s in enumerate(starts) if a["messages"][0]["content"].startswith(s))
        tb = next(i for i, s in enumerate(starts) if b["messages"][0]["content"].startswith(s))
        assert ta == (tb + 1) % len(CHAT_TEMPLATES)


def test_the_alt_sources_are_registered():
    assert {"code-stdlib-alt", "code-pkgs-alt", "code-codeio-alt", "chat-web-alt"} <= set(SOURCES)
