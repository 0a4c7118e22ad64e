# SPDX-License-Identifier: Apache-2.0
"""Bad draft configurations fail at start-up with a message naming the field and the fix:
through LLM(...) and through `vllm serve` (non-zero exit)."""
import json
import shutil
import subprocess
import sys

import pytest

from support.vllm_helpers import run_vllm

pytestmark = pytest.mark.vllm


def _variant(pair, tmp_path, name, edit):
    d = tmp_path / name
    shutil.copytree(pair / "draft-b8", d)
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


CASES = {
    "missing_folder": (lambda p, t: ("/nonexistent/draft", 7), "does not exist"),
    "too_many_tokens": (lambda p, t: (str(p / "draft-b8"), 8), "num_speculative_tokens"),
    "other_target": (lambda p, t: (_variant(p, t, "layers", lambda c: c.update(num_target_layers=30)), 7),
                     "num_target_layers"),
    "mask_outside_vocab": (lambda p, t: (_variant(p, t, "mask", lambda c: c["dflash_config"].update(mask_token_id=5000)), 7),
                           "mask_token_id"),
    "layer_id_too_big": (lambda p, t: (_variant(p, t, "lid", lambda c: c["dflash_config"].update(target_layer_ids=[0, 9])), 7),
                         "target_layer_ids"),
    "hidden_mismatch": (lambda p, t: (_variant(p, t, "hid", lambda c: c.update(hidden_size=256)), 7), "hidden_size"),
    "vocab_mismatch": (lambda p, t: (_variant(p, t, "voc", lambda c: c.update(vocab_size=500)), 7), "vocab_size"),
    "unsupported_block": (lambda p, t: (_variant(p, t, "blk", lambda c: c.update(block_size=6)), 5), "block_size"),
    "head_size": (lambda p, t: (_variant(p, t, "head", lambda c: c.update(head_dim=48)), 7), "head_dim"),
    "bad_json": (lambda p, t: (_variant(p, t, "json", lambda c: None), 7), "not valid JSON"),
}


def test_llm_rejects_bad_configs(pair, tmp_path):
    specs, names = [], []
    for name, (make, _) in CASES.items():
        model, k = make(pair, tmp_path)
        if name == "bad_json":
            (tmp_path / "json" / "config.json").write_text("{oops")
        specs.append({"model": str(pair / "target"), "prompts": [[5, 6]], "expect_error": True,
                      "speculative_config": {"method": "dflash", "model": model, "num_speculative_tokens": k}})
        names.append(name)
    specs.append({"model": str(pair / "target"), "prompts": [[5, 6]], "expect_error": True,
                  "speculative_config": {"method": "dflash", "model": str(pair / "draft-b8"),
                                         "num_speculative_tokens": 7, "diffusion_steps": 0}})
    names.append("bad_diffusion_steps")
    results = run_vllm(specs)
    for name, res in zip(names, results):
        words = CASES[name][1] if name in CASES else "diffusion_steps"
        assert res["error"], f"{name}: LLM(...) accepted a bad config"
        assert words in res["error"] and "Fix:" in res["error"], f"{name}: unclear error: {res['error']}"


def test_vllm_serve_exits_with_message(pair, tmp_path):
    from vllm_dflash.serve.server import vllm_executable

    bad = [json.dumps({"method": "dflash", "model": "/nonexistent/draft", "num_speculative_tokens": 7}),
           '{"method": "dflash", "model": ']  # broken JSON
    for spec, words in zip(bad, ["does not exist", "speculative"]):
        proc = subprocess.run(vllm_executable() + ["serve", str(pair / "target"), "--speculative-config", spec,
                                                   "--port", "0"], capture_output=True, text=True, timeout=300)
        assert proc.returncode != 0
        assert words in (proc.stdout + proc.stderr)
