# SPDX-License-Identifier: Apache-2.0
"""Start / stop a real `vllm serve` on loopback, drive it with the OpenAI client, scrape `/metrics`.

Shared by the demo (main job), the serving benchmark, the soak test and the server tests."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_dflash.serve.tau import parse_metrics
from vllm_dflash.utils import default_dtype


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_executable() -> list[str]:
    exe = Path(sys.executable).with_name("vllm")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "vllm.entrypoints.cli.main"]


@dataclass
class Server:
    model: str
    speculative_config: dict[str, Any] | None = None
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str | None] = field(default_factory=dict)  # None: remove the variable from the server's env
    port: int = 0
    max_model_len: int = 2048
    log_path: str | None = None
    dtype: str | None = None  # None: default_dtype()
    enforce_eager: bool = True  # False: vLLM's default (torch.compile; ~85 s more start-up on 2 cores, faster steps)
    proc: subprocess.Popen | None = None
    _log: Any = None  # the open log file (closed by stop())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = vllm_executable() + ["serve", self.model, "--host", "127.0.0.1", "--port", str(self.port),
                                   "--dtype", self.dtype or default_dtype(), "--max-model-len", str(self.max_model_len),
                                   "--served-model-name", "target"] + (["--enforce-eager"] if self.enforce_eager else [])
        if self.speculative_config:
            cmd += ["--speculative-config", json.dumps(self.speculative_config)]
        return cmd + list(self.extra_args)

    def start(self, timeout: float = 300.0) -> "Server":
        self.port = self.port or free_port()
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), **self.env}
        env = {k: v for k, v in env.items() if v is not None}
        self._log = open(self.log_path, "w") if self.log_path else None
        self.proc = subprocess.Popen(self.command(), env=env, stdout=self._log or subprocess.DEVNULL,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.stop()  # closes the log file
                raise RuntimeError(f"vllm serve exited with code {self.proc.returncode} during start-up"
                                   + (f"; log: {self.log_path}" if self.log_path else ""))
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(1.0)
        self.stop()
        raise TimeoutError(f"vllm serve not healthy after {timeout:.0f}s")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the server's process group, wait for every process in it, SIGKILL what remains."""
        if self.proc is None:
            return
        try:
            self._terminate_group(timeout)
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None

    def _terminate_group(self, timeout: float) -> None:
        pgid = self.proc.pid
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.proc.poll()
            try:
                os.killpg(pgid, 0)  # any process of the group left?
            except ProcessLookupError:
                return
            time.sleep(0.2)
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)

    def __enter__(self) -> "Server":
        """Starts the server unless `start()` already did (`with Server(...).start(timeout=...) as srv:`)."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return r.read().decode()

    def metrics(self) -> dict[str, float]:
        return parse_metrics(self.metrics_text())

    def reset_prefix_cache(self, attempts: int = 10) -> None:
        """Empty the server's prefix cache (vLLM's POST /reset_prefix_cache, served when the server runs with
        VLLM_SERVER_DEV_MODE=1). vLLM refuses while blocks are still held (success false): retried briefly."""
        for _ in range(attempts):
            req = urllib.request.Request(self.url + "/reset_prefix_cache", data=b"", method="POST")
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    if json.loads(r.read().decode() or "{}").get("success", True):
                        return
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    raise RuntimeError("the server has no /reset_prefix_cache. Fix: start it with "
                                       "VLLM_SERVER_DEV_MODE=1 in its environment") from None
                raise
            time.sleep(0.5)
        raise RuntimeError(f"vllm serve refused to reset its prefix cache {attempts} times (blocks still held)")
