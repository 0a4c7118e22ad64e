# SPDX-License-Identifier: Apache-2.0
"""The soak test's checks (vllm_dflash/bench/soak/: report.py, plan.py) catch what they are meant to catch (fast, no
vLLM). The quick soak against a real `vllm serve` with our drafter is tests/e2e/test_soak.py."""
import copy
from pathlib import Path

import pytest

from vllm_dflash.bench.soak import report as soak_report


def _outcome(tag, kind="greedy", status="ok", **kw):
    o = {"tag": tag, "kind": kind, "case": kw.pop("case", "g00"), "endpoint": "chat", "stream": False,
         "status": status, "http_code": 200, "text": "x = 1", "finish_reason": "length", "completion_tokens": 4,
         "max_tokens": 4, "stop": [], "chunks": 0, "latency_s": 1.0, "error": ""}
    o.update(kw)
    return o


def _good_result():
    outs = [_outcome("soak-r1-00000"), _outcome("soak-r1-00001", kind="malformed", status="http_4xx", http_code=400,
                                                  case="bad_top_p"),
            _outcome("soak-r1-00002", kind="timeout", status="timed_out"),
            _outcome("soak-r1-00003", kind="disconnect", status="disconnected"),
            _outcome("soak-r1-00004", kind="malformed", status="http_4xx", http_code=400, case="too_long_prompt"),
            _outcome("soak-r1-00005", case="f-logprobs")]
    alone = {"g00": "x = 1", "f-logprobs": "x = 1"}
    log = {"added": {"soak-r1-00000", "soak-r1-00002", "soak-r1-00003", "soak-r1-00005"},
           "aborted": {"soak-r1-00002", "soak-r1-00003"}}
    rounds = []
    for i in (1, 2):
        r = soak_report.summarize_round(outs, alone, 10.0)
        r.update(index=i, after={"kv_cache_usage": 0.0, "running": 0.0, "waiting": 0.0, "rss_bytes": 100},
                 server_log=soak_report.account(outs, log, "soak-r1"), metrics={"tau": 1.0})
        rounds.append(r)
    restart = soak_report.summarize_restart(
        [_outcome("soak-restart-00000"), _outcome("soak-restart-00001", status="error", http_code=None,
                                                  error="ConnectError: All connection attempts failed")],
        [_outcome("soak-restarted-00000")], alone, 3.0, 40.0, 45.0, "old.log", 0)
    return {"meta": {"duration_limit_s": 300, "wall_s": 200, "restart": True, "features": ["f-logprobs"],
                     "preempt": False},
            "restart": restart, "alone": {"all_ok": True}, "rounds": rounds,
            "memory": {"growth_round2": 0.001}, "final": {"identical": True},
            "metrics_consistency": {"ours": 5.0, "vllm": 5.0},
            "startup_suite": [{"name": "missing_draft", "ok": True}],
            "server_log_errors": {"logged_4xx_replies": 0, "other": []},
            "server_stop": {"group_gone": True, "exit_code": 0}}


def _failed(res):
    return {c["name"] for c in soak_report.evaluate(res) if not c["ok"]}


def test_checks_pass_on_a_clean_result():
    assert _failed(_good_result()) == set()


