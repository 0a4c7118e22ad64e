# SPDX-License-Identifier: Apache-2.0
"""The served mixed-source check's pieces without vLLM (vllm_dflash/bench/chi2.py, bench/soak/mixed.py,
mixed_plan.py): the chi-square, the requests, the verdicts, the report, the flags and the import hook. The check on
live servers: tests/e2e/test_mixed_served.py."""
import collections
import os
import random
import re
import subprocess
import sys

import pytest

from vllm_dflash.bench.chi2 import chi2_isf, chi2_sf, chi2_two_sample, chi2_two_sample_pvalue, size_to_reject
from vllm_dflash.bench.soak import mixed
from vllm_dflash.bench.soak.mixed_plan import GROUPS, HOOK, ID_PREFIX


def _sample(probs: dict, n: int, rng: random.Random) -> collections.Counter:
    return collections.Counter(rng.choices(list(probs), weights=list(probs.values()), k=n))


def test_chi2_same_and_different_distributions():
    rng = random.Random(0)
    p = {"a": 0.5, "b": 0.3, "c": 0.15, "d": 0.05}
    ps = [chi2_two_sample_pvalue(_sample(p, 500, rng), _sample(p, 500, rng)) for _ in range(200)]
    assert 0.02 < sum(x < 0.05 for x in ps) / len(ps) < 0.1  # calibrated: ~5 % below 0.05
    q = {"a": 0.6, "b": 0.25, "c": 0.1, "d": 0.05}
    assert chi2_two_sample_pvalue(_sample(p, 3000, rng), _sample(q, 3000, rng)) < 1e-6


def test_chi2_pools_rare_categories_and_refuses_empty_samples():
    a = collections.Counter({"x": 50, "y": 50, "r1": 3, "r2": 2})
    b = collections.Counter({"x": 55, "y": 45, "r3": 4})
    stat, df = chi2_two_sample(a, b)
    assert df == 2  # x, y and the pooled rare bin
    assert chi2_two_sample({"x": 30}, {"x": 40}) == (0.0, 0) and chi2_two_sample_pvalue({"x": 30}, {"x": 40}) == 1.0
    with pytest.raises(ValueError, match="empty sample"):
        chi2_two_sample({}, b)
    assert chi2_sf(chi2_isf(1e-3, 5), 5) == pytest.approx(1e-3, rel=1e-6)
    assert chi2_isf(0.05, 1) == pytest.approx(3.841, abs=1e-3)


def test_size_to_reject_scales_a_small_difference():
    """How much larger two samples must be for a difference of the size seen to reach p < alpha: scaling the
    statistic's noncentrality (its excess over df)."""
    a = collections.Counter({"x": 520, "y": 480})
    b = collections.Counter({"x": 480, "y": 520})
    f = size_to_reject(a, b, 1e-3)
    assert f is not None and f > 1
    stat, df = chi2_two_sample(a, b)
    # the statistic's excess over df grows with the size: f times larger samples reach the 1e-3 quantile on average
    assert df + f * (stat - df) == pytest.approx(chi2_isf(1e-3, df))
    assert size_to_reject(a, a, 1e-3) is None


def test_requests_interleave_groups_with_parsable_ids_and_own_seeds():
    reqs = mixed.mixed_requests(([1, 2, 3], "cross text"), 3, 4, 0.7, 1_000_000, offset=18)
    assert len(reqs) == 18 and len({b["seed"] for _, b in reqs}) == 18
    pattern = re.compile(ID_PREFIX + r"-([a-z]+)-[0-9]+")  # the forced plan's parsing (mixed_plan.FORCED_PLAN)
    for i, (rid, body) in enumerate(reqs):
        g = GROUPS[i % len(GROUPS)]
        # vLLM 0.32's engine id: cmpl-<X-Request-Id>-<prompt index>, maybe a suffix after it
        assert pattern.search(f"cmpl-{rid}-0-1a2b3c4d").group(1) == g
        assert body["prompt"] == ("cross text" if g == "cross" else [1, 2, 3])
        assert body["temperature"] == (0.0 if g == "greedy" else 0.7) and body["ignore_eos"]
        assert body["seed"] == 1_000_018 + i and rid.endswith(f"-{18 + i}")


def _outcomes(n_per_group: int, rng: random.Random, biased: tuple[str, ...] = ()) -> list:
    p = {(1, 2): 0.4, (1, 3): 0.3, (2, 2): 0.2, (3, 1): 0.1}
    skew = {(1, 2): 0.7, (1, 3): 0.1, (2, 2): 0.1, (3, 1): 0.1}
    out = []
    for i in range(n_per_group * len(GROUPS)):
        g = GROUPS[i % len(GROUPS)]
        if g == "greedy":
            out.append([1, 2])
            continue
        probs = skew if g in biased else p
        out.append(list(rng.choices(list(probs), weights=list(probs.values()))[0]))
    return out


