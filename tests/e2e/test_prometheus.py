# SPDX-License-Identifier: Apache-2.0
"""Our metrics in a real Prometheus (issue 63 item 2). A Prometheus server (the Debian package `prometheus`, which
scripts/setup.sh installs) is started on a loopback port with a temporary configuration and data folder, scraping a
live `vllm serve` every second; the server runs our default configuration (`{"method": "dflash", "model":
"<tiny pair>/draft-b8"}`: adaptive drafting) under a short load of a few dozen requests. Every PromQL query that
README.md and docs/METRICS.md print must return finite numbers through Prometheus' HTTP API, equal within 5 % to the
figure the bench computes from two scrapes of the run's own `/metrics` (`vllm_dflash.bench.stats`); the dashboard's
form of each (examples/grafana-dflash.json, its variables set to every model and engine) must return the same.

The window. The docs write `[1m]`; here each query is evaluated at the first Prometheus scrape after the load with
the window reaching back to the last scrape before it (`[<ms>ms]` in place of `[1m]`), so the window holds exactly
the run, as the bench's two scrapes do (the window starts 1 ms before the first scrape in it and ends at the last, so
Prometheus' extrapolation to the window's edges adds 1 ms at most; the counters are settled at both ends).
Which sources draft is the planner's call, and under CI's load it has chosen no DFlash at all in a window: the load
is repeated (at most TRIES windows) until a window holds a draft forward; if none does, the means of the draft
forward and injection histograms must give no series in Prometheus (the documented `> 0`), not NaN.

Skipped only where the prometheus binary is missing outside CI; in CI (CI set) a missing binary fails."""
import json
import math
import os
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from support.promql import FILTER, dashboard_exprs, documented_queries

from vllm_dflash.bench import stats
from vllm_dflash.serve.server import Server, free_port

pytestmark = pytest.mark.vllm
PROMETHEUS = shutil.which("prometheus") or ("/usr/bin/prometheus" if os.path.exists("/usr/bin/prometheus") else None)
SCRAPE_S = 1.0
REQUESTS, CONCURRENCY, MAX_TOKENS = 32, 4, 48

TAU = "1 + rate(vllm:spec_decode_num_accepted_tokens_total[1m]) / rate(vllm:spec_decode_num_drafts_total[1m])"
PER_POS = ("rate(vllm:spec_decode_num_accepted_tokens_per_pos_total[1m]) / ignoring(position) group_left "
           "rate(vllm:spec_decode_num_drafts_total[1m])")
TOKENS_PER_FORWARD = "rate(vllm:generation_tokens_total[1m]) / rate(vllm_dflash:request_steps_total[1m])"
SHARE = ("rate(vllm_dflash:proposals_total[1m]) / ignoring(source) group_left sum without(source) "
         "(rate(vllm_dflash:proposals_total[1m]))")
ACCEPTANCE = "rate(vllm_dflash:accepted_tokens_total[1m]) / (rate(vllm_dflash:drafted_tokens_total[1m]) > 0)"
DRAFT_LEN = ("sum without(source) (rate(vllm_dflash:drafted_tokens_total[1m])) / sum without(source) "
             "(rate(vllm_dflash:proposals_total[1m]))")
DRAFT_FORWARD = ("rate(vllm_dflash:draft_forward_seconds_sum[1m]) / "
                 "(rate(vllm_dflash:draft_forward_seconds_count[1m]) > 0)")
INJECTION = "rate(vllm_dflash:kv_injection_seconds_sum[1m]) / (rate(vllm_dflash:kv_injection_seconds_count[1m]) > 0)"
TRIES = 3  # load windows run until one holds a draft forward (the planner may choose no DFlash under CI's load)


def _bench_figures(before: dict[str, float], after: dict[str, float]) -> tuple[dict, dict, dict]:
    """Per documented query: labels of a result series -> the bench's figure for it (None: no figure, so Prometheus
    must return no such series), from two parse_metrics() scrapes as `vllm-dflash bench` takes them."""
    sd, ad = stats.spec_decode_delta(before, after), stats.adaptive_delta(before, after)
    assert sd["drafts"] > 0 and ad is not None, (sd, ad)

    def mean(hist: str) -> float | None:  # None: nothing observed in the window (the query's `> 0` gives no series)
        d = lambda k: after[f"{hist}_{k}"] - before.get(f"{hist}_{k}", 0.0)  # noqa: E731
        return d("sum") / d("count") if d("count") > 0 else None

    return {
        TAU: lambda lb: sd["tau"],
        PER_POS: lambda lb: sd["per_position_rate"][int(lb["position"])],
        TOKENS_PER_FORWARD: lambda lb: sd["tokens_per_forward"],
        SHARE: lambda lb: ad["share"][lb["source"]],
        ACCEPTANCE: lambda lb: ad["acceptance_rate"][lb["source"]],
        DRAFT_LEN: lambda lb: ad["mean_draft_len"],
        DRAFT_FORWARD: lambda lb: mean("vllm_dflash:draft_forward_seconds"),
        INJECTION: lambda lb: mean("vllm_dflash:kv_injection_seconds"),
    }, sd, ad


