# SPDX-License-Identifier: Apache-2.0
"""Per-round speed-ups of an interleaved benchmark: each round's own tok/s, paired with the baseline's same round,
and their spread in the results table."""
from __future__ import annotations

from types import SimpleNamespace

from vllm_dflash.bench import report, stats
from vllm_dflash.bench.waves import summarize


def _wave(t0: float, span: float, tokens: int) -> dict:
    req = {"id": f"p{t0}", "text": "x", "completion_tokens": tokens, "prompt_tokens": 5, "chunks": tokens,
           "finish_reason": "length", "t_start": t0, "t_end": t0 + span, "ttft_s": 0.1, "latency_s": span}
    return {"reqs": [req], "before": {}, "after": {}, "load": [0.1, 0.2], "idle_cpu_s": 0.0}


def _run(name: str, spans: list[float], tokens: int = 100) -> dict:
    cfg = SimpleNamespace(name=name, method=None if name == "none" else "ngram")
    waves = [_wave(100.0 * i, s, tokens) for i, s in enumerate(spans)]
    return summarize(cfg, "chat", 8, waves)


def test_round_throughputs_are_each_rounds_own_rate():
    run = _run("none", [2.0, 4.0])
    assert run["round_tok_s"] == [50.0, 25.0]  # 100 tokens in 2 s, then in 4 s
    assert run["output_tok_s"] == 200 / 6.0  # the run's rate: the rounds' tokens over their summed spans


def test_speedup_rounds_pair_round_r_with_the_baselines_round_r():
    none, ours = _run("none", [2.0, 4.0]), _run("ours", [1.0, 4.0])
    runs = [none, ours]
    stats.attach_baseline(runs)
    # round 0: 100 / 1 s against 100 / 2 s; round 1: equal. The run's ratio (6 s / 5 s) lies between them
    assert ours["speedup_rounds"] == [2.0, 1.0]
    assert 1.0 < ours["speedup"] < 2.0
    assert report.speedup_cell(ours) == "1.20× (1.00–2.00)"
    assert report.speedup_cell(none) == "1.00×"  # the baseline shows no spread of itself
    assert "1.20× (1.00–2.00)" in report.render_table(runs)


def test_no_spread_without_paired_rounds():
    one = _run("none", [2.0])
    assert "round_tok_s" not in one  # a run in one round has nothing to pair
    ours = _run("ours", [1.0, 1.0])
    assert stats.paired_ratios(ours, one) is None
    assert stats.paired_ratios(ours, _run("none", [1.0, 1.0, 1.0])) is None  # a failed round: counts differ
    r = {"config": "ours", "speedup": 1.5}
    assert report.speedup_cell(r) == "1.50×"  # results written before rounds were recorded


def test_round_chunks_split_a_level_or_repeat_it_for_min_rounds():
    from vllm_dflash.bench.levels import round_chunks

    items = list(range(96))
    assert round_chunks(items, 8, 3, waves=3) == [items[0::3], items[1::3], items[2::3]]  # 32 each >= 3 x 8
    assert round_chunks(items, 32, 3, waves=3) == [items]  # one round of 3 x 32: nothing to pair
    again = round_chunks(items, 32, 3, waves=3, min_rounds=2)
    assert again == [items, items]  # every prompt in each of 2 rounds
    assert round_chunks(items, 8, 3, waves=3, min_rounds=2) == [items[0::3], items[1::3], items[2::3]]
    import pytest

    with pytest.raises(ValueError, match="--min-rounds"):
        round_chunks(items, 8, 3, min_rounds=0)
