# SPDX-License-Identifier: Apache-2.0
"""bench/procs.py: a server's CPU time read from /proc, per process group and per process/thread name (Linux)."""
import subprocess
import sys
import time

import pytest

from vllm_dflash.bench.procs import cpu_delta, group_cpu_s, group_thread_cpu_s

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# a process group of its own: the main thread spins ~0.6 s of CPU, a second thread named "spinner" (its OS name, set
# through prctl) spins too, then both sleep so the test can read them while they are alive
CHILD = r"""
import ctypes, threading, time
def spin(s):
    while time.thread_time() < s:
        pass
def named():
    ctypes.CDLL(None).prctl(15, b"spinner", 0, 0, 0)  # PR_SET_NAME
    spin(0.4)
    time.sleep(30)
th = threading.Thread(target=named, daemon=True)
th.start()
spin(0.6)
print("ready", flush=True)
time.sleep(30)
"""


def test_thread_cpu_per_name_and_delta():
    """The spinning child's group: `<comm>/main` holds the main thread's ~0.6 s, `<comm>/spinner` the named thread's
    ~0.4 s; their sum matches the group total; a delta against an earlier reading keeps only what grew."""
    p = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        got = group_thread_cpu_s(p.pid)
        main = [k for k in got if k.endswith("/main")]
        spinner = [k for k in got if k.endswith("/spinner")]
        assert len(main) == 1 and len(spinner) == 1, got
        assert got[main[0]] >= 0.5 and got[spinner[0]] >= 0.3, got
        assert abs(sum(got.values()) - group_cpu_s(p.pid)) < 0.05, got
        earlier = {main[0]: got[main[0]] - 0.25, spinner[0]: got[spinner[0]]}
        assert cpu_delta(earlier, got) == {main[0]: pytest.approx(0.25, abs=1e-3)}
    finally:
        p.kill()
        p.wait()


def test_outside_cpu_names_the_competitor_and_skips_the_measured_server():
    """Two spinning children in groups of their own, named spin_a and spin_b: `outside_cpu_s` over a span charges
    spin_a (labelled "idle x") to `idle x/spin_a`, leaves out spin_b's excluded (measured) group, and a reading of a
    reused pid with another command counts from 0."""
    from vllm_dflash.bench.procs import machine_cpu_s, outside_cpu_s

    def child(name):
        code = (f"import ctypes, time\nctypes.CDLL(None).prctl(15, b'{name}', 0, 0, 0)\nt = time.thread_time()\n"
                "while time.thread_time() < t + 0.5: pass\nprint('ready', flush=True)\ntime.sleep(30)")
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                                start_new_session=True)

    before = machine_cpu_s()
    a, b = child("spin_a"), child("spin_b")
    try:
        assert a.stdout.readline().strip() == "ready" and b.stdout.readline().strip() == "ready"
        after = machine_cpu_s()
        assert after[a.pid][1] == "spin_a" and after[b.pid][2] >= 0.4
        got = outside_cpu_s(before, after, exclude_pgid=b.pid, labels={a.pid: "idle x"})
        assert got.get("idle x/spin_a", 0) >= 0.4, got
        assert not any("spin_b" in k for k in got), got
        reused = {a.pid: (a.pid, "other", after[a.pid][2])}  # same pid, another command: not a delta against it
        assert outside_cpu_s(reused, {a.pid: after[a.pid]}, exclude_pgid=-1, labels={}) == {
            "spin_a": round(after[a.pid][2], 2)}
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_outside_worst_picks_the_largest_share_of_the_machine():
    """The report's "other processes" line names the run with the largest outside CPU per wall second and core, not
    the largest total; runs without the record (older JSON) or that failed are skipped."""
    from vllm_dflash.bench.report import outside_worst

    runs = [{"ok": True, "wall_s": 100.0, "outside_cpu_s": {"x": 20.0}},  # 10 % of 2 cores
            {"ok": True, "wall_s": 10.0, "outside_cpu_s": {"idle a/w": 4.0, "y": 1.0}},  # 25 %
            {"ok": True, "wall_s": 5.0},  # no record
            {"ok": False, "wall_s": 1.0, "outside_cpu_s": {"z": 9.0}}]
    run, cpu, pct = outside_worst({"runs": runs, "meta": {"machine": {"cores": 2}}})
    assert run is runs[1] and cpu == 5.0 and pct == pytest.approx(25.0)
    assert outside_worst({"runs": runs[2:3], "meta": {"machine": {"cores": 2}}}) is None
