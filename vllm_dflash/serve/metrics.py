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

One folder per server: the front end (`ensure_metrics_dir`, from `register_collector`) makes a private folder
(`mkdtemp`, 0700) with an owner file naming the server, inside the folder the user set in DFLASH_METRICS_DIR or the
system's temporary folder, exports its path in DFLASH_METRICS_DIR (the one setting this package writes to the
environment: a folder shared by processes has no vLLM config channel) and removes it at exit. The processes vLLM
starts for that server inherit it (engine core, workers, Ray actors, the API servers of --api-server-count) and stamp
the server's id into their snapshots; a collector merges only snapshots with its server's id from live processes on
its host. Another front end that inherits the variable (a `vllm serve` started by a process that loaded the plugin)
makes its own folder beside the parent's, so neither merges the other's counters nor loses its folder when the other
exits. Dead servers' folders and snapshots left in a user-set folder are pruned when a server starts.

Metrics (all prefixed `vllm_dflash:`; see docs/METRICS.md):
  draft_forward_seconds       histogram  draft forward time per step (all denoising passes)
  kv_injection_seconds        histogram  context K/V injection time per step
  accepted_tokens_per_step    histogram  accepted draft tokens per request per verify step
  block_size                  gauge      block size in use (1 + drafts per request)
  diffusion_steps             gauge      denoising passes per draft
  draft_steps_total           counter    drafter invocations
  request_steps_total         counter    adaptive drafting: request-steps (tokens per target forward = generated / this)
  proposals_*_total, drafted_tokens_*_total, accepted_tokens_*_total   adaptive drafting, per source
