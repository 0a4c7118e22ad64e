# SPDX-License-Identifier: Apache-2.0
"""`vllm-dflash collect` through real vLLM: bad records counted and skipped, resume, Ray sharding."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_dflash.data.collect import load_records
from vllm_helpers import BASE_ENV

pytestmark = pytest.mark.vllm
CLI = [str(Path(sys.executable).with_name("vllm-dflash"))]


def _prompts(path: Path) -> Path:
    rows = [{"id": f"good-{i}", "messages": [{"role": "user", "content": f"def f{i}(x):\n    return x * {i}"}]}
            for i in range(6)]
    rows.append({"id": "too-long", "prompt": "word " * 400})
    rows.append({"id": "bad-messages", "messages": "not a list of messages"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _collect(pair, out, prompts, *extra):
    env = {**os.environ, **BASE_ENV}
    proc = subprocess.run(CLI + ["collect", "--target", str(pair / "target"), "--out", str(out), "--prompts", str(prompts),
                                 "--max-prompt-tokens", "96", "--max-new-tokens", "12", "--sample-fraction", "0",
                                 "--chunk-size", "4", *extra], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "manifest.json").read_text())


def test_collect_skips_bad_records_and_resumes(pair, tmp_path):
    prompts = _prompts(tmp_path / "p.jsonl")
    man = _collect(pair, tmp_path / "c", prompts)
    assert man["num_records"] == 6
    assert man["skipped"]["prompt_too_long"] == 1
    assert sum(v for k, v in man["skipped"].items() if k.startswith("render_error")) == 1
    recs = load_records(tmp_path / "c")
    assert all(r["response_ids"] and r["prompt_ids"] for r in recs)
    again = _collect(pair, tmp_path / "c", prompts)  # resume: nothing left to do, nothing duplicated
    assert again["num_records"] == 6 and len(load_records(tmp_path / "c")) == 6
    # the Ray path: two local actors, one vLLM engine each, merged; same records as one engine
    ray_man = _collect(pair, tmp_path / "r", prompts, "--ray", "2")
    assert ray_man["ray_workers"] == 2 and ray_man["num_records"] == 6
    key = lambda r: r["id"]
    single = sorted(recs, key=key)
    sharded = sorted(load_records(tmp_path / "r"), key=key)
    assert [(r["id"], r["prompt_ids"], r["response_ids"]) for r in sharded] == \
           [(r["id"], r["prompt_ids"], r["response_ids"]) for r in single]
