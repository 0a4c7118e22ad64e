# SPDX-License-Identifier: Apache-2.0
"""The served feature check's verdicts (vllm_dflash/bench/soak/features.py) catch what they are meant to catch, on
doctored replies (fast, no vLLM): a greedy difference passes only as a near-tie, logprobs must agree, an over-long
prompt must get stock's status, n=2 must give two valid choices, min_tokens must hold, and the stock server must run
without our plugin. The check against real servers is tests/e2e/test_soak_features_served.py."""
import copy

import pytest

from vllm_dflash.bench.soak import features as F


def _reply(ids=(5, 6, 7), text="abc", finish="length", logprobs=None, status=200, n=1, prompt_logprobs=None):
    chs = [{"index": i, "text": text, "token_ids": list(ids), "finish_reason": finish, "logprobs": logprobs,
            "prompt_logprobs": prompt_logprobs} for i in range(n)]
    return {"status": status, "choices": chs if status == 200 else [], "usage": {"completion_tokens": n * len(ids)},
            "prompt_token_ids": [1, 2], "error": "" if status == 200 else "bad"}


def _case(name):
    return next(c for c in F.feature_cases([1] * 8, [1] * 24) if c["name"] == name)


def test_cases_cover_the_issue_features():
    names = {c["name"] for c in F.feature_cases([1] * 8, [1] * 24)}
    assert {"logprobs", "penalties", "repetition_penalty", "stop", "json_schema", "regex", "max_tokens_1",
            "min_tokens", "prompt_logprobs", "near_max_model_len", "n2_sampled", "too_long_prompt"} <= names
    assert all(c["body"]["temperature"] == 0.0 for c in F.feature_cases([1], [1]) if c["check"] == "greedy")


def test_identical_greedy_passes_and_a_difference_only_as_a_near_tie():
    c = _case("penalties")
    assert F.compare_case(c, _reply(), _reply(), "float32")["ok"]
    other = _reply(ids=(5, 9, 7), text="axc")
    v = F.compare_case(c, _reply(), other, "float32", margin=0.01)
    assert not v["ok"] and v["first_difference"] == 1  # float32 allows no near-tie
    assert F.compare_case(c, _reply(), other, "bfloat16", margin=0.01)["ok"]
    assert not F.compare_case(c, _reply(), other, "bfloat16", margin=3.0)["ok"]
    assert not F.compare_case(c, _reply(), other, "bfloat16", margin=None)["ok"]  # unexplained
    assert not F.compare_case(c, _reply(), _reply(finish="stop"), "float32")["ok"]
    assert not F.compare_case(c, _reply(), _reply(status=500), "float32")["ok"]


def test_logprobs_must_agree():
    c = _case("logprobs")
    assert F.compare_case(c, _reply(logprobs=[-0.1, -0.2, -0.3]), _reply(logprobs=[-0.1, -0.2, -0.3001]),
                          "float32")["ok"]
    assert not F.compare_case(c, _reply(logprobs=[-0.1, -0.2, -0.3]), _reply(logprobs=[-0.1, -0.2, -0.5]),
                              "float32")["ok"]
    assert not F.compare_case(c, _reply(logprobs=[-0.1, -0.2, -0.3]), _reply(logprobs=None), "float32")["ok"]


def test_prompt_logprobs_and_min_tokens():
    c = _case("prompt_logprobs")
    assert F.compare_case(c, _reply(prompt_logprobs=5), _reply(prompt_logprobs=5), "float32")["ok"]
    assert not F.compare_case(c, _reply(prompt_logprobs=5), _reply(prompt_logprobs=None), "float32")["ok"]
    m = _case("min_tokens")
    short = _reply(ids=(5, 6), finish="stop")
    assert not F.compare_case(m, short, copy.deepcopy(short), "float32")["ok"]  # stopped before min_tokens


def test_over_long_prompt_status_and_n2():
    t = _case("too_long_prompt")
    assert F.compare_case(t, _reply(status=400), _reply(status=400), "float32")["ok"]
    assert not F.compare_case(t, _reply(status=400), _reply(status=500), "float32")["ok"]
    assert not F.compare_case(t, _reply(status=400), _reply(status=0), "float32")["ok"]  # no response: a crash
    s = _case("n2_sampled")
    assert F.compare_case(s, _reply(n=2), _reply(n=2), "float32")["ok"]
    assert not F.compare_case(s, _reply(n=2), _reply(n=1), "float32")["ok"]
    bad = _reply(n=2)
    bad["choices"][1]["finish_reason"] = "abort"
    assert not F.compare_case(s, _reply(n=2), bad, "float32")["ok"]


def test_stock_server_runs_without_our_plugin(monkeypatch):
    """VLLM_PLUGINS for the stock server names no vllm_dflash (vLLM splits it on commas and loads only those)."""
    assert F.PLUGIN_NAME not in F.stock_plugins_env().split(",")
    res = {"meta": {"plugin_loaded": {"stock": True, "dflash": True}}, "cases": [], "after": {},
           "server_log_errors": {}}
    assert not {c["name"]: c for c in F.evaluate_features(res)}["stock_without_plugin"]["ok"]


@pytest.mark.parametrize("text,stop", [("", ["\n\n"]), ("abcdefgh", ["efg"])])
def test_stop_strings_occur_in_the_stock_output(text, stop):
    assert F.stop_from(text) == stop
    assert not text or stop[0] in text
