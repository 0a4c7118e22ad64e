# SPDX-License-Identifier: Apache-2.0
"""`Server.ready` (serve/server.py), which `start`, `wait_ready` and the demo's parallel start all poll: a port
`launch` picked that another process bound first (the server's log says "Address already in use") is picked again
and the server relaunched, once; a port the caller chose, or another start-up failure, is raised."""
import sys
import time

import pytest

from vllm_dflash.serve.server import Server

TAKEN = "OSError: [Errno 98] Address already in use"


def _fake_serve(monkeypatch, srv, first_says):
    """The first launch prints `first_says` and exits 1; later ones run (and never answer /health)."""
    ports = []

    def command():
        ports.append(srv.port)
        if len(ports) == 1:
            return [sys.executable, "-c", f"import sys; print({first_says!r}); sys.exit(1)"]
        return [sys.executable, "-c", "import time; time.sleep(60)"]
    monkeypatch.setattr(srv, "command", command)
    return ports


def _poll(srv, ports, n, timeout=20.0):
    deadline = time.time() + timeout
    while len(ports) < n and time.time() < deadline:
        assert srv.ready() is False
        time.sleep(0.05)


def test_a_taken_port_is_picked_again_once(tmp_path, monkeypatch):
    srv = Server("m", log_path=str(tmp_path / "serve.log"))
    ports = _fake_serve(monkeypatch, srv, TAKEN)
    srv.launch()
    try:
        _poll(srv, ports, 2)
        assert len(ports) == 2 and srv.port == ports[1] and srv.proc.poll() is None  # relaunched, running
    finally:
        srv.stop()


@pytest.mark.parametrize("port, says", [(8123, TAKEN), (0, "ValueError: bad speculative config")])
def test_other_failures_are_raised(tmp_path, monkeypatch, port, says):
    srv = Server("m", port=port, log_path=str(tmp_path / "serve.log"))
    ports = _fake_serve(monkeypatch, srv, says)
    srv.launch()
    with pytest.raises(RuntimeError, match="during start-up"):
        _poll(srv, ports, 2)
    assert len(ports) == 1
