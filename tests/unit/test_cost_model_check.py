# SPDX-License-Identifier: Apache-2.0
"""The step-cost check (vllm_dflash/bench/cost_model.py, issue 62.3) on traces a real `AdaptiveController` writes
(DFLASH_TRACE) for simulated machines: it replays the controller's own fit, skips what the controller skips, and
shows a forward that is not a line by row count."""
import json

import numpy as np
import pytest

from vllm_dflash.adaptive.controller import AdaptiveController
from vllm_dflash.bench import cost_model


def _trace(tmp_path, monkeypatch, forward, steps: int = 120) -> str:
    """A trace of `steps` decode steps (batch 1-32, 0-7 drafts a request; forward(n, B) seconds of target forward,
    2 ms + 0.3 ms a request besides) with a prefill-carrying step every 10th. -> its folder."""
    monkeypatch.setenv("DFLASH_TRACE", str(tmp_path))
    t = [0.0]
    c = AdaptiveController(7, mode="dflash", split_cost=True, clock=lambda: t[0])
    hists = [np.arange(100 * i, 100 * i + 20) for i in range(32)]
    for s in range(steps):
        B = (1, 2, 3, 5, 8, 12, 16, 32)[s % 8]
        prefill = s % 10 == 9
        n = B * (1 + (s // 8) % 8) + (300 if prefill else 0)
        fwd = forward(n, B)
        t[0] += fwd + 0.002 + 0.0003 * B
        c.plan([f"r{i}" for i in range(B)], hists[:B], query_tokens=n, decode_only=not prefill, forward_s=fwd)
    c.trace.flush()
    return str(tmp_path)


def test_pow2_bins_are_the_guards_buckets():
    assert [cost_model.pow2_bin(x, 32) for x in (1, 2, 3, 4, 7, 8, 31, 32, 300)] == [
        "1", "2-3", "2-3", "4-7", "4-7", "8-15", "16-31", "32+", "32+"]
    assert cost_model.pow2_bin(255, 256) == "128-255" and cost_model.pow2_bin(256, 256) == "256+"


def test_replay_is_the_controllers_fit_and_skips_prefill(tmp_path, monkeypatch):
    """A machine whose forward is a line: the replayed fit equals the published one, prefill steps and the warm-up
    samples are left out, and after the warm-up the online F predicts the forward within a few percent."""
    folder = _trace(tmp_path, monkeypatch, lambda n, B: 0.020 + 0.0005 * n)
    result, steps = cost_model.check([folder], warmup=8)
    assert result["replay_max_rel_diff"] < 1e-9
    decode = 120 - 12  # every 10th step carried a prefill
    assert len(steps) == decode - 1 - 8  # the first step has no time (the clock starts), then the warm-up
    assert max(s["n"] for s in steps) <= 32 * 8 and all(s["pred_fwd"] is not None for s in steps)
    by_b = result["step"]["by_B"]
    assert [r["B"] for r in by_b] == ["1", "2-3", "4-7", "8-15", "16-31", "32+", "all"]
    assert sum(r["steps"] for r in by_b[:-1]) == by_b[-1]["steps"] == len(steps)
    assert abs(result["forward"]["by_n"][-1]["median_rel_err"]) < 0.02
    assert abs(result["step"]["by_n"][-1]["median_rel_err"]) < 0.03


def test_a_bent_forward_shows_by_row_count(tmp_path, monkeypatch):
    """A forward flat up to 16 rows, then 1 ms a row (memory- then compute-bound): the best line is off by row bin
    (over 15 % somewhere), the piecewise-linear F with knots at powers of two is not (under 2 %)."""
    folder = _trace(tmp_path, monkeypatch, lambda n, B: 0.020 + 0.001 * max(n - 16, 0), steps=200)
    h = cost_model.check([folder])[0]["forward_hindsight"]
    assert max(abs(r["linear"]) for r in h["by_n"]) > 0.15
    assert max(abs(r["piecewise"]) for r in h["by_n"]) < 0.02


def test_main_writes_json_markdown_and_plot(tmp_path, monkeypatch):
    folder = _trace(tmp_path / "trace", monkeypatch, lambda n, B: 0.020 + 0.0005 * n, steps=40)
    out = tmp_path / "out"
    assert cost_model.main([folder, "--out-dir", str(out), "--name", "cm", "--label", "synthetic",
                            "--cpu", "AVX2"]) == 0
    result = json.loads((out / "cm.json").read_text())
    assert result["meta"]["cpu_class"] == "AVX2" and result["meta"]["label"] == "synthetic"
    assert "## Step time by batch size" in (out / "cm.md").read_text()
    pytest.importorskip("matplotlib")
    assert (out / "cm.png").stat().st_size > 0


def test_main_says_when_a_trace_has_no_cost_samples(tmp_path, capsys):
    (tmp_path / "trace-1.jsonl").write_text(json.dumps({"B": 1, "q": 50, "out": 1, "dt": None, "fwd": 0.1,
                                                        "decode": False, "cost": [0.01, 0.001, 0, 0]}) + "\n")
    assert cost_model.main([str(tmp_path), "--out-dir", str(tmp_path / "out")]) == 1
    assert "no cost samples" in capsys.readouterr().out


def test_row_slope_holds_the_batch_size_fixed(tmp_path, monkeypatch):
    """A forward that costs 1 ms a request on top of 0.5 ms a row: with the batch size held fixed the slope in rows
    is the row's cost, in every bucket where the rows moved. What the table is for: the split fit's F(n) has no
    per-request term, so a request's forward cost leaks into the price of a row (here ~0.66 ms)."""
    folder = _trace(tmp_path, monkeypatch, lambda n, B: 0.020 + 0.0005 * n + 0.001 * B, steps=200)
    rows = cost_model.check([folder])[0]["row_slope"]
    assert [r["within_batch_ms"] for r in rows] == pytest.approx([0.5] * len(rows), abs=1e-6)
    assert all(r["within_batch_se_ms"] < 1e-6 for r in rows)  # an exact machine: no residual
    assert all(r["beta_ms"][1] <= r["beta_ms"][0] <= r["beta_ms"][2] for r in rows)
    assert all(r["beta_ms"][0] > 0.6 for r in rows)
