# SPDX-License-Identifier: Apache-2.0
"""Our Prometheus metrics, across vLLM's processes.

vLLM's drafter runs in the worker process and the scheduler in the engine-core process, while
`/metrics` is served by the API server. Each process that produces our metrics keeps them in a
`MetricsSink` and writes a snapshot (JSON, written to a fresh `mkstemp` file and renamed into place, from a flusher
thread at most every `FLUSH_INTERVAL_S`, so the last change reaches the snapshot within about `FLUSH_INTERVAL_S` even
when idle) into $DFLASH_METRICS_DIR. The API server's `DFlashCollector` (a prometheus_client custom collector
registered by the plugin) merges its server's snapshots on every scrape (counters and histograms are summed, so each
event must be published by one process only: under tensor parallelism only TP rank 0's drafter publishes, the other
ranks get `MetricsSink.disabled()`, see integration/proposer.py).

One folder per server (its layout, the snapshots and their merging: snapshots.py; the metric names:
metric_names.py): the front end (`ensure_metrics_dir`, from `register_collector`) makes a private folder
(`mkdtemp`, 0700) with an owner file naming the server, inside the folder the user set in DFLASH_METRICS_DIR or the
system's temporary folder, exports its path in DFLASH_METRICS_DIR (the one setting this package writes to the
environment: a folder shared by processes has no vLLM config channel) and removes it at exit. The processes vLLM
starts for that server inherit it (engine core, workers, Ray actors, the API servers of --api-server-count) and stamp
the server's id into their snapshots; a collector merges only snapshots with its server's id from live processes on
its host. Another front end that inherits the variable (a `vllm serve` started by a process that loaded the plugin)
makes its own folder beside the parent's, so neither merges the other's counters nor loses its folder when the other
exits. Dead servers' folders and snapshots left in a user-set folder are pruned when a server starts.

Every series carries vLLM's labels `model_name` (the served model name) and `engine` (the engine's index), taken from
the engine's config by each writing process (`MetricsSink.get(vllm_config)`, `engine_labels`): snapshots of one
engine merge into one series, and PromQL can divide ours by vLLM's. A series is exported only where it applies: a
process declares the series its engine counts (`MetricsSink.declare`, at 0 from the start) or they appear when first
set; nothing is exported as a zero for what this engine does not do.

Metrics (all prefixed `vllm_dflash:`; every one, with its labels: docs/METRICS.md):
  draft_forward_seconds       histogram  draft forward time per step (all denoising passes)
  kv_injection_seconds        histogram  context K/V injection time per step
  accepted_tokens_per_step    histogram  accepted draft tokens per request per verify step
  block_size                  gauge      block size in use (1 + drafts per request)
  diffusion_steps             gauge      denoising passes per draft
  draft_steps_total           counter    drafter invocations
  request_steps_total         counter    adaptive drafting: request-steps (tokens per target forward = generated / this)
  proposals_total{source}, drafted_tokens_total{source}, accepted_tokens_total{source}   adaptive drafting
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from vllm_dflash.serve.metric_names import (  # noqa: F401 (ACCEPT_BUCKETS, LATENCY_BUCKETS: re-exported)
    ACCEPT_BUCKETS,
    COUNTERS,
    GAUGES,
    HISTOGRAMS,
    IDENTITY,
    LABELS,
    LATENCY_BUCKETS,
    PREFIX,
    SKIPPED,
    SKIPPED_DOC,
    series_key,
    split_key,
)
from vllm_dflash.serve.snapshots import (  # noqa: F401 (OWNER_FILE .. snapshot_problem: re-exported)
    HOST,
    OWNER_FILE,
    SERVER_PREFIX,
    STALE_S,
    env_dir,
    merged,
    new_server_dir,
    prune_base,
    read_owner,
    read_snapshots,
    server_id,
    snapshot_problem,
    write_file,
)
from vllm_dflash.utils import get_logger

logger = get_logger(__name__)

ENV_DIR = "DFLASH_METRICS_DIR"  # settings.env_name("metrics_dir"); read through settings (deprecated alias too)
FLUSH_INTERVAL_S = 0.5


def _started_for_this_server() -> bool:
    """Was this process started by vLLM for the server that owns the inherited folder? vLLM starts its engine core,
    workers and extra API servers with multiprocessing and its Ray workers as Ray actors; a front end started any other
    way (a subprocess `vllm serve`) is another server."""
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        return True
    ray_worker = sys.modules.get("ray._private.worker")
    mode = getattr(getattr(ray_worker, "global_worker", None), "mode", None)
    return mode is not None and mode == getattr(ray_worker, "WORKER_MODE", object())


def ensure_metrics_dir() -> Path:
    """This server's metrics folder, made on first use by its front end (the process that registers the collector).
    A process vLLM started for the server that owns the inherited DFLASH_METRICS_DIR uses that folder; any other
    process makes a folder of its own (inside the folder the user set, or the one the inherited folder is in) and
    exports it to the processes it starts."""
    d = env_dir()
    base = None
    if d:
        owner = read_owner(Path(d))
        if owner is not None and owner["host"] == HOST and (owner["pid"] == os.getpid()
                                                            or _started_for_this_server()):
            return Path(d)
        base = owner.get("base") if owner is not None else d  # no owner file: the folder the user set
    new = new_server_dir(base)
    os.environ[ENV_DIR] = str(new)  # inherited by the engine and worker processes (under the new name)
    return new


class _Hist:
    __slots__ = ("buckets", "counts", "sum", "count")

    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * len(buckets)  # non-cumulative per bucket (le semantics applied at export)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float, n: int = 1) -> None:
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += n
                break
        self.sum += v * n
        self.count += n


def engine_labels(vllm_config) -> dict[str, str]:
    """vLLM's labels of an engine's series (vllm/v1/metrics/loggers.py, PrometheusStatLogger): `model_name` = the
    served model name, `engine` = the engine's index (its data-parallel rank; 0 without data parallelism), as the
    engine core and its workers see them in their config."""
    pc = vllm_config.parallel_config
    index = getattr(pc, "data_parallel_index", None)
    return {"model_name": str(vllm_config.model_config.served_model_name),
            "engine": str(pc.data_parallel_rank if index is None else index)}


class MetricsSink:
    """Per-process accumulator; `flush()` writes a snapshot for the API server's collector. A series is in it (and
    exported) once it is declared, observed, set or counted: only what applies to this process's engine."""

    _instance: MetricsSink | None = None

    def __init__(self) -> None:
        self.hists: dict[str, _Hist] = {}
        self.gauges: dict[str, float] = {}  # by series_key
        self.counters: dict[str, float] = {}  # by series_key
        self.labels: dict[str, str] = {}  # vLLM's labels of this process's engine (engine_labels; empty: unknown)
        self._lock = threading.Lock()
        self._io_lock = threading.Lock()
        self._dirty = False
        self._flusher_pid: int | None = None  # the process whose flusher thread runs (none yet: None)
        d = env_dir()
        self.path = Path(d) / f"proc-{os.getpid()}.json" if d else None
        self.server = server_id(d)  # stamped into every snapshot: the collector merges its own server's only

    @classmethod
    def get(cls, vllm_config=None) -> MetricsSink:
        """This process's sink; vllm_config (the engine's, where the caller has it): its labels, if not set yet."""
        if cls._instance is None:
            cls._instance = MetricsSink()
        elif cls._instance.path is not None and cls._instance.path.name != f"proc-{os.getpid()}.json":
            cls._instance = MetricsSink()  # a forked child: its own snapshot file, not the parent's
        if vllm_config is not None and not cls._instance.labels:
            cls._instance.labels = engine_labels(vllm_config)
        return cls._instance

    @classmethod
    def disabled(cls) -> MetricsSink:
        """A sink that accumulates but never writes a snapshot (`flush` is a no-op): for a process whose events
        another process already publishes (a TP rank other than 0: merged() sums snapshots, so TP=2 would double
        every counter and histogram)."""
        sink = cls()
        sink.path = None
        return sink

    def declare(self, *names: str, **labels: str) -> None:
        """Export these histograms and counters from now on, at 0 until they count: the series that apply to this
        process's engine, declared where it is set up. A series that first appears with its first counts loses them
        in PromQL's rate() and increase(). Published like any change (`flush`), before the engine serves."""
        with self._lock:
            for name in names:
                if name in HISTOGRAMS:
                    self.hists.setdefault(name, _Hist(HISTOGRAMS[name][1]))
                elif name in COUNTERS:
                    self.counters.setdefault(series_key(name, labels), 0.0)
                else:
                    raise KeyError(f"no histogram or counter {name!r} (serve/metric_names.py)")
        self.flush()

    def observe(self, name: str, value: float, n: int = 1) -> None:
        with self._lock:
            h = self.hists.get(name)
            if h is None:
                h = self.hists[name] = _Hist(HISTOGRAMS[name][1])
            h.observe(value, n)

    def set(self, name: str, value: float, **labels: str) -> None:
        if name not in GAUGES:
            raise KeyError(f"no gauge {name!r} (serve/metric_names.py)")
        key = series_key(name, labels)
        with self._lock:
            self.gauges[key] = value

    def inc(self, name: str, n: float = 1.0, **labels: str) -> None:
        if name not in COUNTERS:
            raise KeyError(f"no counter {name!r} (serve/metric_names.py)")
        key = series_key(name, labels)
        with self._lock:
            self.counters[key] = self.counters.get(key, 0.0) + n

    def snapshot(self) -> dict:
        with self._lock:
            return {"hists": {k: {"counts": list(h.counts), "sum": h.sum, "count": h.count}
                              for k, h in self.hists.items()},
                    "gauges": dict(self.gauges), "counters": dict(self.counters), "labels": dict(self.labels),
                    "time": time.time(), "pid": os.getpid(), "host": HOST, "server": self.server}

    def flush(self, force: bool = False) -> None:
        """Publish the current values: force -> write a snapshot now, on this thread; otherwise mark them changed and
        leave the write to this process's flusher thread (one, started on first use), which writes at most every
        FLUSH_INTERVAL_S, so the snapshot catches up within about FLUSH_INTERVAL_S even when the server goes idle
        right after. The drafter calls this every step: no I/O and no lock wait on the serving thread (the old
        throttle took a lock the writing timer thread held, 2-5 ms a step under load: dev/PROFILE_18.md)."""
        if self.path is None:
            return
        if force:
            self._write()
            return
        self._dirty = True
        if self._flusher_pid != os.getpid():  # none yet in this process (or inherited through a fork: not running)
            self._start_flusher()

    def _start_flusher(self) -> None:
        with self._io_lock:
            if self._flusher_pid == os.getpid():
                return
            self._flusher_pid = os.getpid()
            threading.Thread(target=self._flush_loop, name="dflash-metrics-flush", daemon=True).start()

    def _flush_loop(self) -> None:
        while True:
            time.sleep(FLUSH_INTERVAL_S)
            if self._dirty:
                self._dirty = False  # before the snapshot: a change after it is written on the next round
                self._write()

    def _write(self) -> None:
        with self._io_lock:
            try:
                write_file(self.path, json.dumps(self.snapshot()))
            except OSError:
                pass  # metrics must never break serving


