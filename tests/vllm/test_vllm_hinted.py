# SPDX-License-Identifier: Apache-2.0
"""A hinted draft (dflash_config.hint_ngram) inside real vLLM (CPU, float32): each block the draft forward sees is
[anchor, h1 .. hm, MASK ..] with the request's prompt-lookup continuation, under adaptive drafting (synchronous and
overlap scheduling) and the fixed block (synchronous); greedy output stays the target's. A plain draft's blocks carry
no hint (the negative control of the probe), and a hinted draft with diffusion_steps > 1 fails before serving."""
import json
import shutil

import pytest
import torch

from support.vllm_helpers import run_vllm

pytestmark = pytest.mark.vllm

g = torch.Generator().manual_seed(23)
PROMPTS = [(torch.randint(4, 384, (5,), generator=g).tolist() * 5)[:22] for _ in range(4)]  # phrases to look up

# count the hint tokens (non-MASK tokens after each block's anchor) in every draft forward's input ids
RECORD = """
from vllm_dflash.integration import vllm_model as M
if not hasattr(M, "_test_hints"):  # wrap once per process (every run of the file shares it)
    _fwd = M.DFlashDraftForVllm.forward
    def _rec(self, input_ids, *a, **kw):
        B = 8
        n = input_ids.shape[0] // B * B
        blocks = input_ids[:n].view(-1, B)[:, 1:]
        M._test_hints.append(int((blocks != self._test_mask).sum()))
        return _fwd(self, input_ids, *a, **kw)
    M.DFlashDraftForVllm.forward = _rec
M._test_hints = []
"""
PROBE = """
from vllm_dflash.integration import vllm_model as M
probe["forwards"] = len(M._test_hints)
probe["hint_tokens"] = sum(M._test_hints)
"""


@pytest.fixture(scope="module")
def hinted(pair, tmp_path_factory):
    d = tmp_path_factory.mktemp("hinted") / "draft-b8-hinted"
    shutil.copytree(pair / "draft-b8", d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["dflash_config"]["hint_ngram"] = [2, 4]
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture(scope="module")
def results(pair, hinted):
    mask = json.loads((pair / "draft-b8" / "config.json").read_text())["dflash_config"]["mask_token_id"]
    record = RECORD + f"\nM.DFlashDraftForVllm._test_mask = {mask}\n"
    t = str(pair / "target")

    def spec(draft, **kw):
        return {"method": "dflash", "model": str(draft), "num_speculative_tokens": 7, **kw}

    common = {"model": t, "prompts": PROMPTS, "max_tokens": 40, "patch": record, "after": PROBE}
    runs = {
        "base": {"model": t, "prompts": PROMPTS, "max_tokens": 40},
        "adaptive": {**common, "speculative_config": spec(hinted, adaptive="dflash")},
        "adaptive_overlap": {**common, "speculative_config": spec(hinted, adaptive="dflash"),
                             "env": {"VLLM_DFLASH_OVERLAP": "1"}},
        "fixed": {**common, "speculative_config": spec(hinted, adaptive=False, overlap=False)},
        "plain_fixed": {**common, "speculative_config": spec(pair / "draft-b8", adaptive=False, overlap=False)},
        "two_steps": {"model": t, "prompts": PROMPTS, "speculative_config": spec(hinted, diffusion_steps=2),
                      "expect_error": "hinted draft"},
    }
    names = list(runs)
    return dict(zip(names, run_vllm([runs[n] for n in names])))


@pytest.mark.parametrize("name", ["adaptive", "adaptive_overlap", "fixed", "plain_fixed"])
def test_greedy_output_is_the_targets(results, name):
    assert results[name]["tokens"] == results["base"]["tokens"]


@pytest.mark.parametrize("name", ["adaptive", "adaptive_overlap", "fixed"])
def test_the_hinted_draft_is_fed_its_lookups(results, name):
    p = results[name]["probe"]
    assert p["forwards"] > 0 and p["hint_tokens"] > 0, p
    assert "hinted draft: each block is fed its prompt-lookup continuation" in results[name]["log"]


def test_a_plain_draft_gets_no_hints(results):
    p = results["plain_fixed"]["probe"]
    assert p["forwards"] > 0 and p["hint_tokens"] == 0, p


def test_hinted_draft_with_denoising_steps_fails_before_serving(results):
    err = results["two_steps"]["error"]
    assert err and "diffusion_steps" in err and "Fix" in err, err
