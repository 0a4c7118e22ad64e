# SPDX-License-Identifier: Apache-2.0
"""`Server.start` (serve/server.py): a port the class picked that another process bound first (the server's log says
"Address already in use") is picked again, once; a port the caller chose, or another start-up failure, is raised."""
import pytest

from vllm_dflash.serve.server import Server


def _fake(monkeypatch, srv, fail_with):
    calls = []

    def launch():
        srv.port = srv.port or 40000 + len(calls)
        calls.append(srv.port)
        if len(calls) == 1:
            open(srv.log_path, "w").write(f"...\n{fail_with}\n")
        return srv

    def wait_ready(timeout):
        if len(calls) == 1:
            raise RuntimeError("vllm serve exited with code 1 during start-up")
        return srv
    monkeypatch.setattr(srv, "launch", launch)
    monkeypatch.setattr(srv, "wait_ready", wait_ready)
    return calls


def test_a_taken_port_is_picked_again(tmp_path, monkeypatch):
    srv = Server("m", log_path=str(tmp_path / "serve.log"))
    calls = _fake(monkeypatch, srv, "OSError: [Errno 98] Address already in use")
    assert srv.start() is srv and calls == [40000, 40001] and srv.port == 40001


@pytest.mark.parametrize("port, log", [(8123, "OSError: [Errno 98] Address already in use"),
                                       (0, "ValueError: bad speculative config")])
def test_other_failures_are_raised(tmp_path, monkeypatch, port, log):
    srv = Server("m", port=port, log_path=str(tmp_path / "serve.log"))
    calls = _fake(monkeypatch, srv, log)
    with pytest.raises(RuntimeError, match="during start-up"):
        srv.start()
    assert len(calls) == 1
