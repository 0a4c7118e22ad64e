# SPDX-License-Identifier: Apache-2.0
"""The metrics folder belongs to one server: snapshots are written without following links, a collector merges only
its own server's snapshots, dead servers' leftovers are pruned at start-up, and a server started by a process that
loaded the plugin (it inherits DFLASH_METRICS_DIR) gets a folder of its own.

Regressions (issue 51 item 9; review L-1, M-2, M-3): the snapshot was written through `proc-<pid>.tmp`, following a
link planted there; a folder shared by two live servers (a fixed DFLASH_METRICS_DIR) summed both servers' counters,
and files with no pid or from another host were merged forever; a child `vllm serve` merged its counters with its
parent's, and lost its folder when the parent exited (the parent removed it)."""
import json
import os
import subprocess
import sys
import textwrap
import time

from prometheus_client import CollectorRegistry, generate_latest

from vllm_dflash.serve import metrics as M
from vllm_dflash.serve import snapshots as S
from vllm_dflash.serve.tau import parse_metrics


def _draft_steps(directory) -> float:
    registry = CollectorRegistry()
    registry.register(M.DFlashCollector(directory))
    return parse_metrics(generate_latest(registry).decode())["vllm_dflash:draft_steps_total"]


def _sink(monkeypatch, directory, steps: float) -> M.MetricsSink:
    monkeypatch.setenv(M.ENV_DIR, str(directory))
    sink = M.MetricsSink()
    sink.inc("draft_steps", steps)
    sink.flush(force=True)
    return sink


def test_the_snapshot_write_follows_no_link(tmp_path, monkeypatch):
    """Links planted at the old temporary name and at the snapshot's own name: the files they point to are unchanged,
    and the snapshot is a regular file."""
    monkeypatch.setenv(M.ENV_DIR, str(tmp_path))  # a folder the user set
    d = M.ensure_metrics_dir()
    victim, victim2 = tmp_path / "victim", tmp_path / "victim2"
    victim.write_text("keep")
    victim2.write_text("keep too")
    os.symlink(victim, d / f"proc-{os.getpid()}.tmp")
    os.symlink(victim2, d / f"proc-{os.getpid()}.json")
    sink = _sink(monkeypatch, d, 3)
    assert victim.read_text() == "keep" and victim2.read_text() == "keep too"
    assert not sink.path.is_symlink() and json.loads(sink.path.read_text())["counters"]["draft_steps"] == 3
    assert not list(d.glob("*.tmp*")) or all(p.is_symlink() for p in d.glob("*.tmp*"))


def test_a_collector_merges_only_its_own_servers_snapshots(tmp_path, monkeypatch):
    """Two servers in one user-set folder, plus planted snapshots in the first's folder: no server id, another
    server's id from a live process (pid 1), another host. Each collector counts its own server's writer only."""
    monkeypatch.setenv(M.ENV_DIR, str(tmp_path))  # a folder the user set, for both servers
    a = M.ensure_metrics_dir()
    monkeypatch.setenv(M.ENV_DIR, str(tmp_path))
    b = M.ensure_metrics_dir()
    assert a.parent == b.parent == tmp_path and a != b and (a.stat().st_mode & 0o777) == 0o700
    _sink(monkeypatch, a, 5)
    _sink(monkeypatch, b, 7)
    planted = {"no_id": {"pid": 1, "host": S.HOST},
               "other_server_live_pid": {"pid": 1, "host": S.HOST, "server": b.name},
               "other_host": {"pid": 1, "host": S.HOST + "-elsewhere", "server": a.name}}
    for i, (name, meta) in enumerate(planted.items()):
        (a / f"proc-9{i}.json").write_text(json.dumps({"counters": {"draft_steps": 1000.0}, "time": 1.0, **meta}))
    assert _draft_steps(a) == 5 and _draft_steps(b) == 7


