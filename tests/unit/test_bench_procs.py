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
