# SPDX-License-Identifier: Apache-2.0
"""The bench's `ours / none+extras` figure (issue 62: speculation must never lose to our own engine without it):
stats.attach_over pairs each run with `none+extras` at the same prompt set and concurrency, round by round;
report.over_cell shows it with its spread; the CPU kind of a run is named (utils.cpu_class, report.run_kind)."""
from vllm_dflash.bench.report import over_cell, run_kind, render_table
from vllm_dflash.bench.stats import EXTRAS_BASELINE, attach_baseline
from vllm_dflash.utils import cpu_class


def _run(config, tok_s, rounds, ps="open-chat", c=8):
    return {"config": config, "prompt_set": ps, "concurrency": c, "ok": True, "output_tok_s": tok_s,
            "round_tok_s": rounds, "outputs": {}, "ttft_ms": {}, "tpot_ms": {}}


def test_over_extras_pairs_rounds_at_the_same_level():
    runs = [_run("none", 100.0, [100.0, 100.0, 100.0]), _run(EXTRAS_BASELINE, 110.0, [100.0, 110.0, 120.0]),
            _run("ours", 99.0, [97.0, 99.0, 101.0]), _run("ours", 300.0, [300.0] * 3, c=1)]
    attach_baseline(runs, compare=False)
    over = runs[2]["over"][EXTRAS_BASELINE]
    assert abs(over["ratio"] - 0.9) < 1e-9
    assert over["rounds"] == [0.97, 0.9, round(101 / 120, 4)]
    assert "over" not in runs[1] and "over" not in runs[3]  # the baseline itself; no none+extras at c1
    assert over_cell(runs[2]) == "0.90× (0.84–0.97)" and over_cell(runs[3]) == "–"
    table = render_table(runs)
    assert "| over none+extras |" in table.splitlines()[0] and "0.90× (0.84–0.97)" in table


def test_cpu_kind_is_named():
    assert cpu_class("flags : avx2 avx512f avx512_bf16 amx_bf16 amx_tile") == "AMX"
    assert cpu_class("flags : avx2 avx512f avx512_bf16") == "avx512_bf16"
    assert cpu_class("flags : avx2 fma") == "AVX2"
    assert run_kind({"machine": {"cpu_class": "avx512_bf16"}, "engine": {"dtype": "bfloat16"}}) == \
        "avx512_bf16, bfloat16"
    old = {"machine": {"cpu": "AMD EPYC"}, "engine": {"dtype": "float32"}}  # written before the kind was recorded
    assert run_kind(old) == "AVX2 (inferred), float32"