"""
from __future__ import annotations

import atexit
import json
import math
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterable

from vllm_dflash.utils import get_logger

logger = get_logger(__name__)

_HOST = socket.gethostname()
ENV_DIR = "DFLASH_METRICS_DIR"  # settings.env_name("metrics_dir"); read through settings (deprecated alias too)
PREFIX = "vllm_dflash:"
FLUSH_INTERVAL_S = 0.5
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
ACCEPT_BUCKETS = tuple(float(i) for i in range(0, 17))

HISTOGRAMS = {
    "draft_forward_seconds": ("Draft forward time per drafting step (all denoising passes).", LATENCY_BUCKETS),
    "kv_injection_seconds": ("Context K/V injection time per drafting step.", LATENCY_BUCKETS),
    "target_forward_seconds": ("Target model forward time per engine step (verification included); recorded with "
                               "DFLASH_PROFILE=1 on CPU only.", LATENCY_BUCKETS),
    "accepted_tokens_per_step": ("Accepted draft tokens per request per verify step.", ACCEPT_BUCKETS),
    "draft_tokens_per_request": ("Adaptive drafting: draft tokens chosen per request per step (0 = none).",
                                 ACCEPT_BUCKETS),
}
GAUGES = {
    "block_size": "Block size in use (anchor + draft tokens per request).",
    "diffusion_steps": "Denoising passes per draft block.",
    "cost_fixed_ms": "Adaptive drafting: fitted fixed cost of a step (alpha of T = alpha + beta*n + delta*B + "
                     "gamma*m), ms.",
    "cost_per_token_ms": "Adaptive drafting: fitted cost per query token of a step (beta), ms.",
    "cost_per_request_ms": "Adaptive drafting: fitted cost per request of a step beyond its query tokens (delta), ms.",
    "cost_per_output_token_ms": "Adaptive drafting: fitted cost per token a step produced (gamma), ms.",
    "guard_plan_tokens_per_s": "Adaptive drafting: measured output tokens/s while speculating per the plan.",
    "guard_off_tokens_per_s": "Adaptive drafting: measured output tokens/s without speculation (the guard's other arm).",
}
COUNTERS = {
    "draft_steps": "Drafter invocations (one per engine step with drafting).",
    "request_steps": "Adaptive drafting: request-steps (a request's share of an engine step that gave it a token); "
                     "generated tokens / request-steps = tokens per target forward.",
    "proposals_dflash": "Adaptive drafting: request-steps that verified a DFlash block.",
    "proposals_ngram": "Adaptive drafting: request-steps that verified a prompt-lookup (n-gram) proposal.",
    "proposals_merged": "Adaptive drafting: request-steps that verified a merged proposal (prompt-lookup tokens first, "
                        "the DFlash block after them).",
    "proposals_none": "Adaptive drafting: request-steps without speculation (k = 0).",
    "drafted_tokens_dflash": "Adaptive drafting: DFlash draft tokens sent to verification.",
    "drafted_tokens_ngram": "Adaptive drafting: prompt-lookup draft tokens sent to verification.",
    "drafted_tokens_merged": "Adaptive drafting: merged-proposal draft tokens sent to verification.",
    "accepted_tokens_dflash": "Adaptive drafting: accepted DFlash draft tokens.",
    "accepted_tokens_ngram": "Adaptive drafting: accepted prompt-lookup draft tokens.",
    "accepted_tokens_merged": "Adaptive drafting: accepted merged-proposal draft tokens.",
    "context_dropped_steps": "Adaptive drafting: steps whose context rows were dropped because no speculation was "
                             "measured faster at that batch size (their requests draft by prompt lookup only).",
    "context_released": "Adaptive drafting: requests that released their draft context after a lease of decode steps "
                        "without a DFlash token, where keeping the context rows cost a measurable share of a step "
                        "(they draft by prompt lookup only from then on).",
}
SKIPPED = "metrics_snapshots_skipped"  # counted by the collector itself, not merged from snapshots
SKIPPED_DOC = ("Files in the metrics folder that were not valid snapshots (wrong shape, unreadable) and were left out "
               "of these metrics; each distinct file (name, modification time, size) counts once.")


def _env_dir() -> str | None:
    from vllm_dflash.settings import process_setting

    return process_setting("metrics_dir")


OWNER_FILE = "server.json"  # in a server's folder: {"server": its id (the folder's name), "pid", "host", "base"}
SERVER_PREFIX = "vllm_dflash_metrics_"
STALE_S = 3600.0  # a snapshot or server folder that cannot be checked (other host, no id) is pruned after this


def _read_owner(d: Path) -> dict | None:
    """The owner file of a server folder (None: not a server folder, or not a valid owner file)."""
    try:
        owner = json.loads((d / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not (isinstance(owner, dict) and isinstance(owner.get("server"), str) and isinstance(owner.get("pid"), int)
            and isinstance(owner.get("host"), str)):
        return None
    return owner


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


def _write_file(path: Path, text: str) -> None:
    """Atomically (a reader sees the old or the new file) and without following links: a new file made with
    O_CREAT|O_EXCL|O_NOFOLLOW (`mkstemp`) in the same folder, renamed over `path` (a link at `path` is replaced)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _new_server_dir(base: str | None) -> Path:
    if base:
        Path(base).mkdir(parents=True, exist_ok=True)
        prune_base(base)
    d = Path(tempfile.mkdtemp(prefix=SERVER_PREFIX, dir=base))  # 0700: only this user's processes write here
    _write_file(d / OWNER_FILE, json.dumps({"server": d.name, "pid": os.getpid(), "host": _HOST, "base": base,
                                            "time": time.time()}))
    atexit.register(shutil.rmtree, str(d), True)
    return d


def ensure_metrics_dir() -> Path:
    """This server's metrics folder, made on first use by its front end (the process that registers the collector).
    A process vLLM started for the server that owns the inherited DFLASH_METRICS_DIR uses that folder; any other
    process makes a folder of its own (inside the folder the user set, or the one the inherited folder is in) and
    exports it to the processes it starts."""
    d = _env_dir()
    base = None
    if d:
        owner = _read_owner(Path(d))
        if owner is not None and owner["host"] == _HOST and (owner["pid"] == os.getpid()
                                                             or _started_for_this_server()):
            return Path(d)
        base = owner.get("base") if owner is not None else d  # no owner file: the folder the user set
    new = _new_server_dir(base)
    os.environ[ENV_DIR] = str(new)  # inherited by the engine and worker processes (under the new name)
    return new


def server_id(directory: str | Path | None) -> str | None:
    """The id of the server whose folder this is (None: a folder without an owner file)."""
    owner = _read_owner(Path(directory)) if directory else None
    return owner["server"] if owner is not None else None


def _stale(path: Path) -> bool:
    try:
        return time.time() - path.stat().st_mtime > STALE_S
    except OSError:
        return False


