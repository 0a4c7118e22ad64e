# SPDX-License-Identifier: Apache-2.0
"""Serving benchmark, the pure parts (percentiles, latency summaries, /metrics counter deltas, output
comparison, speedups, table rendering, configuration registry). The quick mode on the tiny pair through real
`vllm serve` instances is tests/e2e/test_bench_serving_quick.py."""
import numpy as np
import pytest

from vllm_dflash.bench import configs, report, stats
from vllm_dflash.serve import tau
from vllm_dflash.serve.tau import parse_metrics

METRICS_BEFORE = """
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
vllm:spec_decode_num_drafts_total{engine="0",model_name="target"} 10.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="target"} 70.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="target"} 20.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="1"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="2"} 5.0
vllm:generation_tokens_total{engine="0",model_name="target"} 100.0
vllm_dflash:request_steps_total 60.0
"""
METRICS_AFTER = METRICS_BEFORE.replace("} 10.0", "} 50.0").replace("} 70.0", "} 350.0").replace("} 20.0", "} 80.0") \
    .replace('"0"} 8.0', '"0"} 38.0').replace('"1"} 7.0', '"1"} 27.0').replace('"2"} 5.0', '"2"} 15.0') \
    .replace("} 100.0", "} 220.0").replace("total 60.0", "total 140.0")


@pytest.mark.parametrize("q", [0, 1, 37.5, 50, 90, 99, 100])
def test_percentile_matches_numpy(q):
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100):
        xs = rng.exponential(size=n).tolist()
        assert stats.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_percentile_edges():
    assert stats.percentile([], 50) is None
    assert stats.percentile([3, 1, 2], 50) == 2  # unsorted input
    assert stats.percentile([0, 10], 90) == pytest.approx(9.0)  # interpolates, not nearest rank
    with pytest.raises(ValueError):
        stats.percentile([1], 101)