def test_dead_servers_and_stale_files_are_pruned_at_start(tmp_path, monkeypatch):
    """A new server in a user-set folder removes: the folder of a server whose owner exited, an owner file from
    another host older than STALE_S, old-layout snapshots of an exited writer or with no pid older than STALE_S. It
    keeps a live server's folder (this process owns it) and a recent file it cannot check."""
    code = ("import sys; from vllm_dflash.serve import snapshots as S; d = S.new_server_dir(sys.argv[1]); "
            "import atexit; atexit.unregister(__import__('shutil').rmtree); print(d)")
    dead = subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, capture_output=True,
                          text=True).stdout.strip()
    live = S.new_server_dir(str(tmp_path))
    other_host = tmp_path / (M.SERVER_PREFIX + "elsewhere")
    other_host.mkdir()
    (other_host / M.OWNER_FILE).write_text(json.dumps({"server": other_host.name, "pid": 1, "host": "elsewhere"}))
    old = time.time() - 2 * M.STALE_S
    os.utime(other_host / M.OWNER_FILE, (old, old))
    (tmp_path / "proc-1.json").write_text(json.dumps({"counters": {}}))  # no pid, no id: unknown writer
    os.utime(tmp_path / "proc-1.json", (old, old))
    (tmp_path / "proc-2.json").write_text(json.dumps({"counters": {}}))  # the same, recent
    S.new_server_dir(str(tmp_path))
    assert not os.path.exists(dead) and not other_host.exists() and not (tmp_path / "proc-1.json").exists()
    assert live.is_dir() and (tmp_path / "proc-2.json").exists()


PARENT = textwrap.dedent('''
    import json, subprocess, sys
    from prometheus_client import REGISTRY, generate_latest
    from vllm_dflash.serve import metrics as M
    from vllm_dflash.serve.tau import parse_metrics

    def steps():
        return parse_metrics(generate_latest(REGISTRY).decode())["vllm_dflash:draft_steps_total"]

    role, out, go = sys.argv[1:4]
    M.register_collector()
    folder = M.ensure_metrics_dir()  # the collector's
    s = M.MetricsSink.get()
    s.inc("draft_steps", 5 if role == "parent" else 7)
    s.flush(force=True)
    if role == "parent":  # a server started the way a launcher starts one: a new interpreter, the environment kept
        child = subprocess.Popen([sys.executable, __file__, "child", out + ".child", go])
        import time, os
        while not os.path.exists(out + ".child"):
            time.sleep(0.05)
        time.sleep(0.2)
        open(out, "w").write(json.dumps({"dir": str(folder), "steps": steps(), "child_pid": child.pid}))
    else:
        import os, time
        first = steps()
        open(out + ".tmp", "w").write(json.dumps({"dir": str(folder), "steps": first}))
        os.replace(out + ".tmp", out)
        while not os.path.exists(go):  # until the parent has exited
            time.sleep(0.05)
        s.inc("draft_steps", 1)
        s.flush(force=True)
        open(out + ".after.tmp", "w").write(json.dumps({"exists": folder.is_dir(), "steps": steps()}))
        os.replace(out + ".after.tmp", out + ".after")  # whole or absent: the test polls for it
''')


def test_a_server_started_by_a_plugin_loaded_process_keeps_its_own_metrics(tmp_path, monkeypatch):
    """The review's M-3 probe: a process that registered the collector starts another server (new interpreter,
    inherited environment). Each counts its own steps only, in its own folder, and the child's folder and metrics
    survive the parent's exit."""
    monkeypatch.delenv(M.ENV_DIR, raising=False)
    script, out, go = tmp_path / "server.py", tmp_path / "parent.json", tmp_path / "go"
    script.write_text(PARENT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        subprocess.run([sys.executable, str(script), "parent", str(out), str(go)], check=True, env=env, timeout=60)
        parent = json.loads(out.read_text())
        child = json.loads((tmp_path / "parent.json.child").read_text())
        assert parent["steps"] == 5 and child["steps"] == 7, (parent, child)
        assert parent["dir"] != child["dir"] and not child["dir"].startswith(parent["dir"] + os.sep)
        assert not os.path.exists(parent["dir"]), "the parent's folder outlived it"
    finally:
        go.write_text("")  # the child stops in every case
    deadline = time.monotonic() + 30
    while not (tmp_path / "parent.json.child.after").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    after = json.loads((tmp_path / "parent.json.child.after").read_text())
    assert after == {"exists": True, "steps": 8}, after
