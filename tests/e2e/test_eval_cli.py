# SPDX-License-Identifier: Apache-2.0
"""`vllm-dflash eval` on a prompt file, with the reference loop and through vLLM (--json output). The tokens-per-forward
arithmetic of a vLLM run: tests/unit/test_eval_tokens_per_forward.py."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.vllm_helpers import BASE_ENV

CLI = [str(Path(sys.executable).with_name("vllm-dflash"))]
KEYS = {"acceptance_length", "per_position_acceptance", "num_prompts", "speedup", "histogram"}


def _eval(pair, prompts, *extra):
    proc = subprocess.run(CLI + ["eval", "--target", str(pair / "target"), "--draft", str(pair / "draft-b8"),
                                 "--prompts", str(prompts), "--max-new-tokens", "24", "--json", *extra],
                          env={**os.environ, **BASE_ENV}, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def prompts(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in [
        {"prompt": "def parse(x):\n    return"}, {"messages": [{"role": "user", "content": "import os"}]},
        {"prompt": "class Config:\n    def __init__(self"}]))
    return p


def test_eval_reference(pair, prompts):
    r = _eval(pair, prompts)
    assert KEYS <= set(r) and r["num_prompts"] == 3 and len(r["per_position_acceptance"]) == 7
    assert r["acceptance_length"] >= 1.0 and r["speedup"] > 0


@pytest.mark.vllm
def test_eval_vllm_engine(pair, prompts):
    r = _eval(pair, prompts, "--engine", "vllm", "--ngram", "3")
    assert KEYS <= set(r) and r["engine"] == "vllm" and r["num_prompts"] == 3
    ng = r["ngram"]  # the prompt-lookup baseline on the same prompts
    assert ng["num_speculative_tokens"] == 3 and len(ng["per_position_acceptance"]) == 3
    assert ng["acceptance_length"] >= 1.0 and ng["speedup"] > 0
    # request-steps = generated - accepted (steps without a proposal included): 1 <= tokens per forward <= τ
    assert 1.0 <= ng["tokens_per_forward"] <= ng["acceptance_length"] + 1e-9
    assert r["acceptance_length"] >= 1.0 and r["speedup"] > 0 and r["num_steps"] > 0
    assert 0 < r["draft_time_share"] < 1  # measured from our drafter metrics, not a constant
    # every request-step yields >= 1 token; the prompt-finishing step yields 1 <= τ
    assert 1.0 <= r["tokens_per_forward"] <= r["acceptance_length"] + 1e-9


def test_eval_bad_prompt_file(pair, tmp_path):
    proc = subprocess.run(CLI + ["eval", "--target", str(pair / "target"), "--draft", str(pair / "draft-b8"),
                                 "--prompts", str(tmp_path / "missing.jsonl")], capture_output=True, text=True)
    assert proc.returncode == 2 and "does not exist" in proc.stderr
