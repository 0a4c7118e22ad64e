# SPDX-License-Identifier: Apache-2.0
"""The evaluation sets that look like real traffic (vllm_dflash/data/open_sets.py): open-chat and math."""
import re
import sys

import pytest

from vllm_dflash.data import open_sets
from vllm_dflash.data.prompts import get_prompts


@pytest.mark.parametrize("text, category", [
    ("Write a Python function that reverses a list", "coding"),
    ("I want you to act as a travel guide for Rome", "roleplay"),
    ("Solve 3x + 4 = 19 for x", "math"),
    ("Summarize the following article in two lines: ...", "extraction"),
    ("Write a poem about autumn leaves", "writing"),
    ("How does quantum entanglement work?", "science"),
    ("What caused the fall of the Roman empire? A history question", "humanities"),
    ("Why do people procrastinate?", "reasoning"),
    ("Best places to eat in Paris", "general"),
])
def test_category_rules(text, category):
    """Each rule catches its own kind of request, the first matching rule wins, and no match is 'general'."""
    assert open_sets.category_of(text) == category


def test_round_robin_prefix_is_an_even_mix():
    """Any prefix of the set takes one item per category in turn, so a limit of N keeps the categories even."""
    groups = {"a": [{"id": f"a{i}"} for i in range(3)], "b": [{"id": "b0"}], "c": [{"id": f"c{i}"} for i in range(2)]}
    out = [x["id"] for x in open_sets.round_robin(groups, ("a", "b", "c"))]
    assert out == ["a0", "b0", "c0", "a1", "c1", "a2"]


def test_open_chat_from_held_out_items():
    """open_chat keeps mostly-English turns, labels each and never invents or drops an id beyond those filters."""
    held = [{"id": "1", "messages": [{"role": "user", "content": "Write a short story about a dragon"}]},
            {"id": "2", "messages": [{"role": "user", "content": "请用中文写一首关于秋天的诗歌，谢谢你的帮助"}]},
            {"id": "3", "messages": [{"role": "user", "content": "hi"}]},
            {"id": "4", "messages": [{"role": "user", "content": "Explain why the sky is blue to a child"}]}]
    out = open_sets.open_chat(held)
    assert {x["id"]: x["category"] for x in out} == {"1": "writing", "4": "reasoning"}


def test_math_sets_are_disjoint_by_template():
    """The math eval set (100 problems) uses only held-out templates, the math-gsm training source only the
    others, and neither imports reasoning_gym's package (whose __init__ needs optional dependencies)."""
    ev = open_sets.math_eval_prompts()
    assert len(ev) == 100 and len({x["id"] for x in ev}) == 100
    ev_templates = {int(x["id"].split(":")[1]) for x in ev}
    assert ev_templates and all(t % open_sets.MATH_HOLDOUT_EVERY == 0 for t in ev_templates)
    tr_templates = {int(x["id"].split(":")[1]) for x in open_sets.math_training_prompts()}
    assert len(tr_templates) >= 70 and not (tr_templates & ev_templates)
    assert ev == open_sets.math_eval_prompts()  # deterministic
    assert "reasoning_gym" not in sys.modules
    assert re.search(r"\d", ev[0]["messages"][0]["content"])


def test_get_prompts_names():
    """get_prompts knows math and open-chat[/CATEGORY], and names the fix for an unknown category."""
    assert len(get_prompts("math", 7)) == 7
    with pytest.raises(ValueError, match="no category 'poetry'.*Fix"):
        get_prompts("open-chat/poetry")