@pytest.mark.parametrize("name,doctor", [
    ("no_5xx", lambda r: r["rounds"][0].update(failed_5xx=1)),
    ("only_malformed_4xx", lambda r: r["rounds"][1]["valid_4xx"].append({"tag": "soak-r2-00007"})),
    ("malformed_rejected", lambda r: r["rounds"][0]["malformed"].update(rejected_4xx=0)),
    ("greedy_identical_under_load", lambda r: r["rounds"][0]["greedy"].update(identical=0)),
    ("nothing_lost", lambda r: r["rounds"][0]["server_log"]["added_unaccounted"].append("soak-r1-00009")),
    ("nothing_lost", lambda r: r["rounds"][1]["server_log"]["client_aborts_not_aborted_by_server"].append("x")),
    ("kv_cache_back_to_zero", lambda r: r["rounds"][1]["after"].update(kv_cache_usage=0.01)),
    ("no_stuck_requests", lambda r: r["rounds"][0]["after"].update(running=1.0)),
    ("memory_stable", lambda r: r["memory"].update(growth_round2=0.06)),
    ("final_answer_correct", lambda r: r["final"].update(identical=False)),
    ("our_metrics_match_vllm", lambda r: r["metrics_consistency"].update(ours=4.0)),
    ("bad_configs_rejected", lambda r: r["startup_suite"].append({"name": "other_target", "ok": False})),
    ("server_log_clean", lambda r: r["server_log_errors"]["other"].append("ERROR boom")),
    ("server_stopped", lambda r: r["server_stop"].update(group_gone=False)),
    ("within_time_bound", lambda r: r["meta"].update(wall_s=301)),
    ("over_long_prompt_400", lambda r: r["rounds"][0]["malformed"]["by_case"].update({"too_long_prompt:413": 1})),
    ("preemptions_forced", lambda r: r["meta"].update(preempt=True, kv_blocks=136)),
    ("restart_clean", lambda r: r["restart"]["hung"].append({"tag": "soak-restart-00003"})),
    ("restart_clean", lambda r: r["restart"]["unclean"].append({"tag": "soak-restart-00004"})),
    ("restart_clean", lambda r: r["restart"]["greedy_again_differs"].append("g01")),
    ("restart_clean", lambda r: r.pop("restart")),  # asked for (meta restart) but never ran
    ("features_exercised", lambda r: r["meta"].update(features=["f-logprobs", "f-regex"])),
])
def test_each_check_can_fail(name, doctor):
    res = copy.deepcopy(_good_result())
    doctor(res)
    assert name in _failed(res)


def _diverged(res, near_tie: bool, margin: float):
    g = res["rounds"][0]["greedy"]
    g.update(identical=g["compared"] - 1 if g["compared"] else 0)
    if not g["compared"]:
        g.update(compared=1, identical=0)
    g.update(near_ties=int(near_tie), real=int(not near_tie),
             divergences=[{"tag": "t", "case": "g00", "index": 3, "base_token": "a", "other_token": "b",
                           "margin": margin, "top2": ["a", "b"], "near_tie": near_tie}])
    return res


def test_greedy_divergence_passes_only_as_a_near_tie():
    """bf16: a divergence at a numerical near-tie of the target (small top-2 margin) passes and is reported with its
    margin; one with a large margin (a wrong token) fails, and so does one with no explanation at all."""
    res = _diverged(copy.deepcopy(_good_result()), near_tie=True, margin=0.04)
    checks = {c["name"]: c for c in soak_report.evaluate(res)}
    assert checks["greedy_identical_under_load"]["ok"] and "0.040" in checks["greedy_identical_under_load"]["detail"]
    assert "greedy_identical_under_load" in _failed(_diverged(copy.deepcopy(_good_result()), False, 3.2))
    unexplained = copy.deepcopy(_good_result())
    unexplained["rounds"][0]["greedy"].update(compared=1, identical=0)
    assert "greedy_identical_under_load" in _failed(unexplained)


def test_restart_outcomes_are_clean_or_hung():
    """While the server restarts, an answer, a 5xx, an error event or a connection error is clean; a client timeout
    (the request hung) and a cut request are not."""
    outs = [_outcome("a"), _outcome("b", status="http_5xx", http_code=500),
            _outcome("c", status="error", http_code=None, error="ReadError <- ConnectionResetError: reset"),
            _outcome("d", status="stream_error"),
            _outcome("e", status="error", http_code=None, error="client timeout after 150.0s (ReadTimeout)"),
            _outcome("f", status="cut")]
    rs = soak_report.summarize_restart(outs, [_outcome("g", text="other")], {"g00": "x = 1"}, 1.0, 2.0, 3.0, "l", 0)
    assert [h["tag"] for h in rs["hung"]] == ["e", "f"]
    assert [u["tag"] for u in rs["unclean"]] == ["e", "f"]
    assert rs["greedy_again_differs"] == ["g00"]
    assert rs["outcomes"]["error:ReadError"] == 1


