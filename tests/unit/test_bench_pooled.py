# SPDX-License-Identifier: Apache-2.0
"""Pooled ratios of twin servers (vllm_dflash/bench/pooled.py): `NAME#pK` joins NAME's pool and other labels do not,
a pool's rate is its processes' tokens over their time, rounds are averaged process by process, each process keeps
its own ratio, and a run without the baseline is refused naming the fix."""
import json

import pytest

from vllm_dflash.bench.pooled import main, pool_name, pool_runs, pooled_ratios


def _run(config, tokens, wall, rounds, ok=True):
    return {"config": config, "prompt_set": "open-chat", "concurrency": 8, "ok": ok, "output_tokens": tokens,
            "wall_s": wall, "output_tok_s": tokens / wall, "round_tok_s": rounds}


def test_pool_names():
    assert pool_name("ours#p2") == pool_name("ours") == "ours"
    assert pool_name("none+extras#p13") == "none+extras"
    assert pool_name("ours#s50") == "ours#s50"  # another configuration (old code), not a twin
    assert pool_name("ours#pin") == "ours#pin"


def test_pooled_rate_rounds_and_members():
    runs = [_run("none+extras", 1000, 10.0, [100.0, 100.0]), _run("none+extras#p2", 1000, 12.5, [80.0, 80.0]),
            _run("ours", 1100, 10.0, [110.0, 110.0]), _run("ours#p2", 900, 10.0, [90.0, 90.0]),
            _run("ours#s50", 500, 10.0, [50.0, 50.0]), _run("ours#p3", 1, 1.0, None, ok=False)]
    pools = pool_runs(runs)
    assert pools[("open-chat", 8, "ours")]["members"] == ["ours", "ours#p2"]  # the failed twin left out
    base = 2000 / 22.5
    rows = {r["pool"]: r for r in pooled_ratios(pools, "none+extras")}
    assert set(rows) == {"ours", "ours#s50"}
    assert rows["ours"]["ratio"] == pytest.approx((2000 / 20.0) / base)
    assert rows["ours"]["rounds"] == pytest.approx([100.0 / 90.0] * 2)  # mean of member rounds over the baseline's
    assert rows["ours"]["members"] == pytest.approx({"ours": 110.0 / base, "ours#p2": 90.0 / base})
    assert rows["ours"]["baseline_members"] == pytest.approx({"none+extras": 100.0 / base, "none+extras#p2": 80.0 / base})
    assert rows["ours#s50"]["processes"] == 1


def test_cli_table_and_missing_baseline(tmp_path, capsys):
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"runs": [_run("none+extras", 1000, 10.0, [100.0]), _run("ours", 1200, 10.0, [120.0])]}))
    assert main([str(f)]) == 0
    out = capsys.readouterr().out
    assert "| open-chat | 8 | ours (1) | 1.200 |" in out
    with pytest.raises(SystemExit, match="Fix: bench --configs with none"):
        main([str(f), "--baseline", "none"])