def _result(biased=(), control_biased=mixed.DRAFTING, with_q=None, dtype="float32"):
    rng = random.Random(1)
    r = mixed.evaluate_temperature(_outcomes(400, rng), _outcomes(400, rng, biased),
                                   _outcomes(400, rng, control_biased),
                                   with_q or {g: 10 for g in mixed.DRAFTING}, 5)
    r["probe_found"] = True
    res = {"meta": {"dtype": dtype, "control": True, "per_group": 400, "max_tokens": 2, "cpu": "AMD EPYC",
                    "started": "2026-12-07 14:00:00", "wall_s": 100.0},
           "servers": {s: {"failed": 0, "errors": []} for s in ("stock", "ours", "control")},
           "temperatures": {"1.0": r}}
    res["servers"]["stock"]["plugin_loaded"] = False
    res["checks"] = mixed.mixed_checks(res)
    res["passed"] = all(c["ok"] for c in res["checks"])
    return res


def test_verdicts():
    good = _result()
    assert good["passed"], [c for c in good["checks"] if not c["ok"]]
    assert good["temperatures"]["1.0"]["greedy_identical"] == [400, 400]
    failed = lambda res: {c["name"] for c in res["checks"] if not c["ok"]}  # noqa: E731
    assert failed(_result(biased=("own",))) == {"mixed_same_distribution:T1.0"}
    missed = _result(control_biased=("dflash", "merged", "own"))
    assert failed(missed) == {"mixed_control_caught:T1.0"}
    assert "control_size_factor" in missed["temperatures"]["1.0"]["groups"]["cross"]  # how much larger would do
    no_q = _result(with_q={"dflash": 3, "merged": 3, "own": 0, "cross": 2})
    (c,) = [c for c in no_q["checks"] if not c["ok"]]
    assert c["name"] == "mixed_verified_with_q:T1.0" and "would test nothing" in c["detail"]


def test_report_rows_and_soak_checks():
    from vllm_dflash.bench.soak import report as soak_report

    res = _result()
    table = mixed.render_mixed([res])
    assert table.count("\n") == 2 + 5 and "| 1.0 | cross | 400 |" in table and "**FAIL**" not in table
    assert mixed.mixed_row(res).startswith("400/source, T 1.0: min p ")
    assert mixed.mixed_row(None) == "not run"
    bad = _result(biased=("none",))
    assert "**FAIL**" in mixed.render_mixed([bad]) and mixed.mixed_row(bad).endswith("FAIL")
    names = lambda r: {c["name"] for c in soak_report.evaluate(r)}  # noqa: E731
    asked = names({"meta": {"mixed_per_group": 8}})
    assert "mixed_ran" in asked
    assert not any(n.startswith("mixed") for n in names({"meta": {}}))


@pytest.mark.parametrize("argv, message", [
    (["--mixed-check", "--mixed-per-group", "0"], "--mixed-per-group 0"),
    (["--mixed-check", "--mixed-temperatures", "0.7,x"], "--mixed-temperatures"),
    (["--mixed-check", "--mixed-temperatures", "0"], "--mixed-temperatures"),
    (["--mixed-check", "--mixed-max-tokens", "1"], "--mixed-max-tokens 1"),
    (["--mixed-control"], "--mixed-control goes with"),
])
def test_bad_flags_are_refused_naming_the_flag(argv, message, capsys):
    from vllm_dflash.bench.soak.run import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_import_hook_patches_a_module_once_imported(tmp_path):
    """The sitecustomize's hook (mixed_plan.HOOK) runs a patch in a process once its module is imported."""
    site = tmp_path / "sitecustomize.py"
    site.write_text(HOOK.replace("__PATCHES__", repr({"colorsys": "import sys\nsys.modules['colorsys'].X = 7\n"})))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", "import colorsys; print(colorsys.X)"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.strip() == "7", out.stderr


def test_soak_flags_reach_the_check(monkeypatch, tmp_path):
    """`--mixed-check` and a soak's `--mixed-per-group`: the flags reach run_mixed_check, the JSON is written and
    the exit code is the verdict."""
    from vllm_dflash.bench.soak import run

    seen = {}

    def fake(target, draft, dtype, per_group, max_tokens, temperatures, concurrency, control, log_dir, env, **kw):
        seen.update(per_group=per_group, max_tokens=max_tokens, temperatures=temperatures, concurrency=concurrency,
                    control=control, env=env, dtype=dtype)
        return _result()

    monkeypatch.setattr(mixed, "run_mixed_check", fake)
    monkeypatch.setattr(run, "resolve_models", lambda a: (tmp_path / "t", tmp_path / "d", False))
    out = tmp_path / "m.json"
    rc = run.main(["--mixed-check", "--mixed-control", "--mixed-temperatures", "1.0", "--server-env", "A=1",
                   "--out", str(out), "--log", str(tmp_path / "x.log")])
    assert rc == 0 and out.exists()
    assert seen == {"per_group": mixed.DEFAULT_PER_GROUP, "max_tokens": mixed.DEFAULT_MAX_TOKENS,
                    "temperatures": [1.0], "concurrency": mixed.DEFAULT_CONCURRENCY, "control": True,
                    "env": {"A": "1"}, "dtype": "float32"}
