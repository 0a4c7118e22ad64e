# SPDX-License-Identifier: Apache-2.0
"""Positions past the draft's RoPE range (real vLLM, CPU): the engine serves and stays lossless.

A copy of the tiny pair's draft with max_position_embeddings 64 (a 64-row RoPE cache), max_model_len 256. vLLM's
runner keeps the draft out of steps whose longest request passes the draft's max_model_len (64 here, from
max_position_embeddings), so by default no position past the cache reaches us; the plugin says so at start-up, naming
both numbers. With the draft's max_model_len widened past its cache (`WIDEN`: a draft whose derived length outgrows
its RoPE cache, which lifts vLLM's guard), a 200-token prompt used to raise inside the engine step (the injection's
range check) and kill the engine; now positions are clamped and rows past the cache not injected: the same greedy
output as no speculation, fixed block and adaptive, synchronous and overlap scheduling, and the engine stays up (the
same requests again in the same engine). At the end of the range (prompt + max_tokens = max_model_len = 64, guard
lifted) every draft forward asserts its query positions < the cache's rows (vLLM's input kernel computes
last position + 1 + offset, unclamped)."""
import json
import shutil

import pytest
import torch

from support.vllm_helpers import counter, run_vllm

pytestmark = pytest.mark.vllm

ROWS = 64
g = torch.Generator().manual_seed(64)
LONG = torch.randint(4, 384, (200,), generator=g).tolist()  # every position past the draft's range
CROSS = torch.randint(4, 384, (30,), generator=g).tolist()  # generates across position 64
EDGE = [torch.randint(4, 384, (n,), generator=g).tolist() for n in (20, 41)]  # prompt + 44 / 23 = 64

# debug check in the draft forward: every query position inside the RoPE cache (records the largest one seen)
CHECK_POSITIONS = """
from vllm_dflash.integration import vllm_model as M
M._test_max_pos = -1
if not getattr(M, "_test_checked", False):
    M._test_checked = True
    _fwd = M.DFlashDraftForVllm.forward
    def _checked(self, input_ids, positions, *a, **k):
        top = int(positions.max())
        M._test_max_pos = max(M._test_max_pos, top)
        rows = self.model.layers[0].self_attn.rotary_emb.cos_sin_cache.shape[0]
        assert top < rows, f"draft query position {top} past the RoPE cache ({rows} rows)"
        return _fwd(self, input_ids, positions, *a, **k)
    M.DFlashDraftForVllm.forward = _checked
"""
# the draft's max_model_len 4x its max_position_embeddings (vLLM's runner then runs the draft at every length up to
# it); runs share a process, so the runs with it come last
WIDEN = """
from vllm.config.speculative import SpeculativeConfig
SpeculativeConfig._maybe_override_draft_max_model_len = staticmethod(lambda spec, draft, target: 4 * draft)
"""
PROBE = """
from vllm_dflash.integration import vllm_model as M
probe["max_pos"] = M._test_max_pos
"""


@pytest.fixture(scope="module")
def short_draft(pair, tmp_path_factory):
    d = tmp_path_factory.mktemp("short-range") / "draft-b8"
    shutil.copytree(pair / "draft-b8", d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["max_position_embeddings"] = ROWS
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    return d


@pytest.fixture(scope="module")
def results(pair, short_draft):
    t = str(pair / "target")

    def spec(adaptive):
        return {"method": "dflash", "model": str(short_draft), "num_speculative_tokens": 7, "adaptive": adaptive}

    long = {"model": t, "prompts": [LONG], "max_tokens": 24, "max_model_len": 256, "repeat": 1}
    cross = {"model": t, "prompts": [CROSS], "max_tokens": 60, "max_model_len": 256, "repeat": 1}
    edge = [{"model": t, "prompts": [p], "max_tokens": ROWS - len(p), "max_model_len": ROWS} for p in EDGE]
    overlap = {"VLLM_DFLASH_OVERLAP": "1"}
    runs = {
        "base_long": long, "base_cross": cross,
        "fixed_long": {**long, "speculative_config": spec(False)},
        "adaptive_cross": {**cross, "speculative_config": spec(True)},
    }
    for i, e in enumerate(edge):
        runs[f"base_edge{i}"] = e
    wide = {
        "wide_fixed_long": {**long, "speculative_config": spec(False), "patch": WIDEN},
        "wide_fixed_cross": {**cross, "speculative_config": spec(False)},
        "wide_adaptive_long": {**long, "speculative_config": spec(True)},
        "wide_adaptive_cross": {**cross, "speculative_config": spec(True)},
        "wide_overlap_long": {**long, "speculative_config": spec(True), "env": overlap},
        "wide_overlap_fixed_cross": {**cross, "speculative_config": spec(False), "env": overlap},
    }
    runs.update(wide)
    for i, e in enumerate(edge):
        runs[f"wide_edge{i}"] = {**e, "speculative_config": spec(False), "patch": CHECK_POSITIONS, "after": PROBE}
    names = list(runs)
    return dict(zip(names, run_vllm([runs[n] for n in names])))


@pytest.mark.parametrize("name", ["fixed_long", "adaptive_cross", "wide_fixed_long", "wide_fixed_cross",
                                  "wide_adaptive_long", "wide_adaptive_cross", "wide_overlap_long",
                                  "wide_overlap_fixed_cross"])
def test_past_the_range_lossless_and_engine_stays_up(results, name):
    base = results["base_" + name.rsplit("_", 1)[1]]["tokens"]
    r = results[name]
    assert r["tokens"] == base, name
    assert r["repeats"][0]["tokens"] == base, f"{name}: the second request in the same engine"


def test_drafts_before_the_range_are_accepted(results):
    assert counter(results["wide_fixed_cross"], "vllm:spec_decode_num_accepted_tokens") > 0


def test_startup_names_both_numbers(results):
    log = results["fixed_long"]["log"]
    assert "max_model_len 256 is past the draft's RoPE range (max_position_embeddings 64)" in log
    assert "the draft's max_model_len 256 is past its RoPE cache (64 rows)" in log  # the widened runs


@pytest.mark.parametrize("i", range(len(EDGE)))
def test_block_positions_stay_inside_the_rope_cache_at_max_model_len(results, i):
    r = results[f"wide_edge{i}"]
    assert r["tokens"] == results[f"base_edge{i}"]["tokens"]
    assert len(r["tokens"][0]) == ROWS - len(EDGE[i])
    assert r["probe"]["max_pos"] == ROWS - 1  # the last block reached the end of the range (clamped there)
