# SPDX-License-Identifier: Apache-2.0
"""Adaptive drafting inside real vLLM (CPU, V1 runner): lossless greedy output with every source, per source and
with max_model_len mid-block, with synchronous scheduling (default) and with overlap (VLLM_DFLASH_OVERLAP=1: our
AsyncScheduler subclass plans the lengths); drafts really verified and accepted. The merged source (prompt-lookup
tokens first, the DFlash block after them) is checked in float32, where greedy identity is exact."""
import pytest
import torch

from support.vllm_helpers import counter, run_vllm

pytestmark = pytest.mark.vllm

g = torch.Generator().manual_seed(77)
# half random prompts, half that repeat a phrase (prompt lookup has something to copy)
PROMPTS = [torch.randint(4, 384, (12,), generator=g).tolist() for _ in range(4)] + \
          [(torch.randint(4, 384, (5,), generator=g).tolist() * 4)[:18] for _ in range(4)]


OVERLAP = {"VLLM_DFLASH_OVERLAP": "1"}
F32 = {"dtype": "float32"}


def _spec(pair, adaptive, b=8):
    return {"method": "dflash", "model": str(pair / f"draft-b{b}"), "num_speculative_tokens": b - 1,
            "adaptive": adaptive}


@pytest.fixture(scope="module")
def results(pair):
    t = str(pair / "target")
    runs = {
        "base": {"model": t, "prompts": PROMPTS, "max_tokens": 48},
        "both": {"model": t, "prompts": PROMPTS, "max_tokens": 48, "speculative_config": _spec(pair, True)},
        "ngram": {"model": t, "prompts": PROMPTS, "max_tokens": 48, "speculative_config": _spec(pair, "ngram")},
        "dflash16": {"model": t, "prompts": PROMPTS, "max_tokens": 48, "speculative_config": _spec(pair, "dflash", 16)},
        "base_short": {"model": t, "prompts": PROMPTS, "max_tokens": 100, "max_model_len": 50},
        "both_short": {"model": t, "prompts": PROMPTS, "max_tokens": 100, "max_model_len": 50,
                       "speculative_config": _spec(pair, True)},
        "both_overlap": {"model": t, "prompts": PROMPTS, "max_tokens": 48, "speculative_config": _spec(pair, True),
                         "env": OVERLAP},
        "ngram_overlap": {"model": t, "prompts": PROMPTS, "max_tokens": 48,
                          "speculative_config": _spec(pair, "ngram"), "env": OVERLAP},
        "dflash16_overlap": {"model": t, "prompts": PROMPTS, "max_tokens": 48,
                             "speculative_config": _spec(pair, "dflash", 16), "env": OVERLAP},
        "both_short_overlap": {"model": t, "prompts": PROMPTS, "max_tokens": 100, "max_model_len": 50,
                               "speculative_config": _spec(pair, True), "env": OVERLAP},
        "base32": {"model": t, "prompts": PROMPTS, "max_tokens": 48, "llm_kwargs": F32},
        "merged32": {"model": t, "prompts": PROMPTS, "max_tokens": 48, "speculative_config": _spec(pair, "merged"),
                     "llm_kwargs": F32},
        "merged32_overlap": {"model": t, "prompts": PROMPTS, "max_tokens": 48,
                             "speculative_config": _spec(pair, "merged"), "llm_kwargs": F32, "env": OVERLAP},
        "bad_value": {"model": t, "prompts": PROMPTS, "speculative_config": _spec(pair, "medusa"),
                      "expect_error": "speculative_config.adaptive"},
    }
    names = list(runs)
    return dict(zip(names, run_vllm([runs[n] for n in names])))


@pytest.mark.parametrize("name", ["both", "ngram", "dflash16", "both_overlap", "ngram_overlap", "dflash16_overlap",
                                  "merged32", "merged32_overlap"])
def test_greedy_lossless(results, name):
    base = "base32" if name.startswith("merged32") else "base"
    assert results[name]["tokens"] == results[base]["tokens"]
    assert results[name]["async_scheduling"] == name.endswith("_overlap")


def test_drafts_are_verified_and_accepted(results):
    for name in ("both", "ngram", "dflash16", "both_overlap", "ngram_overlap", "dflash16_overlap", "merged32",
                 "merged32_overlap"):
        r = results[name]
        assert counter(r, "vllm:spec_decode_num_draft_tokens") > 0, name
        assert counter(r, "vllm:spec_decode_num_accepted_tokens") > 0, name


def test_adaptive_is_logged(results):
    assert "adaptive drafting ON (sources: both" in results["both"]["log"]
    assert "adaptive drafting ON (sources: merged" in results["merged32"]["log"]
    assert "lengths planned in the scheduler (overlap)" in results["both_overlap"]["log"]


def test_overlap_plans_multi_token_drafts(results):
    """Under overlap the scheduler plans the lengths: on the repeating prompts prompt lookup is accepted beyond the
    first position (the scheduler asked for more than one draft), and the acceptance counters add up."""
    r = results["ngram_overlap"]
    per_pos = r["metrics"]["vllm:spec_decode_num_accepted_tokens_per_pos"]
    assert per_pos[1] > 0
    assert sum(per_pos) == counter(r, "vllm:spec_decode_num_accepted_tokens")


@pytest.mark.parametrize("name", ["both_short", "both_short_overlap"])
def test_max_model_len_mid_block(results, name):
    assert results[name]["tokens"] == results["base_short"]["tokens"]


def test_bad_settings_fail_before_serving(results):
    assert "speculative_config.adaptive" in results["bad_value"]["error"]
