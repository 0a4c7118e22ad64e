# SPDX-License-Identifier: Apache-2.0
"""The collector's storage without vLLM (split from tests/e2e/test_collect.py): the compact part format round trip and
the ids other collection folders answered (--exclude-collected)."""
import os

import pytest


def test_part_format_round_trip(tmp_path):
    """The compact part (uint16 ids, uint32 past 65,535) gives back exactly the records written."""
    from vllm_dflash.data.collect import decode_part, encode_part

    recs = [{"id": "a", "source": "s", "prompt_ids": [1, 2, 65535], "response_ids": [7], "temperature": 0.0,
             "finish_reason": "stop", "turn": 0},
            {"id": "b#t1", "source": "s", "prompt_ids": [3], "response_ids": [4, 5, 6], "temperature": 0.7,
             "finish_reason": "length", "turn": 1}]
    for extra in ([], [70000]):
        recs[1]["response_ids"] = [4, 5, 6] + extra
        (tmp_path / "p.npz").write_bytes(encode_part(recs))
        assert decode_part(tmp_path / "p.npz") == recs


def test_collected_ids_of_other_folders(tmp_path):
    """--exclude-collected: ids answered (or skipped) in other folders, shards included; a folder without a
    manifest is named with the fix."""
    import json

    from vllm_dflash.data.collect import collected_ids

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "manifest.json").write_text(json.dumps({"done_ids": ["x", "y"], "skipped_ids": ["z"]}))
    (tmp_path / "b" / "shard-0").mkdir(parents=True)
    (tmp_path / "b" / "manifest.json").write_text(json.dumps({"shards": ["shard-0"]}))
    (tmp_path / "b" / "shard-0" / "manifest.json").write_text(json.dumps({"done_ids": ["w"]}))
    assert collected_ids([tmp_path / "a", tmp_path / "b"]) == {"x", "y", "z", "w"}
    with pytest.raises(FileNotFoundError, match="exclude_collected.*Fix"):
        collected_ids([tmp_path / "missing"])


def test_the_collector_opts_its_engine_in_to_our_vllm_fixes(monkeypatch):
    """The collector's engine has no DFlash drafter, so the walls keep our vLLM fixes out of it unless the process
    opts in; sampled collection needs the seeded-chunked-prefill fix on CPU, so `opt_in_to_fixes` sets
    DFLASH_VLLM_EXTRAS=fixes, and leaves a level the caller chose alone."""
    from vllm_dflash.data.collect import opt_in_to_fixes

    for name in ("DFLASH_VLLM_EXTRAS", "VLLM_DFLASH_VLLM_EXTRAS"):
        monkeypatch.setenv(name, "off")  # recorded first, so teardown restores the variable's absence too
        monkeypatch.delenv(name)
    opt_in_to_fixes()
    assert os.environ["DFLASH_VLLM_EXTRAS"] == "fixes"
    monkeypatch.setenv("DFLASH_VLLM_EXTRAS", "all")
    opt_in_to_fixes()
    assert os.environ["DFLASH_VLLM_EXTRAS"] == "all"