class _Prometheus:
    """A Prometheus server on a loopback port scraping one target every SCRAPE_S, its data in a temporary folder."""

    def __init__(self, folder, target_port: int):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = folder / "prometheus.yml"
        cfg.write_text(f"global:\n  scrape_interval: {SCRAPE_S:g}s\n  scrape_timeout: {SCRAPE_S:g}s\n"
                       "scrape_configs:\n  - job_name: vllm\n    static_configs:\n"
                       f"      - targets: ['127.0.0.1:{target_port}']\n")
        self.log_path = folder / "prometheus.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={folder / 'data'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.proc.poll() is None, f"prometheus exited: {self.log_path.read_text()[-2000:]}"
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise TimeoutError("prometheus not ready")

    def query(self, q: str, at: float) -> list[dict]:
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": q, "time": f"{at:.3f}"})
        with urllib.request.urlopen(url, timeout=30) as r:
            body = json.loads(r.read().decode())
        assert body["status"] == "success", (q, body)
        return body["data"]["result"]

    def scrapes(self) -> list[float]:
        """Timestamps of the target's successful scrapes so far."""
        res = self.query("up[10m]", time.time())
        return sorted(float(t) for s in res for t, v in s["values"] if v == "1")

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()


def _settled(srv: Server, timeout: float = 60.0) -> dict[str, float]:
    """A scrape once no request runs and vLLM's and our counters held still over a second (ours reach /metrics
    within half a second of vLLM's)."""
    prev, deadline = None, time.time() + timeout
    while time.time() < deadline:
        m = srv.metrics()
        cur = {k: v for k, v in m.items() if k.startswith(("vllm:", "vllm_dflash:"))
               and k.split("{")[0].endswith(("_total", "_sum", "_count"))}
        if cur == prev and not m.get("vllm:num_requests_running"):
            return m
        prev = cur
        time.sleep(1.0)
    raise TimeoutError("the server's counters did not settle")


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Token-id prompts: half repeat a short phrase (prompt lookup finds continuations), half are random."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        if i % 2:
            phrase = rng.integers(4, 384, size=int(rng.integers(4, 9))).tolist()
            out.append((phrase * 6)[:40])
        else:
            out.append(rng.integers(4, 384, size=24).tolist())
    return out


def _load(srv: Server, prompts: list[list[int]]) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)

    def one(p):
        r = client.completions.create(model="target", prompt=p, max_tokens=MAX_TOKENS, temperature=0,
                                      extra_body={"ignore_eos": True})
        return r.usage.completion_tokens

    with ThreadPoolExecutor(CONCURRENCY) as ex:
        assert sum(ex.map(one, prompts)) == len(prompts) * MAX_TOKENS


def _finite(series: list[dict], q: str) -> list[tuple[dict, float]]:
    out = [(s["metric"], float(s["value"][1])) for s in series]
    assert out, f"empty result in Prometheus: {q}"
    assert all(math.isfinite(v) for _, v in out), (q, out)
    return out


def _declared_before_the_first_request(srv: Server) -> None:
    """The series that apply to this engine (adaptive drafting, every source) are on /metrics at 0 before any request,
    so that rate() counts the first ones; what does not apply is not there (no DFLASH_PROFILE: no target forward
    histogram), and no name of the old scheme is."""
    want = ["vllm_dflash:draft_steps_total", "vllm_dflash:request_steps_total", "vllm_dflash:block_size",
            "vllm_dflash:draft_forward_seconds_count", "vllm_dflash:accepted_tokens_per_step_count",
            *(f'vllm_dflash:{n}_total{{source="{s}"}}' for n in ("proposals", "drafted_tokens", "accepted_tokens")
              for s in ("dflash", "ngram", "merged")), 'vllm_dflash:proposals_total{source="none"}']
    deadline, m = time.time() + 30, {}
    while time.time() < deadline and not all(k in m for k in want):
        time.sleep(0.5)
        m = srv.metrics()
    assert [k for k in want if k not in m] == [], "declared series missing before the first request"
    assert all(m[k] == 0 for k in want if k.endswith(("_total", "_count")) or "_total{" in k), m
    assert not [k for k in m if k.startswith("vllm_dflash:target_forward")], "exported without DFLASH_PROFILE"
    assert not [k for k in m if k.startswith("vllm_dflash:") and ("_ms" in k or "proposals_dflash" in k)]


@pytest.fixture
def prometheus_binary():
    if PROMETHEUS is None:
        if os.environ.get("CI"):
            pytest.fail("no prometheus binary in CI: scripts/setup.sh installs the Debian package `prometheus`")
        pytest.skip("no prometheus binary (Debian: apt-get install prometheus; scripts/setup.sh does it)")
    return PROMETHEUS


