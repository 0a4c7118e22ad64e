# SPDX-License-Identifier: Apache-2.0
"""Per-category speed at concurrency 1 (bench/categories.py): output tokens / latency summed per open-chat
category, speed-up over `none`; other prompt sets and higher concurrency are left out."""
from vllm_dflash.bench import categories
from vllm_dflash.bench.categories import per_category, render_categories


def test_per_category_sums_tokens_over_latency(monkeypatch):
    monkeypatch.setattr(categories, "categories_of",
                        lambda ps: {"a": "math", "b": "math", "c": "coding"} if ps == "open-chat" else {})
    req = lambda i, tok, lat: {"id": i, "completion_tokens": tok, "latency_s": lat}  # noqa: E731
    runs = [
        {"config": "none", "prompt_set": "open-chat", "concurrency": 1, "ok": True,
         "requests": [req("a", 100, 2.0), req("b", 100, 2.0), req("c", 50, 1.0)]},
        {"config": "ours", "prompt_set": "open-chat", "concurrency": 1, "ok": True,
         "requests": [req("a", 100, 1.0), req("b", 100, 3.0), req("c", 50, 0.5)]},
        {"config": "ours", "prompt_set": "open-chat", "concurrency": 8, "ok": True,  # not c1: left out
         "requests": [req("a", 100, 100.0)]},
        {"config": "ours", "prompt_set": "math", "concurrency": 1, "ok": True, "requests": [req("x", 1, 1.0)]},
    ]
    t = per_category(runs)
    assert set(t) == {"math", "coding"}
    assert t["math"]["none"]["tok_s"] == 50.0 and t["math"]["ours"]["tok_s"] == 50.0  # 200 tokens / 4 s each
    assert t["coding"]["ours"]["tok_s"] == 100.0 and t["math"]["ours"]["requests"] == 2
    md = render_categories(runs)
    assert "| coding | 1 | 50.0 tok/s | **2.00×** (100.0 tok/s) |" in md and "| math | 2 |" in md


def test_no_open_chat_no_table():
    assert render_categories([{"config": "none", "prompt_set": "humaneval", "concurrency": 1,
                               "requests": [{"id": "HumanEval/0", "completion_tokens": 5, "latency_s": 1.0}]}]) is None


def test_only_the_best_speed_up_per_category_is_bold(monkeypatch):
    monkeypatch.setattr(categories, "categories_of", lambda ps: {"a": "math"} if ps == "open-chat" else {})
    runs = [{"config": c, "prompt_set": "open-chat", "concurrency": 1, "ok": True,
             "requests": [{"id": "a", "completion_tokens": 100, "latency_s": lat}]}
            for c, lat in (("none", 2.0), ("ngram", 1.6), ("ours", 1.0))]
    assert "| math | 1 | 50.0 tok/s | 1.25× (62.5 tok/s) | **2.00×** (100.0 tok/s) |" in render_categories(runs)


def test_tokens_per_chunk_beside_the_speed_up(monkeypatch):
    """Completion tokens per streamed chunk per category (the client's count of engine steps per request)."""
    monkeypatch.setattr(categories, "categories_of", lambda ps: {"a": "math", "b": "math"} if ps == "open-chat" else {})
    req = lambda i, tok, lat, ch: {"id": i, "completion_tokens": tok, "latency_s": lat, "chunks": ch}  # noqa: E731
    runs = [{"config": "none", "prompt_set": "open-chat", "concurrency": 1, "ok": True,
             "requests": [req("a", 100, 2.0, 100), req("b", 100, 2.0, 100)]},
            {"config": "ours", "prompt_set": "open-chat", "concurrency": 1, "ok": True,
             "requests": [req("a", 100, 1.0, 40), req("b", 100, 1.0, 60)]}]
    assert per_category(runs)["math"]["ours"]["tokens_per_chunk"] == 2.0  # 200 tokens / 100 chunks
    assert "| math | 2 | 50.0 tok/s | **2.00×** · 2.00 (100.0 tok/s) |" in render_categories(runs)
