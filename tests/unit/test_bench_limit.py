# SPDX-License-Identifier: Apache-2.0
"""The benchmark's hardware-limit column (vllm_dflash/bench/limit.py): the bound's arithmetic on known inputs,
a run's shape from the server's counters, real measurements that come out positive and plausible, and the table
cells."""
import pytest
import torch

from vllm_dflash.bench import limit, report

HW = limit.Hardware(threads=1, read_gb_s=25.0, gemm_tflops=0.1, dtype="bfloat16", gemm_shape=(256, 576, 1536))
SIZE = limit.ModelSize(params=135_000_000, weight_bytes=270_000_000, hidden=576, intermediate=1536)


def test_memory_bound_at_concurrency_1_without_speculation():
    lim = limit.limit_tok_s(HW, SIZE, concurrency=1, tokens_per_forward=1.0, query_per_request=1.0)
    assert lim["bound"] == "memory"
    assert lim["memory_step_ms"] == pytest.approx(10.8)  # 270 MB at 25 GB/s
    assert lim["limit_tok_s"] == pytest.approx(1 / 0.0108)  # ~93 tok/s
    spec = limit.limit_tok_s(HW, SIZE, 1, tokens_per_forward=2.5, query_per_request=3.0)
    assert spec["bound"] == "memory" and spec["limit_tok_s"] == pytest.approx(2.5 / 0.0108)  # τ times the bound
    wide = limit.limit_tok_s(HW, SIZE, 1, tokens_per_forward=2.5, query_per_request=8.0)  # 21.6 ms of GEMMs
    assert wide["bound"] == "compute" and wide["limit_tok_s"] == pytest.approx(2.5 / 0.0216)


def test_compute_bound_at_high_concurrency():
    lim = limit.limit_tok_s(HW, SIZE, concurrency=32, tokens_per_forward=1.0, query_per_request=1.0)
    assert lim["bound"] == "compute"
    assert lim["compute_step_ms"] == pytest.approx(32 * 2 * 135e6 / 1e11 * 1e3)  # 86.4 ms
    assert lim["limit_tok_s"] == pytest.approx(32 / 0.0864)
    # verifying 8 tokens per request for 2 tokens per forward lowers the compute bound 4x
    spec = limit.limit_tok_s(HW, SIZE, 32, tokens_per_forward=2.0, query_per_request=8.0)
    assert spec["limit_tok_s"] == pytest.approx(lim["limit_tok_s"] / 4)


def test_run_shape_from_counters():
    assert limit.run_shape({"spec_decode": None, "output_tokens": 100}) == (1.0, 1.0)
    # 220 generated, 80 accepted -> 140 request-steps; 280 drafts verified
    tpf, q = limit.run_shape({"spec_decode": {"generated_tokens": 220.0, "accepted": 80.0, "draft_tokens": 280.0}})
    assert tpf == pytest.approx(220 / 140) and q == pytest.approx(1 + 280 / 140)
    # adaptive drafting counts its request-steps (steps without drafts included): that count wins
    tpf, q = limit.run_shape({"spec_decode": {"generated_tokens": 220.0, "accepted": 80.0, "draft_tokens": 280.0,
                                              "request_steps": 160.0}})
    assert tpf == pytest.approx(220 / 160) and q == pytest.approx(1 + 280 / 160)


def test_measurements_are_real_and_plausible(tmp_path):
    hw = limit.measure_hardware(1, torch.float32, hidden=64, intermediate=128, tokens=32, bytes_read=1 << 24,
                                repeats=2)
    assert 0.1 < hw.read_gb_s < 1000 and 1e-5 < hw.gemm_tflops < 100
    assert torch.get_num_threads() >= 1
    from safetensors.torch import save_file
    (tmp_path / "config.json").write_text('{"hidden_size": 8, "intermediate_size": 16}')
    save_file({"a": torch.zeros(3, 4), "b": torch.zeros(5)}, str(tmp_path / "model.safetensors"))
    size = limit.model_size(tmp_path, torch.bfloat16)
    assert (size.params, size.weight_bytes, size.hidden, size.intermediate) == (17, 34, 8, 16)
    with pytest.raises(ValueError, match="safetensors"):
        limit.model_size(tmp_path / "missing", torch.bfloat16)


def test_table_cells():
    assert report._limit_cells(None) == "– | –"
    lim = limit.limit_tok_s(HW, SIZE, 1, 1.0, 1.0)
    assert report._limit_cells({**lim, "fraction": 0.44}) == "93 (memory) | 44 %"


def test_l3_size_and_the_fits_in_cache_note(tmp_path):
    """The L3 size is read from sysfs (level 3 only); the report says when the target's weights fit in it."""
    from vllm_dflash.bench import limit, report

    for i, (level, size) in enumerate([("1", "48K"), ("2", "2048K"), ("3", "300M")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(level + "\n")
        (d / "size").write_text(size + "\n")
    assert limit.l3_bytes(tmp_path) == 300 << 20
    assert limit.l3_bytes(tmp_path / "missing") is None
    hw = {"threads": 2, "read_gb_s": 20.0, "gemm_tflops": 0.8, "dtype": "bfloat16", "gemm_shape": [256, 576, 1536]}
    model = {"params": 134_515_008, "weight_bytes": 269_030_016, "hidden": 576, "intermediate": 1536}
    assert "fit in this CPU's 300 MiB L3" in report._limit_inputs({"hardware": {**hw, "l3_bytes": 300 << 20},
                                                                   "model": model})
    assert "L3" not in report._limit_inputs({"hardware": {**hw, "l3_bytes": 32 << 20}, "model": model})
    assert "L3" not in report._limit_inputs({"hardware": hw, "model": model})  # older results: no record
