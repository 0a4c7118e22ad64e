# SPDX-License-Identifier: Apache-2.0
"""DraftCacheRecord (integration/draft_cache_record.py): which KV blocks lack draft K/V after dropped context rows,
and which new requests hit such a block through the prefix cache. Block size 4 here: slot = block * 4 + offset."""
import torch

from vllm_dflash.integration.draft_cache_record import DraftCacheRecord


def slots(*s):
    return torch.tensor(s, dtype=torch.int64)


def test_a_dropped_row_marks_its_block_and_padding_is_ignored():
    r = DraftCacheRecord(4)
    r.dropped(slots(9, 10, -1))  # block 2, offsets 1 and 2; padding
    assert r.incomplete == {2}


def test_a_block_is_complete_again_once_its_offset_0_row_is_written():
    r = DraftCacheRecord(4)
    r.dropped(slots(8, 9, 13))  # blocks 2 and 3
    r.written(slots(14, 15))  # block 3 at offsets 2, 3: the dropped row at offset 1 is still missing
    assert r.incomplete == {2, 3}
    r.written(slots(8, 9))  # block 2 reallocated: written from offset 0
    assert r.incomplete == {3}


def test_new_requests_whose_cached_prefix_holds_an_incomplete_block_are_reported():
    r = DraftCacheRecord(4)
    table = torch.tensor([[5, 2, 7], [5, 6, 7], [1, 2, 3]])  # block ids per batch row
    assert r.admit(["a"], slots(0, 1), slots(0, 2), table) == []  # nothing dropped yet
    r.dropped(slots(2 * 4 + 1))  # block 2
    # positions: a decodes at 9 (not new), b prefills from 8 (blocks 5, 6 cached), c starts at 5 (blocks 1, 2)
    out = r.admit(["a", "b", "c"], slots(9, 8, 9, 10, 5, 6), slots(0, 1, 4, 6), table)
    assert out == ["c"]
    # c again in the next step: not new, not reported again; a request past position 0 of block 2 only: reported
    assert r.admit(["c", "d"], slots(7, 1), slots(0, 1, 2), torch.tensor([[1, 2], [2, 4]])) == ["d"]


def test_a_request_back_after_a_step_away_is_checked_again():
    r = DraftCacheRecord(4)
    table = torch.tensor([[3, 0]])
    r.dropped(slots(12))  # block 3
    assert r.admit(["a"], slots(4), slots(0, 1), table) == ["a"]
    assert r.admit(["b"], slots(0), slots(0, 1), table) == []  # b starts at position 0: no cached prefix
    assert r.admit(["a"], slots(5), slots(0, 1), table) == ["a"]


def test_a_request_at_position_0_is_never_reported():
    r = DraftCacheRecord(4)
    r.dropped(slots(0, 1, 2, 3))
    assert r.admit(["a"], slots(0, 1, 2), slots(0, 3), torch.tensor([[0]])) == []
