# SPDX-License-Identifier: Apache-2.0
"""The metrics folder on disk: one folder per server and the snapshots in it.

A server's folder (`new_server_dir`, made by its front end: metrics.ensure_metrics_dir) is a private `mkdtemp` folder
(0700) with an owner file naming the server, inside the folder the user set in DFLASH_METRICS_DIR or the system's
temporary folder; it is removed at exit. Each process writes its snapshot there as proc-<pid>.json (`write_file`:
atomic, never through a link) stamped with the server's id, its pid and its host. `read_snapshots` returns the valid
snapshots of one server from live writers on this host (a file that is not a valid snapshot is reported, never
merged), `merged` sums them, and `prune_base` removes what servers that are gone left in a user-set folder."""
from __future__ import annotations

import atexit
import json
import math
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from vllm_dflash.serve.metric_names import COUNTERS, GAUGES, HISTOGRAMS, LABELS, known_key

HOST = socket.gethostname()


def env_dir() -> str | None:
    """The folder DFLASH_METRICS_DIR names (read through settings, so the deprecated name too), or None."""
    from vllm_dflash.settings import process_setting

    return process_setting("metrics_dir")


OWNER_FILE = "server.json"  # in a server's folder: {"server": its id (the folder's name), "pid", "host", "base"}
SERVER_PREFIX = "vllm_dflash_metrics_"
STALE_S = 3600.0  # a snapshot or server folder that cannot be checked (other host, no id) is pruned after this


def read_owner(d: Path) -> dict | None:
    """The owner file of a server folder (None: not a server folder, or not a valid owner file)."""
    try:
        owner = json.loads((d / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not (isinstance(owner, dict) and isinstance(owner.get("server"), str) and isinstance(owner.get("pid"), int)
            and isinstance(owner.get("host"), str)):
        return None
    return owner


def write_file(path: Path, text: str) -> None:
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


def new_server_dir(base: str | None) -> Path:
    if base:
        Path(base).mkdir(parents=True, exist_ok=True)
        prune_base(base)
    d = Path(tempfile.mkdtemp(prefix=SERVER_PREFIX, dir=base))  # 0700: only this user's processes write here
    write_file(d / OWNER_FILE, json.dumps({"server": d.name, "pid": os.getpid(), "host": HOST, "base": base,
                                            "time": time.time()}))
    atexit.register(shutil.rmtree, str(d), True)
    return d


def server_id(directory: str | Path | None) -> str | None:
    """The id of the server whose folder this is (None: a folder without an owner file)."""
    owner = read_owner(Path(directory)) if directory else None
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
        owner = read_owner(d)
        if owner is None or owner["host"] != HOST:
            gone = _stale(d / OWNER_FILE) if (d / OWNER_FILE).exists() else _stale(d)
        else:
            gone = not _pid_alive(owner["pid"])
        if gone:
            shutil.rmtree(d, ignore_errors=True)
    read_snapshots(base, prune=True, server=object())  # files directly in it belong to no server of this layout


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
    if not isinstance(pid, int) or host != HOST:
        return True
    return _pid_alive(pid)


_OWN = object()  # read_snapshots' default: the server whose folder it reads


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def snapshot_problem(snap) -> str | None:
    """Why a snapshot cannot be merged, or None. A snapshot is checked whole before any of it is merged: a wrong
    shape (another plugin version's file, a hand-placed one) must not raise in the collector, which would fail the
    whole of /metrics (vLLM's own metrics share the registry), nor be merged in part (a histogram with another
    bucket count would be cut to the shorter one). A histogram this version does not know is not checked (nor merged);
    a counter or gauge must be a number whatever its name (every version writes numbers there)."""
    if not isinstance(snap, dict):
        return f"a JSON {type(snap).__name__}, not an object"
    if "time" in snap and not _finite(snap["time"]):
        return "time is not a number"
    if not isinstance(snap.get("server"), (str, type(None))):
        return "server is not a string"
    labels = snap.get("labels", {})
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        return "labels is not an object of strings"
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
    for part in ("gauges", "counters"):
        for name, v in snap.get(part, {}).items():
            if not _finite(v):
                return f"{part[:-1]} {name} is not a number"
    return None


def read_snapshots(directory: str | Path | None = None, prune: bool = False,
                   skipped: list[tuple[Path, str]] | None = None, server: str | None | object = _OWN) -> list[dict]:
    """The snapshots of `server` (default: the server whose folder this is, `server_id`) written by live processes on
    this host. Ignored: a snapshot of another server or with no server id (a folder without an owner file reads those
    with none), from another host, or whose writer has exited (a dead worker's counters must not add to the live
    ones). prune: also delete the files of exited writers on this host, and ignored files older than STALE_S. A file
    that is not a valid snapshot (`snapshot_problem`) is skipped, and (path, reason) appended to `skipped` if given."""
    d = Path(directory or env_dir() or "")
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
        if snap.get("server") != server or snap.get("host", HOST) != HOST:
            if prune and _stale(f):
                f.unlink(missing_ok=True)
            continue
        out.append(snap)
    return out


def _empty(hist: str) -> dict:
    return {"counts": [0] * len(HISTOGRAMS[hist][1]), "sum": 0.0, "count": 0}


def merged(snapshots: list[dict], complete: bool = True) -> dict:
    """Sum histograms and counters over processes (whatever their labels: group snapshots by their "labels" first for
    one engine's); gauges: the value of the most recent writer that set it. Only the series this version exports are
    merged (counters and gauges by `series_key`). complete: every histogram and every counter without labels of its
    own is in the result, 0 where no process had it (for a reader of one name); else only the series some process
    had (what the collector exports)."""
    hists = {k: _empty(k) for k in HISTOGRAMS} if complete else {}
    counters = {k: 0.0 for k in COUNTERS if k not in LABELS} if complete else {}
    gauges: dict[str, float] = {}
    for snap in sorted(snapshots, key=lambda s: s.get("time", 0)):  # valid ones (read_snapshots checked them)
        for k, h in snap.get("hists", {}).items():
            if k in HISTOGRAMS:
                acc = hists.setdefault(k, _empty(k))
                acc["counts"] = [a + b for a, b in zip(acc["counts"], h["counts"], strict=True)]
                acc["sum"] += h["sum"]
                acc["count"] += h["count"]
        for k, v in snap.get("counters", {}).items():
            if known_key(k, COUNTERS):
                counters[k] = counters.get(k, 0.0) + v
        for k, v in snap.get("gauges", {}).items():
            if known_key(k, GAUGES):
                gauges[k] = v
    return {"hists": hists, "counters": counters, "gauges": gauges}