def test_request_latencies_and_throughput():
    reqs = [{"ttft_s": 0.1, "latency_s": 1.1, "completion_tokens": 11, "t_start": 0.0, "t_end": 1.1},
            {"ttft_s": 0.3, "latency_s": 0.3, "completion_tokens": 1, "t_start": 0.5, "t_end": 0.8},  # no TPOT
            {"ttft_s": 0.2, "latency_s": 2.2, "completion_tokens": 5, "t_start": 1.0, "t_end": 3.2}]
    lat = stats.request_latencies(reqs)
    assert lat["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert lat["tpot_ms"]["mean"] == pytest.approx((100.0 + 500.0) / 2)  # (1.1-0.1)/10 and (2.2-0.2)/4
    tp = stats.throughput(reqs)
    assert tp["output_tokens"] == 17 and tp["wall_s"] == pytest.approx(3.2)
    assert tp["output_tok_s"] == pytest.approx(17 / 3.2)


def test_spec_decode_delta_from_metrics_text():
    d = stats.spec_decode_delta(parse_metrics(METRICS_BEFORE), parse_metrics(METRICS_AFTER))
    assert d["drafts"] == 40 and d["draft_tokens"] == 280 and d["accepted"] == 60
    assert d["tau"] == pytest.approx(1 + 60 / 40)
    assert d["per_position_accepted"] == [30, 20, 10]
    assert d["per_position_rate"] == pytest.approx([0.75, 0.5, 0.25])
    assert d["draft_acceptance_rate"] == pytest.approx(60 / 280)
    # 120 tokens in 80 request-steps, 40 of which verified drafts: τ 2.5 per draft, 1.5 per target forward
    assert d["generated_tokens"] == 120 and d["request_steps"] == 80 and d["tokens_per_forward"] == pytest.approx(1.5)


def test_tokens_per_forward():
    assert tau.tokens_per_forward(150, 100) == 1.5
    assert tau.tokens_per_forward(150, 0) is None  # request-steps not counted (fixed block, other drafters)


def test_spec_decode_delta_no_drafts_and_reset():
    m = parse_metrics(METRICS_BEFORE)
    d = stats.spec_decode_delta(m, m)
    assert d["tau"] is None and d["per_position_rate"] == [] and d["tokens_per_forward"] is None
    assert stats.spec_decode_delta({}, {})["drafts"] == 0
    with pytest.raises(ValueError, match="backwards"):
        stats.spec_decode_delta(parse_metrics(METRICS_AFTER), m)


def test_compare_outputs_reports_first_difference():
    base = {"a": "hello world", "b": "same", "c": "short"}
    other = {"a": "hello there", "b": "same", "c": "short and longer", "x": "not in base"}
    cmp = stats.compare_outputs(base, other)
    assert cmp["identical"] == 1 and cmp["compared"] == 3
    by_id = {m["id"]: m for m in cmp["mismatches"]}
    assert by_id["a"]["first_diff_char"] == 6 and by_id["a"]["other"] == "there"
    assert by_id["c"]["first_diff_char"] == 5  # prefix of the other: differs where it ends


def _run(cfg, tok_s, outputs, c=1, ps="humaneval", tau=None, per_pos=(3.0, 1.0)):
    return {"config": cfg, "prompt_set": ps, "concurrency": c, "ok": True, "output_tok_s": tok_s, "outputs": outputs,
            "ttft_ms": stats.summarize([0.1, 0.2], 1000), "tpot_ms": stats.summarize([0.01], 1000),
            "spec_decode": None if tau is None else {"tau": tau, "drafts": 4.0, "per_position_accepted": list(per_pos),
                                                     "tokens_per_forward": tau - 0.25}}


def test_sampled_runs_get_speedups_but_no_output_comparison():
    """bench --temperature > 0: sampled outputs differ run to run, so nothing is compared with `none` (no false
    mismatch), while speed-ups are still over `none`; the workload line says so."""
    runs = [_run("none", 10.0, {"p": "x"}), _run("ours", 12.0, {"p": "y"}, tau=1.5)]
    stats.attach_baseline(runs, compare=False)
    assert runs[1]["speedup"] == pytest.approx(1.2) and runs[1]["vs_baseline"] is None
    assert report.workload_text(0.7) == "sampled, temperature 0.7 (outputs not compared)"
    assert report.workload_text(0.0) == "greedy (temperature 0)"


def test_attach_baseline_and_table():
    runs = [_run("none", 10.0, {"p": "x"}), {**_run("ours", 25.0, {"p": "y"}, tau=2.0), "tokens_per_chunk": 1.8},
            _run("ngram", 5.0, {"p": "x"}, tau=1.5),
            _run("ours", 7.0, {"p": "x"}, c=8, tau=1.5, per_pos=(1.0, 1.0))]  # no baseline at c8
    stats.attach_baseline(runs)
    assert runs[0]["speedup"] == 1.0 and runs[0]["vs_baseline"] is None
    assert runs[1]["speedup"] == pytest.approx(2.5) and runs[1]["vs_baseline"]["identical"] == 0
    assert runs[2]["vs_baseline"]["identical"] == 1
    assert runs[3]["speedup"] is None
    table = report.render_table(runs + [{"config": "ours", "prompt_set": "chat", "concurrency": 1, "ok": False,
                                         "error": "boom"}])
    rows = table.splitlines()
    assert len(rows) == 2 + 5 and rows[0].startswith("| prompts | concurrency | configuration")
    assert ("| humaneval | 1 | ours | 25.0 | 2.50× | – | 2.00 | 1.75 | 1.80 | – | – | 150 / 190 / 199 | 10 / 10 / 10 "
            "| 0/1 **1 MISMATCH** | – |") in rows
    near = {"near_ties": 1, "max_near_tie_margin": 0.04}  # an explained bf16 near-tie is not a mismatch
    assert report._exact_cell({"identical": 0, "compared": 1}, near) == "0/1 + 1 near-tie (margin ≤ 0.04)"
    assert "| humaneval | 1 | ngram | 5.0 | 0.50× | – | 1.50 | 1.25 |" in table and "1/1 |" in table
    assert "| humaneval | 8 | ours | 7.0 | – | – | 1.50 |" in table and "failed: boom" in table
    assert "| humaneval | 1 | none | 10.0 | 1.00× | – | – | – |" in table
    acc = report.render_acceptance(runs)
    assert "| humaneval | ours | 0.500 | 0.250 |" in acc  # (3+1)/(4+4), (1+1)/(4+4): summed over c1 and c8


def test_registry_and_overrides():
    assert {"none", "ngram", "vllm-dflash", "ours", "ours-fixed", "ours-merged"} <= set(configs.REGISTRY)
    assert configs.REGISTRY["ours-merged"].speculative_config("d", 7)["adaptive"] == "merged"
    none, ngram, theirs, ours = configs.select(["none", "ngram", "vllm-dflash", "ours"])
    assert none.speculative_config("d", 7) is None
    assert ngram.speculative_config(None, 7) == configs.NGRAM_SPEC
    assert theirs.speculative_config("d", 7) == {"method": "dflash", "model": "d", "num_speculative_tokens": 7}
    assert theirs.env == {"DFLASH_DRAFTER": "vllm"} and ours.env == {"DFLASH_DRAFTER": "ours"}
    (fixed,) = configs.select(["none", "ours-fixed"], spec_extra=["ours-fixed:diffusion_steps=2"],
                              env_extra=["ours-fixed:FOO=bar"])[1:]
    assert fixed.speculative_config("d", 7)["diffusion_steps"] == 2 and fixed.env["FOO"] == "bar"
    assert configs.REGISTRY["ours-fixed"].env.get("FOO") is None  # overrides go to copies
    with pytest.raises(ValueError, match="'none' is required"):
        configs.select(["ours"])
    with pytest.raises(ValueError, match="unknown"):
        configs.select(["none", "eagle"])
    with pytest.raises(ValueError, match="CONFIG:KEY=VALUE"):
        configs.select(["none", "ours"], spec_extra=["ours:novalue"])
    # NAME@mp: the same entry served with vLLM's worker process; the registry entry itself is untouched
    none, none_mp, merged_mp = configs.select(["none", "none@mp", "ours-merged@mp"],
                                              env_extra=["ours-merged@mp:FOO=bar"])
    assert none.server_args == [] and none_mp.server_args == ["--distributed-executor-backend", "mp"]
    assert none_mp.name == "none@mp" and none_mp.speculative_config("d", 7) is None
    assert merged_mp.speculative_config("d", 7) == configs.REGISTRY["ours-merged"].speculative_config("d", 7)
    assert merged_mp.env["FOO"] == "bar" and configs.REGISTRY["ours-merged"].server_args == []
    with pytest.raises(ValueError, match="unknown configuration 'eagle@mp'"):
        configs.select(["none", "eagle@mp"])


def _ours(counts: dict[tuple[str, str], float], engines: int = 1) -> str:
    """Our per-source counters as the collector writes them: vLLM's labels, then `source` (split over `engines`)."""
    lines = []
    for name in ("proposals", "drafted_tokens", "accepted_tokens"):
        lines.append(f"# TYPE vllm_dflash:{name} counter")
        for (n, src), v in counts.items():
            for e in range(engines) if n == name else ():
                lines.append(f'vllm_dflash:{name}_total{{engine="{e}",model_name="target",source="{src}"}} '
                             f"{v / engines}")
    return "\n".join(lines) + "\n"


def test_adaptive_delta_and_table():
    """The per-source split from the `source` label, summed over engines (vLLM's labels)."""
    before = parse_metrics(_ours({("proposals", "dflash"): 10.0}))
    after = parse_metrics(_ours({("proposals", "dflash"): 15.0, ("proposals", "ngram"): 3.0,
                                 ("proposals", "merged"): 1.0, ("proposals", "none"): 1.0,
                                 ("drafted_tokens", "dflash"): 20.0, ("accepted_tokens", "dflash"): 5.0,
                                 ("drafted_tokens", "ngram"): 6.0, ("accepted_tokens", "ngram"): 6.0,
                                 ("drafted_tokens", "merged"): 4.0, ("accepted_tokens", "merged"): 3.0}, engines=2))
    assert after['vllm_dflash:proposals_total{source="dflash"}'] == 15.0
    a = stats.adaptive_delta(before, after)
    assert a["share"] == {"dflash": 0.5, "ngram": 0.3, "merged": 0.1, "none": 0.1} and a["mean_draft_len"] == 3.0
    assert a["acceptance_rate"] == {"dflash": 0.25, "ngram": 1.0, "merged": 0.75}
    assert stats.adaptive_delta(after, after) is None
    row = {"ok": True, "prompt_set": "humaneval", "concurrency": 8, "config": "ours", "adaptive": a}
    assert "| humaneval | 8 | ours | 50% | 30% | 10% | 10% | 3.00 | 0.25 | 1.00 | 0.75 |" \
        in report.render_adaptive([row])
    assert report.render_adaptive([{**row, "adaptive": None}]) is None


def test_unknown_plugin_keys_make_a_config_unavailable():
    known = {"diffusion_steps": "VLLM_DFLASH_DIFFUSION_STEPS"}
    cfg = configs.BenchConfig("x", "x", method="dflash", spec_extra={"adaptive": True}, uses_draft=True)
    assert "['adaptive']" in cfg.unavailable_reason(known)
    fine = configs.BenchConfig("y", "y", method="dflash", spec_extra={"diffusion_steps": 2})
    assert fine.unavailable_reason(known) is None
    assert configs.REGISTRY["ours"].unavailable_reason() is None


def test_time_split_table():
    row = {"ok": True, "prompt_set": "chat", "concurrency": 1, "config": "ours",
           "time_split_s": {"draft_forward": 2.0, "kv_injection": 0.5, "wall": 10.0}}
    assert "| chat | 1 | ours | 10.0 | 20% | 5.0% | – | 75% | – | – | – |" in report.render_time_split([row])
    timed = {**row, "time_split_s": {**row["time_split_s"], "target_forward": 6.0, "target_forwards": 200}}
    # DFLASH_PROFILE=1: 6 s over 200 forwards = 30 ms each; the other 4 s of wall = 20 ms per forward
    want = "| chat | 1 | ours | 10.0 | 20% | 5.0% | 60% | 15% | 200 | 30.0 | 20.0 |"
    assert want in report.render_time_split([timed])
    ngram = {**row, "config": "ngram", "time_split_s": {"draft_forward": 0.0, "kv_injection": 0.0, "wall": 10.0,
                                                        "target_forward": 8.0, "target_forwards": 400}}
    assert "| chat | 1 | ngram | 10.0 | 0% | 0.0% | 80% | 20% | 400 | 20.0 | 5.0 |" in report.render_time_split([ngram])
    assert report.render_time_split([{**row, "time_split_s": None}]) is None


def test_demo_layout_binds_every_core_unless_told_otherwise():
    """The demo's servers: every core bound to the model worker by default (the bench's layout), a layout already
    in the environment wins, 'auto' leaves vLLM's default, and a malformed list names the flag."""
    import os

    from vllm_dflash.bench.demo import demo_layout

    env, text = demo_layout(None, {})
    n = os.cpu_count() or 1
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": f"0-{n - 1}", "OMP_NUM_THREADS": str(n)} and "0-" in text
    assert demo_layout(None, {"VLLM_CPU_OMP_THREADS_BIND": "1"})[0] == {}
    assert demo_layout("auto", {})[0] == {}
    assert demo_layout("0,2-3", {})[0]["OMP_NUM_THREADS"] == "3"
    with pytest.raises(ValueError, match="--cpu-bind"):
        demo_layout("cores", {})


def test_tokens_per_chunk():
    """Completion tokens over the streamed text chunks of all requests (None when no chunk was seen)."""
    reqs = [{"completion_tokens": 10, "chunks": 4, "t_start": 0.0, "t_end": 1.0},
            {"completion_tokens": 6, "chunks": 4, "t_start": 0.5, "t_end": 2.0}]
    assert stats.throughput(reqs)["tokens_per_chunk"] == pytest.approx(2.0)
    assert stats.throughput([{"completion_tokens": 3, "t_start": 0.0, "t_end": 1.0}])["tokens_per_chunk"] is None


def test_run_demo_reaches_the_draft_and_reports(pair, monkeypatch, capsys):
    """`vllm-dflash demo --mode reference` end to end on the tiny trained pair (the README's demo shares every step
    before the servers: target, draft resolution, prompts): it must print a report, not fail on a missing name."""
    from vllm_dflash import target as target_mod
    from vllm_dflash.bench.demo import run_demo

    monkeypatch.setattr(target_mod, "prepare_target", lambda *a, **k: pair / "target")
    assert run_demo(draft=str(pair / "draft-b8"), num_prompts=1, max_tokens=8, mode="reference") == 0
    out = capsys.readouterr().out
    assert "acceptance length" in out and "draft-b8" in out


def test_throughput_of_a_run_in_rounds_counts_only_each_rounds_own_span():
    """Interleaved mode sends a run's prompts in rounds with other configurations in between: the gaps between rounds
    must not count as this configuration's wall time."""
    def req(t0, t1, n):
        return {"t_start": t0, "t_end": t1, "completion_tokens": n, "chunks": n}
    r1, r2 = [req(0.0, 2.0, 10), req(0.5, 1.5, 10)], [req(100.0, 101.0, 20)]
    t = stats.throughput_of_rounds([r1, r2])
    assert t["wall_s"] == 3.0 and t["output_tokens"] == 40 and abs(t["output_tok_s"] - 40 / 3) < 1e-12
    assert stats.throughput(r1 + r2)["wall_s"] == 101.0  # without rounds: first start .. last end
    assert stats.throughput_of_rounds([r1]) == stats.throughput(r1)


def test_counter_deltas_of_several_waves_add_up():
    waves = [({"a_total": 1.0, "g": 3.0}, {"a_total": 4.0, "g": 0.0}),
             ({"a_total": 10.0}, {"a_total": 12.0, "b_total": 1.0})]
    assert stats.sum_deltas(waves) == {"a_total": 5.0, "g": -3.0, "b_total": 1.0}
    sd = stats.spec_decode_delta({}, stats.sum_deltas([({}, {}), ({}, {})]))
    assert sd["drafts"] == 0


def test_a_run_in_rounds_sums_counters_and_keeps_the_last_gauges():
    from types import SimpleNamespace

    from vllm_dflash.bench.waves import summarize as _summarize

    def wave(t0, n, gen0, gen1, alpha):
        req = {"id": f"p{t0}", "text": "x", "completion_tokens": n, "prompt_tokens": 5, "chunks": n,
               "finish_reason": "length", "t_start": t0, "t_end": t0 + 1.0, "ttft_s": 0.1, "latency_s": 1.0}
        before = {"vllm:generation_tokens_total": gen0, "vllm_dflash:cost_fixed_seconds": 1.0}
        after = {"vllm:generation_tokens_total": gen1, "vllm_dflash:cost_fixed_seconds": alpha,
                 "vllm_dflash:request_steps_total": 9.0, "vllm_dflash:guard_tokens_per_second": 30.0,
                 'vllm_dflash:guard_tokens_per_second{arm="plan"}': 20.0,
                 'vllm_dflash:guard_tokens_per_second{arm="off"}': 10.0}
        return {"reqs": [req], "before": before, "after": after, "load": [0.1, 0.2], "idle_cpu_s": 0.05}
    cfg = SimpleNamespace(name="ours", method="dflash")
    run = _summarize(cfg, "chat", 1, [wave(0.0, 10, 100.0, 110.0, 40.0), wave(50.0, 20, 300.0, 320.0, 42.0)])
    assert run["server_generation_tokens"] == 30.0  # 10 + 20: the gap of 190 tokens between waves is not counted
    assert run["wall_s"] == 2.0 and run["output_tokens"] == 30 and run["rounds"] == 2
    # the last scrape's state, not a sum of differences; the guard's gauge per arm, not the sum of its arms
    assert run["dflash_gauges"] == {"cost_fixed_seconds": 42.0, 'guard_tokens_per_second{arm="plan"}': 20.0,
                                    'guard_tokens_per_second{arm="off"}': 10.0}
    assert run["idle_servers_cpu_s"] == 0.1



def test_ours_is_the_default_and_ours_fixed_the_papers_block():
    """One name, one meaning (issue 63): `ours` is our drafter as deployed (no extra key: the settings' default,
    adaptive drafting), `ours-fixed` the paper's fixed block; --quick benches `ours`; the old names are refused with
    the new one named."""
    from vllm_dflash import settings
    from vllm_dflash.bench.args import PRESETS

    deployed = {"method": "dflash", "model": "d", "num_speculative_tokens": 7}  # the demo's and the README's config
    assert configs.REGISTRY["ours"].speculative_config("d", 7) == deployed
    assert settings.DEPLOYMENT_FIELDS["adaptive"].default is True  # so `ours` drafts adaptively
    assert configs.REGISTRY["ours-fixed"].speculative_config("d", 7) == {**deployed, "adaptive": False}
    assert "ours" in PRESETS["quick"]["configs"].split(",") and "ours-fixed" in configs.DEFAULT_CONFIGS
    assert not set(configs.RENAMED) - {"ours"} & set(configs.REGISTRY)  # the old names are gone, but `ours`
    with pytest.raises(ValueError, match="'ours-adaptive' was renamed: 'ours'.*Fix: write 'ours#g11'"):
        configs.lookup("ours-adaptive#g11")


@pytest.mark.parametrize("old,new", [("ours", "ours-fixed"), ("ours-adaptive", "ours"),
                                     ("ours-adaptive#g11", "ours#g11"), ("ours@onednn@mp#x", "ours-fixed@onednn@mp#x"),
                                     ("ours-no-overlap@mp", "ours-fixed-no-overlap@mp"),
                                     ("ours-adaptive-overlap", "ours-overlap"), ("none+extras", "none+extras"),
                                     ("ngram+extras@mp", "ngram+extras@mp"), ("ours-merged#a", "ours-merged#a")])
def test_old_names_map_to_new(old, new):
    assert configs.renamed(old) == new
    configs.lookup(new)  # every mapped name is one today's bench serves


def test_old_results_read_under_new_names():
    """A result written before schema 2 (no meta.schema) is read with today's names everywhere a name appears; a
    current one is returned as it is."""
    from vllm_dflash.bench import meta

    run = {"ok": True, "prompt_set": "chat", "concurrency": 1, "output_tok_s": 1.0}
    old = {"meta": {"name": "x", "spec_extra": ["ours-adaptive#g11:guard_threshold=1.1"], "env_extra": ["ours:A=1"]},
           "configs": {"none": {}, "ours": {"d": 1}, "ours-adaptive": {"d": 2}, "ours-adaptive#g11": {"d": 3}},
           "runs": [{**run, "config": c} for c in ("none", "ours", "ours-adaptive")],
           "losslessness": {"per_config": {"ours": {"identical": 1}, "ours-adaptive": {"identical": 2}}}}
    new = meta.upgrade(old)
    assert list(new["configs"]) == ["none", "ours-fixed", "ours", "ours#g11"] and new["configs"]["ours"] == {"d": 2}
    assert [r["config"] for r in new["runs"]] == ["none", "ours-fixed", "ours"]
    assert new["losslessness"]["per_config"] == {"ours-fixed": {"identical": 1}, "ours": {"identical": 2}}
    assert new["meta"]["spec_extra"] == ["ours#g11:guard_threshold=1.1"]
    assert new["meta"]["env_extra"] == ["ours-fixed:A=1"]
    assert new["meta"]["schema"] == meta.SCHEMA and "schema" not in old["meta"]  # the input is left alone
    assert meta.upgrade(new) is new


def test_new_results_record_the_schema():
    import argparse
    from pathlib import Path

    from vllm_dflash.bench import args as bench_args
    from vllm_dflash.bench import meta

    p = argparse.ArgumentParser()
    bench_args.add_arguments(p)
    a = p.parse_args(["--quick"])
    a.name, a.num_prompts, a.waves, a.prompts_per_run, a.threads = "t", 2, 1, {1: 2}, 1
    m = meta.build_meta(a, Path("t"), None, False, None, [1], ["chat"], "float32", 1)
    assert m["schema"] == meta.SCHEMA == 2