def test_preemptions_counted_when_forced():
    res = copy.deepcopy(_good_result())
    res["meta"].update(preempt=True, kv_blocks=136)
    res["rounds"][1]["metrics"]["preemptions"] = 3
    checks = {c["name"]: c for c in soak_report.evaluate(res)}
    assert checks["preemptions_forced"]["ok"] and "3 preemptions" in checks["preemptions_forced"]["detail"]


def test_n2_and_min_tokens_outputs():
    """n=2: usage counts both choices (up to 2 x max_tokens) and both must be there; min_tokens must hold."""
    ok = _outcome("t", n=2, choices=2, completion_tokens=8, max_tokens=4, other_texts=["y"])
    assert soak_report.output_problems(ok) == []
    assert soak_report.output_problems({**ok, "choices": 1}) != []
    assert soak_report.output_problems({**ok, "completion_tokens": 9}) != []
    assert soak_report.output_problems({**ok, "stop": ["y"]}) != []  # a stop string in the second choice
    short = _outcome("t", finish_reason="stop", completion_tokens=2, min_tokens=6)
    assert any("min_tokens" in p for p in soak_report.output_problems(short))
    # vLLM checks stop strings only after min_tokens: a stop string before that is no problem
    early = _outcome("t", finish_reason="stop", completion_tokens=7, max_tokens=8, min_tokens=6, stop=["\n"],
                     text="a\nb")
    assert soak_report.output_problems(early) == []


def test_features_are_mixed_into_the_plan():
    """Every request feature of plan.FEATURES is a greedy case (temperature 0), the LoRA case only when a LoRA
    adapter is served, and a round carries n=2, penalised and logprob sampled requests."""
    import random

    from vllm_dflash.bench.soak.plan import FEATURES, QUICK, build_round, feature_cases, load_prompts

    prompts = load_prompts(QUICK.max_prompt_chars)
    cases = feature_cases(prompts, QUICK, random.Random(0))
    assert {c.case for c in cases} == {f"f-{n}" for n in FEATURES}
    assert all(c.kind == "greedy" and c.body["temperature"] == 0.0 for c in cases)
    for c in cases:
        assert all(c.body[k] == v for k, v in FEATURES[c.case[2:]][1].items()), c.case
    lora = feature_cases(prompts, QUICK, random.Random(0), lora="soak-lora")
    assert [c.body["model"] for c in lora if c.case == "f-lora"] == ["soak-lora"]
    sampled = [r.body for r in build_round(prompts, [], QUICK, 1, "x") if r.kind == "sampled"]
    assert sum(b.get("n") == 2 for b in sampled) >= 1
    pressure = [r for r in build_round(prompts, [], QUICK, 1, "x", pressure=5) if r.case == "pressure"]
    assert len(pressure) == 5 and all(r.body["ignore_eos"] and r.kind == "sampled" for r in pressure)
    assert any("repetition_penalty" in b or "presence_penalty" in b for b in sampled)


def test_output_problems():
    o = _outcome("t", completion_tokens=5, max_tokens=4)
    assert any("max_tokens" in p for p in soak_report.output_problems(o))
    o = _outcome("t", finish_reason="stop", completion_tokens=2, stop=["\n\n"], text="a\n\nb")
    assert any("stop string" in p for p in soak_report.output_problems(o))
    assert soak_report.output_problems(_outcome("t", finish_reason="length", completion_tokens=3)) != []
    assert soak_report.output_problems(_outcome("t", finish_reason="abort")) != []
    assert soak_report.output_problems(_outcome("t")) == []


def test_server_log_parsing():
    text = ("(APIServer pid=1) INFO [async_llm.py:577] Added request cmpl-soak-r1-00003-0-9f1c.\n"
            "(APIServer pid=1) INFO [async_llm.py:922] Aborted request(s) chatcmpl-soak-r2-00010-1a2b.\n"
            "(APIServer pid=1) INFO [async_llm.py:782] Request chatcmpl-soak-r2-00011 aborted.\n")
    log = soak_report.parse_server_log(text)
    assert log == {"added": {"soak-r1-00003"}, "aborted": {"soak-r2-00010", "soak-r2-00011"}}


