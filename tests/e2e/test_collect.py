# SPDX-License-Identifier: Apache-2.0
"""`vllm-dflash collect` through real vLLM: bad records counted and skipped, resume, Ray sharding, multi-turn
conversations answered with the target's own replies, the compact part format on disk. The part format and
--exclude-collected without vLLM: tests/unit/test_collect_parts.py."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_dflash.data.collect import load_records
from support.vllm_helpers import BASE_ENV

CLI = [str(Path(sys.executable).with_name("vllm-dflash"))]


def _prompts(path: Path) -> Path:
    rows = [{"id": f"good-{i}", "messages": [{"role": "user", "content": f"def f{i}(x):\n    return x * {i}"}]}
            for i in range(6)]
    rows.append({"id": "chat-mt", "messages": [{"role": "user", "content": "Name a colour."}],
                 "followups": ["Why that one?"]})
    rows.append({"id": "too-long", "prompt": "word " * 400})
    rows.append({"id": "bad-messages", "messages": "not a list of messages"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _collect(pair, out, prompts, *extra):
    env = {**os.environ, **BASE_ENV}
    proc = subprocess.run(CLI + ["collect", "--target", str(pair / "target"), "--out", str(out), "--prompts", str(prompts),
                                 "--max-prompt-tokens", "96", "--max-new-tokens", "12", "--sample-fraction", "0",
                                 "--chunk-size", "4", "--dtype", "float32", "--enforce-eager", *extra], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "manifest.json").read_text())


@pytest.mark.vllm
def test_collect_skips_bad_records_and_resumes(pair, tmp_path):
    prompts = _prompts(tmp_path / "p.jsonl")
    man = _collect(pair, tmp_path / "c", prompts)
    assert man["num_records"] == 8  # 6 prompts + 2 turns of the conversation
    assert man["skipped"]["prompt_too_long"] == 1
    assert sum(v for k, v in man["skipped"].items() if k.startswith("render_error")) == 1
    recs = load_records(tmp_path / "c")
    assert all(r["response_ids"] and r["prompt_ids"] for r in recs)
    assert sorted((tmp_path / "c").glob("part-*.npz")) and not list((tmp_path / "c").glob("part-*.jsonl.gz"))
    by_id = {r["id"]: r for r in recs}
    t0, t1 = by_id["chat-mt"], by_id["chat-mt#t1"]
    # turn 1's prompt is turn 0's prompt + the target's own reply (re-rendered by the chat template) + the next turn
    assert t1["turn"] == 1 and t1["prompt_ids"][: len(t0["prompt_ids"])] == t0["prompt_ids"]
    assert len(t1["prompt_ids"]) > len(t0["prompt_ids"]) + len(t0["response_ids"])
    again = _collect(pair, tmp_path / "c", prompts)  # resume: nothing left to do, nothing duplicated
    assert again["num_records"] == 8 and len(load_records(tmp_path / "c")) == 8
    # the Ray path: two local actors, one vLLM engine each, merged; same records as one engine
    ray_man = _collect(pair, tmp_path / "r", prompts, "--ray", "2")
    assert ray_man["ray_workers"] == 2 and ray_man["num_records"] == 8
    key = lambda r: r["id"]
    single = sorted(recs, key=key)
    sharded = sorted(load_records(tmp_path / "r"), key=key)
    assert [(r["id"], r["prompt_ids"], r["response_ids"]) for r in sharded] == \
           [(r["id"], r["prompt_ids"], r["response_ids"]) for r in single]