def prune_base(base: str | Path) -> None:
    """In a folder the user set: remove the folders of servers that are gone (a dead owner on this host, or an owner
    file that cannot be checked and is older than STALE_S) and snapshots of the old layout (files directly in it) whose
    writer is gone or that are older than STALE_S. A live server's folder is left alone."""
    base = Path(base)
    for d in base.glob(SERVER_PREFIX + "*"):
        if not d.is_dir() or d.is_symlink():
            continue
        owner = _read_owner(d)
        if owner is None or owner["host"] != _HOST:
            gone = _stale(d / OWNER_FILE) if (d / OWNER_FILE).exists() else _stale(d)
        else:
            gone = not _pid_alive(owner["pid"])
        if gone:
            shutil.rmtree(d, ignore_errors=True)
    read_snapshots(base, prune=True, server=object())  # files directly in it belong to no server of this layout


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


class MetricsSink:
    """Per-process accumulator; `flush()` writes a snapshot for the API server's collector."""

    _instance: "MetricsSink | None" = None

    def __init__(self) -> None:
        self.hists = {k: _Hist(b) for k, (_, b) in HISTOGRAMS.items()}
        self.gauges = {k: 0.0 for k in GAUGES}
        self.counters = {k: 0.0 for k in COUNTERS}
        self._lock = threading.Lock()
        self._io_lock = threading.Lock()
        self._dirty = False
        self._flusher_pid: int | None = None  # the process whose flusher thread runs (none yet: None)
        d = _env_dir()
        self.path = Path(d) / f"proc-{os.getpid()}.json" if d else None
        self.server = server_id(d)  # stamped into every snapshot: the collector merges its own server's only

    @classmethod
    def get(cls) -> "MetricsSink":
        if cls._instance is None:
            cls._instance = MetricsSink()
        elif cls._instance.path is not None and cls._instance.path.name != f"proc-{os.getpid()}.json":
            cls._instance = MetricsSink()  # a forked child: its own snapshot file, not the parent's
        return cls._instance

    @classmethod
    def disabled(cls) -> "MetricsSink":
        """A sink that accumulates but never writes a snapshot (`flush` is a no-op): for a process whose events
        another process already publishes (a TP rank other than 0: merged() sums snapshots, so TP=2 would double
        every counter and histogram)."""
        sink = cls()
        sink.path = None
        return sink

    def observe(self, name: str, value: float, n: int = 1) -> None:
        with self._lock:
            self.hists[name].observe(value, n)

    def set(self, name: str, value: float) -> None:
        self.gauges[name] = value

    def inc(self, name: str, n: float = 1.0) -> None:
        self.counters[name] += n

    def snapshot(self) -> dict:
        with self._lock:
            return {"hists": {k: {"counts": list(h.counts), "sum": h.sum, "count": h.count}
                              for k, h in self.hists.items()},
                    "gauges": dict(self.gauges), "counters": dict(self.counters), "time": time.time(),
                    "pid": os.getpid(), "host": _HOST, "server": self.server}

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
                _write_file(self.path, json.dumps(self.snapshot()))
            except OSError:
                pass  # metrics must never break serving


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. PermissionError: the pid exists (another user's process)
        return True
    return True


def _writer_alive(snap: dict) -> bool:
    """Is the process that wrote this snapshot still running? Only a dead process on this host is known to be gone."""
    pid, host = snap.get("pid"), snap.get("host")
    if not isinstance(pid, int) or host != _HOST:
        return True
    return _pid_alive(pid)


_OWN = object()  # read_snapshots' default: the server whose folder it reads


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def snapshot_problem(snap) -> str | None:
    """Why a snapshot cannot be merged, or None. A snapshot is checked whole before any of it is merged: a wrong
    shape (another plugin version's file, a hand-placed one) must not raise in the collector, which would fail the
    whole of /metrics (vLLM's own metrics share the registry), nor be merged in part (a histogram with another
    bucket count would be cut to the shorter one). Names this version does not know are ignored."""
    if not isinstance(snap, dict):
        return f"a JSON {type(snap).__name__}, not an object"
    if "time" in snap and not _finite(snap["time"]):
        return "time is not a number"
    if not isinstance(snap.get("server"), (str, type(None))):
        return "server is not a string"
    for part in ("hists", "gauges", "counters"):
        if not isinstance(snap.get(part, {}), dict):
            return f"{part} is not an object"
    for name, h in snap.get("hists", {}).items():
        if name not in HISTOGRAMS:
            continue
        n = len(HISTOGRAMS[name][1])
        if not isinstance(h, dict):
            return f"histogram {name} is not an object"
        counts = h.get("counts")
        if not isinstance(counts, list) or len(counts) != n or not all(_finite(c) for c in counts):
            return f"histogram {name}: counts must be {n} numbers (one per bucket)"
        if not _finite(h.get("sum")) or not _finite(h.get("count")):
            return f"histogram {name}: sum and count must be numbers"
    for part, known in (("gauges", GAUGES), ("counters", COUNTERS)):
        for name, v in snap.get(part, {}).items():
            if name in known and not _finite(v):
                return f"{part[:-1]} {name} is not a number"
    return None


def read_snapshots(directory: str | Path | None = None, prune: bool = False,
                   skipped: list[tuple[Path, str]] | None = None, server: str | None | object = _OWN) -> list[dict]:
    """The snapshots of `server` (default: the server whose folder this is, `server_id`) written by live processes on
    this host. Ignored: a snapshot of another server or with no server id (a folder without an owner file reads those
    with none), from another host, or whose writer has exited (a dead worker's counters must not add to the live
    ones). prune: also delete the files of exited writers on this host, and ignored files older than STALE_S. A file
    that is not a valid snapshot (`snapshot_problem`) is skipped, and (path, reason) appended to `skipped` if given."""
    d = Path(directory or _env_dir() or "")
    if not str(d) or not d.is_dir():
        return []
    if server is _OWN:
        server = server_id(d)
    out = []
    for f in sorted(d.glob("proc-*.json")):
        try:
            snap = json.loads(f.read_text())
        except FileNotFoundError:  # replaced or pruned between the listing and the read
            continue
        except (OSError, ValueError) as e:  # ValueError: bad JSON or bad UTF-8
            problem = f"unreadable ({type(e).__name__})"
        else:
            problem = snapshot_problem(snap)
        if problem is not None:
            if skipped is not None:
                skipped.append((f, problem))
            continue
        if not _writer_alive(snap):
            if prune:
                f.unlink(missing_ok=True)
            continue
        if snap.get("server") != server or snap.get("host", _HOST) != _HOST:
            if prune and _stale(f):
                f.unlink(missing_ok=True)
            continue
        out.append(snap)
    return out


def merged(snapshots: list[dict]) -> dict:
    """Sum histograms and counters over processes; gauges: the value of the most recent writer that set it."""
    hists = {k: {"counts": [0] * len(b), "sum": 0.0, "count": 0} for k, (_, b) in HISTOGRAMS.items()}
    counters = {k: 0.0 for k in COUNTERS}
    gauges: dict[str, float] = {}
    for snap in sorted(snapshots, key=lambda s: s.get("time", 0)):  # valid ones (read_snapshots checked them)
        for k, h in snap.get("hists", {}).items():
            if k in hists:
                hists[k]["counts"] = [a + b for a, b in zip(hists[k]["counts"], h["counts"])]
                hists[k]["sum"] += h["sum"]
                hists[k]["count"] += h["count"]
        for k, v in snap.get("counters", {}).items():
            counters[k] = counters.get(k, 0.0) + v
        for k, v in snap.get("gauges", {}).items():
            if v:
                gauges[k] = v
    return {"hists": hists, "counters": counters, "gauges": gauges}


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
        m = merged(read_snapshots(self.directory, skipped=skipped, server=self.server))
        self._note_skipped(skipped)
        for name, (doc, buckets) in HISTOGRAMS.items():
            h = m["hists"][name]
            cum, acc = [], 0
            for b, c in zip(buckets, h["counts"], strict=True):
                acc += c
                cum.append((repr(float(b)), acc))
            cum.append(("+Inf", h["count"]))
            yield HistogramMetricFamily(PREFIX + name, doc, buckets=cum, sum_value=h["sum"])
        for name, doc in GAUGES.items():
            g = GaugeMetricFamily(PREFIX + name, doc)
            g.add_metric([], m["gauges"].get(name, 0.0))
            yield g
        for name, doc in COUNTERS.items():
            c = CounterMetricFamily(PREFIX + name, doc)
            c.add_metric([], m["counters"].get(name, 0.0))
            yield c
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