def test_accounting_of_client_aborts():
    """A client abort the engine received must be aborted by the server (else it is lost); one that never reached the
    engine (the client gave up first) is not lost; a completed request the server also aborted is."""
    outs = [_outcome("soak-r1-00000", kind="timeout", status="timed_out"),
            _outcome("soak-r1-00001", kind="disconnect", status="disconnected"),
            _outcome("soak-r1-00002", kind="timeout", status="timed_out"),
            _outcome("soak-r1-00003")]
    log = {"added": {"soak-r1-00000", "soak-r1-00001", "soak-r1-00003"}, "aborted": {"soak-r1-00000", "soak-r1-00003"}}
    acc = soak_report.account(outs, log, "soak-r1")
    assert acc["client_aborts_not_aborted_by_server"] == ["soak-r1-00001"]  # received, never aborted: lost
    assert acc["added_unaccounted"] == ["soak-r1-00001"]
    assert acc["completed_but_aborted_by_server"] == ["soak-r1-00003"]
    assert "soak-r1-00002" not in str(acc)  # never reached the engine: nothing to account for


def test_planned_aborts_cannot_finish_first():
    """Disconnect and timeout requests ignore EOS, so an early EOS cannot race the client's abort (a request the
    server completed logs no abort and would be counted as lost)."""
    import random

    from vllm_dflash.bench.soak.plan import QUICK, build_round, load_prompts

    reqs = build_round(load_prompts(QUICK.max_prompt_chars), [], QUICK, 0, "x" * 100)
    aborts = [r for r in reqs if r.kind in ("disconnect", "timeout")]
    assert aborts and all(r.body.get("ignore_eos") is True for r in aborts)


def test_timeouts_fit_the_models_speed():
    """A timeout request's client gives up within a quarter of the time its max_tokens take at the fastest rate
    measured alone: on a fast model (1,000 tokens a second: 1,024 tokens in about 1 s) the planned 2-5 s would let
    the request finish as the client gives up. Slow models keep the planned timeout; other requests are untouched."""
    from vllm_dflash.bench.soak.plan import (QUICK, TIMEOUT_FLOOR_S, TIMEOUT_SHARE, TIMEOUT_TOKENS, build_round,
                                             fit_timeouts, load_prompts)

    reqs = build_round(load_prompts(QUICK.max_prompt_chars), [], QUICK, 0, "x" * 100)
    alone = [_outcome("a", completion_tokens=100, latency_s=0.1), _outcome("b", completion_tokens=12, latency_s=0.5),
             _outcome("c", completion_tokens=2, latency_s=0.0001), _outcome("d", status="error", completion_tokens=90,
                                                                            latency_s=0.001)]
    rate = soak_report.fastest_tok_s(alone)
    assert rate == 1000.0  # the 2-token and the failed request do not count
    fast, cap = fit_timeouts(reqs, rate)
    assert cap == max(TIMEOUT_FLOOR_S, round(TIMEOUT_SHARE * TIMEOUT_TOKENS / 1000.0, 2))
    timeouts = [r for r in fast if r.kind == "timeout"]
    assert timeouts and all(r.client_timeout == cap for r in timeouts)
    assert [r for r in fast if r.kind != "timeout"] == [r for r in reqs if r.kind != "timeout"]
    slow, _ = fit_timeouts(reqs, 5.0)  # 1,024 tokens take 205 s (a cap of 10 s): the planned 2-5 s stand
    assert slow == reqs
    assert fit_timeouts(reqs, 1e9)[1] == 0.1  # the floor
    assert fit_timeouts(reqs, 0.0) == (reqs, None)  # nothing answered alone: as planned, no cap


