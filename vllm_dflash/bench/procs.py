# SPDX-License-Identifier: Apache-2.0
"""A benchmark server's processes, read from /proc: the members of its process group (one `vllm serve` with its
engine core and workers), their CPU time and their layout (allowed CPUs, threads). Linux only."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def _fields(stat: str) -> list[str]:
    """The fields of a /proc stat line after the command (which may hold spaces and parentheses)."""
    return stat.rsplit(")", 1)[1].split()


def _cpu_s(fields: list[str]) -> float:
    """User + system CPU seconds from `_fields` of a process or thread stat."""
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _comm(stat: str) -> str:
    """The command name of a /proc stat line (between the first "(" and the last ")")."""
    return stat[stat.index("(") + 1:stat.rindex(")")]


def _stats():
    """(pid, raw /proc/<pid>/stat line, its fields after the command) of every live process, in pid order.
    Fields from 0: state ppid pgrp ... utime (11) stime (12)."""
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            raw = Path(f"/proc/{pid}/stat").read_text()
            fields = _fields(raw)
            int(fields[2])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        yield pid, raw, fields


def _group_stats(pgid: int):
    """(pid, /proc/<pid>/stat fields after the command) of each live process of one process group (a server)."""
    for pid, _, fields in _stats():
        if int(fields[2]) == pgid:
            yield pid, fields


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) used so far by the live processes of one process group (a server)."""
    return sum(_cpu_s(f) for _, f in _group_stats(pgid))


def process_layout(pgid: int) -> list[dict[str, Any]]:
    """The processes of one server's process group: pid, command (as vLLM titles it), allowed CPUs, thread count."""
    procs = []
    for pid, _ in _group_stats(pgid):
        try:
            status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        procs.append({"pid": pid, "cmd": cmd[:100], "cpus_allowed": status.get("Cpus_allowed_list", "?").strip(),
                      "threads": int(status.get("Threads", "0").strip() or 0)})
    return procs


def group_thread_cpu_s(pgid: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of every thread of one server, summed per "process/thread" name: the
    process as vLLM titles it (its `comm`: API server, engine core, workers), the thread as `main` (the process's own
    thread) or its `comm` (OpenMP workers inherit the process's name; Python threads are named by their creator).
    Threads that ended are not counted, so take deltas over a span the threads outlive."""
    out: dict[str, float] = {}
    for pid, _ in _group_stats(pgid):
        try:
            proc = Path(f"/proc/{pid}/comm").read_text().strip()
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # gone meanwhile
        for tid in tids:
            try:
                raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            except OSError:
                continue
            name = "main" if int(tid) == pid else _comm(raw)
            key = f"{proc}/{name}"
            out[key] = out.get(key, 0.0) + _cpu_s(_fields(raw))
    return out


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Per-thread-name CPU seconds used between two `group_thread_cpu_s` readings (names that appeared count from 0)."""
    return {k: round(v - before.get(k, 0.0), 3) for k, v in sorted(after.items()) if v - before.get(k, 0.0) > 0}


def machine_cpu_s() -> dict[int, tuple[int, str, float]]:
    """pid -> (process group, command name, CPU seconds so far) of every live process on the machine."""
    return {pid: (int(fields[2]), _comm(raw), _cpu_s(fields)) for pid, raw, fields in _stats()}


def outside_cpu_s(before: dict[int, tuple[int, str, float]], after: dict[int, tuple[int, str, float]],
                  exclude_pgid: int, labels: dict[int, str], min_s: float = 0.05) -> dict[str, float]:
    """CPU seconds each process outside one server used between two `machine_cpu_s` readings, summed per label:
    `labels[pgid]/<command>` for known process groups (idle servers, the benchmark itself), `<command>` otherwise.
    What competed with the measured server for the cores; processes that ended in between are not counted, new ones
    count from 0. Labels below `min_s` are dropped."""
    out: dict[str, float] = {}
    for pid, (pgid, comm, cpu) in after.items():
        if pgid == exclude_pgid:
            continue
        prev = before.get(pid)
        used = cpu - (prev[2] if prev is not None and prev[1] == comm else 0.0)  # a reused pid counts from 0
        if used <= 0:
            continue
        key = f"{labels[pgid]}/{comm}" if pgid in labels else comm
        out[key] = out.get(key, 0.0) + used
    return {k: round(v, 2) for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v >= min_s}
