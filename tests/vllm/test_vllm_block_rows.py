# SPDX-License-Identifier: Apache-2.0
"""The draft forward over the requests that use it (integration/block_rows.py), inside real vLLM (CPU, float32,
adaptive drafting, synchronous scheduling).

Four requests decode together; a fixed plan gives DFlash tokens to the first and third request only (by arrival), so
every block step selects some rows of the batch. Checked: the drafts of the selected requests are the same token for
token whether the forward ran over them alone or over the whole batch (`block_subset` forced off: the negative
control that the subset path ran at all is the row count), the selected rows were fewer than the batch, and the
output is the target's greedy output. Plus the subset's metadata and indices on a hand-made batch."""
import pytest
import torch

from support.block_plan import block_prompts, run_fixed_plan

pytestmark = pytest.mark.vllm

PROMPTS = block_prompts(seed=5)
MAX_TOKENS = 24
# DFlash tokens (all K) for requests 0 and 2 (order of arrival), none for 1 and 3; the guard cannot turn it off
PLAN = [("dflash", None), ("none", 0)]


@pytest.fixture(scope="module")
def results(pair):
    r = run_fixed_plan(pair, "dflash", PLAN, "block_subset", PROMPTS, MAX_TOKENS)
    return {"base": r["base"], "subset": r["test"], "full": r["control"]}


def test_output_is_the_targets(results):
    assert results["subset"]["tokens"] == results["base"]["tokens"]
    assert results["full"]["tokens"] == results["base"]["tokens"]


def test_forward_ran_over_the_selected_rows_only(results):
    sub, full = results["subset"]["probe"]["blocks"], results["full"]["probe"]["blocks"]
    assert sub and full
    assert any(b["ran"] < b["batch"] for b in sub), sub[:3]  # the subset path ran
    assert all(b["ran"] == b["batch"] for b in full)  # the control: every row, every call
    assert all(set(b["rows"]) <= {"0", "2"} for b in sub)


def test_selected_drafts_equal_the_full_forwards(results):
    sub, full = results["subset"]["probe"]["blocks"], results["full"]["probe"]["blocks"]
    assert len(sub) == len(full)
    for i, (a, b) in enumerate(zip(sub, full)):
        drafts_a = {req: d for req, (_, d) in a["rows"].items()}
        drafts_b = {req: d for req, (_, d) in b["rows"].items()}
        assert drafts_a == drafts_b, (i, a, b)


def test_subset_metadata_and_indices():
    from vllm.v1.attention.backend import CommonAttentionMetadata

    from vllm_dflash.integration.block_rows import block_subset, subset_sample_idx

    B, q, K = 4, 3, 2
    seq = torch.tensor([10, 20, 30, 40], dtype=torch.int32)
    cad = CommonAttentionMetadata(
        query_start_loc=torch.arange(B + 1, dtype=torch.int32) * q, query_start_loc_cpu=torch.arange(B + 1) * q,
        seq_lens=seq, num_reqs=B, num_actual_tokens=B * q, max_query_len=q, max_seq_len=40,
        block_table_tensor=torch.arange(B * 5).view(B, 5), slot_mapping=torch.arange(100, 100 + B * q),
        causal=False, seq_lens_cpu_upper_bound=seq.clone())
    sub, idx = block_subset(cad, [1, 3], q)
    assert idx.tolist() == [3, 4, 5, 9, 10, 11]
    assert sub.num_reqs == 2 and sub.num_actual_tokens == 6 and sub.max_query_len == q
    assert sub.query_start_loc.tolist() == [0, 3, 6] and sub.query_start_loc_cpu.tolist() == [0, 3, 6]
    assert sub.seq_lens.tolist() == [20, 40] and sub.seq_lens_cpu_upper_bound.tolist() == [20, 40]
    assert sub.block_table_tensor.tolist() == [[5, 6, 7, 8, 9], [15, 16, 17, 18, 19]]
    assert sub.slot_mapping.tolist() == [103, 104, 105, 109, 110, 111]
    # the MASK slots of request r are r * q + 1 .. r * q + K; in the subset, request j's are j * q + 1 ..
    sample = torch.tensor([r * q + 1 + t for r in range(B) for t in range(K)], dtype=torch.int32)
    assert subset_sample_idx(sample, [1, 3], q, K).tolist() == [1, 2, 4, 5]
    assert block_subset(cad, [0, 1, 2, 3], q) is None  # every request: the full forward
    assert block_subset(cad, [], q) is None