def test_plan_is_seeded_and_complete():
    import random

    from vllm_dflash.bench.soak.plan import MALFORMED, QUICK, build_round, greedy_cases, load_prompts, too_long_text

    prompts = load_prompts(QUICK.max_prompt_chars)
    assert {p["source"] for p in prompts} == {"humaneval-chat", "humaneval-raw", "web-chat"}
    long_text = too_long_text(6 * 2048)
    rounds = []
    for _ in range(2):
        cases = greedy_cases(prompts, QUICK, random.Random(0))
        rounds.append([r.to_json() for r in build_round(prompts, cases, QUICK, 1, long_text)])
    assert rounds[0] == rounds[1]
    kinds = [r["kind"] for r in rounds[0]]
    assert kinds.count("greedy") == QUICK.greedy_cases and kinds.count("malformed") == 2 * len(MALFORMED)
    assert {r["case"] for r in rounds[0] if r["kind"] == "malformed"} == set(MALFORMED)
    assert any(r["stream"] for r in rounds[0]) and any(not r["stream"] for r in rounds[0])
    assert {r["endpoint"] for r in rounds[0]} == {"completions", "chat"}


def test_round_metrics_use_the_tau_helper():
    """A round's counter deltas: τ and drafts come from vllm_dflash.serve.tau (the one τ helper)."""
    from vllm_dflash.bench.soak.run import metric_delta
    from vllm_dflash.serve.tau import parse_metrics

    def scrape(drafts, accepted, gen, stop):
        return parse_metrics(f"vllm:spec_decode_num_drafts_total {drafts}\n"
                             f"vllm:spec_decode_num_draft_tokens_total {7 * drafts}\n"
                             f"vllm:spec_decode_num_accepted_tokens_total {accepted}\n"
                             f"vllm:generation_tokens_total {gen}\nvllm:prompt_tokens_total {2 * gen}\n"
                             f"vllm:num_preemptions_total 1\n"
                             f'vllm:request_success_total{{finished_reason="stop"}} {stop}\n'
                             f'vllm:request_success_total{{finished_reason="length"}} 2\n')

    d = metric_delta(scrape(10, 20, 100, 3), scrape(40, 95, 300, 8))
    assert d == {"finished_by_reason": {"stop": 5, "length": 0}, "preemptions": 0, "prompt_tokens": 400,
                 "generation_tokens": 200, "drafts": 30, "tau": 3.5}
    assert metric_delta(scrape(10, 20, 100, 3), scrape(10, 20, 150, 3))["tau"] is None  # nothing drafted


def test_startup_suite_builds_its_bad_drafts_without_a_checkout(tmp_path, pair):
    """The other_target and unsupported_block drafts are edited copies of the draft under test (built in the temp
    folder, nothing from tests/assets or a checkout), and our start-up validation rejects each with the words the
    suite expects."""
    import json

    from vllm_dflash.bench.soak.startup import cases
    from vllm_dflash.config import DFlashConfig, DFlashConfigError
    from vllm_dflash.integration.validation import validate_dflash_spec

    target = json.loads((pair / "target" / "config.json").read_text())
    by_name = {c["name"]: c for c in cases(pair / "draft-b8", tmp_path)}
    assert set(by_name) == {"bad_json", "missing_draft", "other_target", "unsupported_block"}
    for name in ("other_target", "unsupported_block"):
        spec = json.loads(by_name[name]["spec"])
        assert Path(spec["model"]).parent == tmp_path
        with pytest.raises(DFlashConfigError) as e:
            validate_dflash_spec(spec, target)
        assert all(w in str(e.value) for w in by_name[name]["expect"]), (str(e.value), by_name[name]["expect"])
    DFlashConfig.from_pretrained(pair / "draft-b8").check_target(target)  # the draft under test itself fits


@pytest.mark.parametrize("given", [["--target", "t"], ["--draft", "d"]])
def test_target_and_draft_go_together(given, capsys):
    """--target without --draft (or the reverse) is refused before anything starts, naming both flags."""
    from vllm_dflash.bench.soak.run import main

    with pytest.raises(SystemExit) as e:
        main(["--quick", *given])
    assert e.value.code == 2
    assert "--target and --draft go together" in capsys.readouterr().err