class DFlashCollector:
    """prometheus_client custom collector exporting the merged snapshots. It never raises for what is in the folder:
    a file that is not a valid snapshot is left out, logged once, and counted in `SKIPPED` (the number of distinct bad
    files this collector has seen: a file counts again only when it changes)."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.server = server_id(self.directory)  # this server's snapshots only
        self._bad: set[tuple[str, int, int]] = set()  # (name, mtime_ns, size) of every bad file seen

    def describe(self) -> Iterable:
        return []  # unchecked collector: never clashes with vLLM's unregister_vllm_metrics()

    def _note_skipped(self, skipped: list[tuple[Path, str]]) -> None:
        for f, problem in skipped:
            try:
                st = f.stat()
            except OSError:
                continue
            key = (f.name, st.st_mtime_ns, st.st_size)
            if key not in self._bad:
                self._bad.add(key)
                logger.warning("vllm_dflash: metrics snapshot %s skipped: %s (counted in %s%s_total)", f, problem,
                               PREFIX, SKIPPED)

    def collect(self) -> Iterable:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        skipped: list[tuple[Path, str]] = []
        snaps = read_snapshots(self.directory, skipped=skipped, server=self.server)
        self._note_skipped(skipped)
        # vLLM's labels that some snapshot carries (all of them in a server; none in a hand-made folder)
        ident = [n for n in IDENTITY if any(n in s.get("labels", {}) for s in snaps)]
        engines: dict[tuple[str, ...], list[dict]] = {}
        for s in snaps:
            engines.setdefault(tuple(s.get("labels", {}).get(n, "") for n in ident), []).append(s)
        families: dict[str, object] = {}

        def family(name: str, kind, doc: str):
            if name not in families:
                families[name] = kind(PREFIX + name, doc, labels=ident + list(LABELS.get(name, ())))
            return families[name]

        for values, group in sorted(engines.items()):
            m = merged(group, complete=False)
            for name, h in m["hists"].items():
                cum, acc = [], 0
                for b, c in zip(HISTOGRAMS[name][1], h["counts"], strict=True):
                    acc += c
                    cum.append((repr(float(b)), acc))
                cum.append(("+Inf", h["count"]))
                family(name, HistogramMetricFamily, HISTOGRAMS[name][0]).add_metric(list(values), cum, h["sum"])
            for part, kind, docs in (("gauges", GaugeMetricFamily, GAUGES), ("counters", CounterMetricFamily,
                                                                             COUNTERS)):
                for key, v in sorted(m[part].items()):
                    name, own = split_key(key)
                    family(name, kind, docs[name]).add_metric([*values, *own], v)
        order = [*HISTOGRAMS, *GAUGES, *COUNTERS]
        yield from (families[n] for n in order if n in families)
        c = CounterMetricFamily(PREFIX + SKIPPED, SKIPPED_DOC)
        c.add_metric([], float(len(self._bad)))
        yield c


def is_output_rank() -> bool:
    """Is this worker the one whose output reaches the scheduler, so the one that publishes worker metrics (TP rank 0
    of the last PP stage, vLLM's `_get_output_rank`)? True without vLLM's distributed state."""
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group, model_parallel_is_initialized

        if not model_parallel_is_initialized():
            return True
        return get_tp_group().rank_in_group == 0 and get_pp_group().is_last_rank
    except Exception:  # noqa: BLE001 - no distributed state: a single rank
        return True


_COLLECTOR_DIR: Path | None = None  # set once this process has registered its collector


def register_collector() -> None:
    """Register the collector of this server's folder in this process's default registry (once), for the front end
    of a DFlash engine. With PROMETHEUS_MULTIPROC_DIR set vLLM serves another registry: `add_to_registry` (the
    patched `get_prometheus_registry`, integration/patches/prometheus_registry.py) adds one there too."""
    global _COLLECTOR_DIR
    if _COLLECTOR_DIR is not None:
        return
    try:
        from prometheus_client import REGISTRY
    except ImportError:
        return
    d = ensure_metrics_dir()
    read_snapshots(d, prune=True)  # exited writers of this server (a folder made just now has none)
    REGISTRY.register(DFlashCollector(d))
    _COLLECTOR_DIR = d


def add_to_registry(registry) -> None:
    """Add this server's collector to a registry vLLM serves instead of the default one (PROMETHEUS_MULTIPROC_DIR
    set); nothing in a process that registered none (no DFlash engine here)."""
    if _COLLECTOR_DIR is not None:
        registry.register(DFlashCollector(_COLLECTOR_DIR))