def test_documented_queries_in_a_real_prometheus(prometheus_binary, pair, tmp_path):
    queries = documented_queries()
    # the server picks its port (again if another process takes it first: `Server.start`); Prometheus scrapes it
    srv = Server(str(pair / "target"), speculative_config={"method": "dflash", "model": str(pair / "draft-b8")},
                 log_path=str(tmp_path / "serve.log"), max_model_len=1024, dtype="float32",
                 env={"OMP_NUM_THREADS": "1"})
    prom = None
    try:
        t_start = time.time()
        srv.start(timeout=400)
        prom = _Prometheus(tmp_path, srv.port)
        prom.wait_ready()
        deadline = time.time() + 60  # a few scrapes of the idle server first (the checks below read idle windows)
        while len(prom.scrapes()) < 3 and time.time() < deadline:
            time.sleep(0.5)
        t_up = time.time()
        _declared_before_the_first_request(srv)
        _load(srv, _prompts(4, seed=1))  # warm-up: outside the measured window
        _settled(srv)
        for attempt in range(TRIES):  # the window that holds a draft forward, else the last one
            time.sleep(2.5 * SCRAPE_S)  # Prometheus scrapes the settled state before the window starts
            before, t_before = srv.metrics(), time.time()
            _load(srv, _prompts(REQUESTS, seed=100 * attempt))
            after = _settled(srv)
            t_after = time.time()
            key = "vllm_dflash:draft_forward_seconds_count"
            if after.get(key, 0.0) > before.get(key, 0.0):
                break
        deadline = time.time() + 30
        while not [t for t in prom.scrapes() if t > t_after + 0.2] and time.time() < deadline:
            time.sleep(0.5)
        times = prom.scrapes()
        t0 = max(t for t in times if t <= t_before)  # the last scrape before the load
        t1 = min(t for t in times if t > t_after + 0.2)  # the first after it, counters settled
        window = f"[{int(round((t1 - t0) * 1000)) + 1}ms]"
        figures, sd, ad = _bench_figures(before, after)
        # a histogram with no observation in the window: the bench has no figure and Prometheus no series (not NaN)
        absent = {q for q in (DRAFT_FORWARD, INJECTION) if figures[q]({}) is None}
        # so it is in the idle seconds before the load (settled counters, two scrapes or more): the documented `> 0`
        # gives no series where the plain ratio gives NaN
        idle = f"[{int(2 * SCRAPE_S * 1000)}ms]"
        assert prom.query(DRAFT_FORWARD.replace("[1m]", idle), t0) == []
        plain = prom.query(DRAFT_FORWARD.replace(" > 0)", ")").replace("[1m]", idle), t0)
        assert [math.isnan(float(s["value"][1])) for s in plain] == [True], plain
        print(f"server start {t_up - t_start:.0f} s, load {t_after - t_before:.1f} s (window {attempt + 1} of at "
              f"most {TRIES}), window {window}; absent {len(absent)}; bench: tau "
              f"{sd['tau']:.3f}, tokens/forward {sd['tokens_per_forward']:.3f}, share {ad['share']}, acceptance "
              f"{ad['acceptance_rate']}")
        results = {}
        for q in queries:
            assert q in figures, f"no bench figure for the documented query {q!r}: add one to _bench_figures"
            if q in absent:
                results[q] = []
                assert prom.query(q.replace("[1m]", window), t1) == [], q
                continue
            got = _finite(prom.query(q.replace("[1m]", window), t1), q)
            results[q] = got
            for labels, v in got:
                want = figures[q](labels)
                assert want is not None and math.isfinite(want), (q, labels, v, want)
                assert v == pytest.approx(want, rel=0.05, abs=1e-9), (q, labels, v, want)
        # every figure the bench has is in Prometheus' answer too
        assert {s["position"] for s, _ in results[PER_POS]} == {str(k) for k in range(len(sd["per_position_rate"]))}
        assert {s["source"] for s, _ in results[SHARE]} == set(ad["share"])
        assert {s["source"] for s, _ in results[ACCEPTANCE]} == {k for k, v in ad["acceptance_rate"].items()
                                                                 if v is not None}
        # the dashboard's form of each, its variables set to every model and engine: the same numbers
        for title, expr in dashboard_exprs():
            q = expr.replace("$model_name", ".*").replace("$engine", ".*").replace("[$__rate_interval]", window)
            doc = expr.replace(FILTER, "").replace("[$__rate_interval]", "[1m]")
            got = [] if doc in absent and prom.query(q, t1) == [] else _finite(prom.query(q, t1), f"{title}: {q}")
            assert sorted(v for _, v in got) == pytest.approx(sorted(v for _, v in results[doc])), title
    finally:
        srv.stop()
        if prom is not None:
            prom.stop()
