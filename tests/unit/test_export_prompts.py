# SPDX-License-Identifier: Apache-2.0
"""`vllm-dflash bench --export-prompts SET OUT` (docs/BENCHMARKS-VLLM.md): a prompt set, in order, as the ShareGPT
JSON that `vllm bench serve --dataset-name sharegpt` reads (each entry's first turn, from "human", is the prompt;
vLLM skips entries with fewer than two turns), the same user message that `vllm-dflash bench` sends; a prompt that is
not one user message is refused. The served run: tests/e2e/test_vllm_bench_serve.py."""
import json

import pytest

from vllm_dflash.bench.run import export_prompts, load_prompt_set
from vllm_dflash.cli import main


def test_a_prompt_file_exported_in_order(tmp_path, capsys):
    src, out = tmp_path / "p.jsonl", tmp_path / "sub" / "p.json"
    src.write_text(json.dumps({"prompt": "def f(x):"}) + "\n"
                   + json.dumps({"id": "b", "messages": [{"role": "user", "content": "Say hi."}]}) + "\n")
    assert main(["bench", "--export-prompts", str(src), str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["id"] for r in rows] == ["p-0", "b"]
    assert all([t["from"] for t in r["conversations"]] == ["human", "gpt"] for r in rows)
    sent = [it["messages"][0]["content"] for it in load_prompt_set(str(src), None)]
    assert [r["conversations"][0]["value"] for r in rows] == sent == ["def f(x):", "Say hi."]
    assert "wrote 2 prompts" in capsys.readouterr().out


def test_a_prompt_of_several_turns_is_refused(tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_text(json.dumps({"id": "two", "messages": [{"role": "system", "content": "Be brief."},
                                                         {"role": "user", "content": "Hi."}]}) + "\n")
    with pytest.raises(ValueError, match="'two'.*one user message"):
        export_prompts(str(src), str(tmp_path / "p.json"))
    assert not (tmp_path / "p.json").exists()
