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
from typing import Any, Iterable, Mapping

from vllm_dflash.serve.tau import parse_metrics
from vllm_dflash.utils import default_dtype


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# our entry point's name in vLLM's plugin groups (setup.py: vllm.general_plugins); VLLM_PLUGINS filters by this name
PLUGIN_NAME = "vllm_dflash"


def stock_env(installed: Iterable[str] | None = None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment that keeps vllm_dflash out of every process of a vLLM server or engine: stock vLLM as installed.

    vLLM loads only the plugins VLLM_PLUGINS names (vllm/plugins/__init__.py: a comma list; unset loads all, and an
    empty value names no plugin, so it loads none). The value lists every other installed vLLM plugin (any entry
    point in a `vllm.*` group), so plugins besides ours still load; a VLLM_PLUGINS already in the environment is kept,
    less ours. `installed`: the plugin names (default: the installed entry points)."""
    environ = os.environ if environ is None else environ
    if environ.get("VLLM_PLUGINS") is not None:
        names = [n for n in environ["VLLM_PLUGINS"].split(",") if n]
    elif installed is None:
        from importlib.metadata import distributions

        names = sorted({ep.name for d in distributions() for ep in d.entry_points if ep.group.startswith("vllm.")})
    else:
        names = sorted(set(installed))
    return {"VLLM_PLUGINS": ",".join(n for n in names if n != PLUGIN_NAME)}


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
    _picked_port: bool = False  # `launch` picked the port (the caller gave none)
    _relaunched: bool = False  # `ready` relaunched on a port that was taken

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
        """Launch the server and wait until /health answers (`launch` then `wait_ready`)."""
        self.launch()
        return self.wait_ready(timeout)

    def _port_was_taken(self) -> bool:
        """Did the last start-up fail because its port was in use (from the server's log)?"""
        try:
            return "Address already in use" in Path(self.log_path).read_text(errors="replace")[-4000:]
        except (OSError, TypeError):
            return False

    def launch(self) -> "Server":
        """Start `vllm serve` in its own process group and return at once (`ready()` / `wait_ready()` follow)."""
        self._picked_port = not self.port
        self.port = self.port or free_port()
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), **self.env}
        env = {k: v for k, v in env.items() if v is not None}
        self._log = open(self.log_path, "w") if self.log_path else None
        self.proc = subprocess.Popen(self.command(), env=env, stdout=self._log or subprocess.DEVNULL,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def ready(self) -> bool:
        """Whether the launched server answers /health; raises RuntimeError (server stopped) if it exited. A port
        `launch` picked (`port` 0) that another process bound before vLLM did (`free_port` releases it; the server's
        log says "Address already in use") is picked again and the server relaunched, once per Server."""
        if self.proc.poll() is not None:
            self.stop()  # closes the log file
            if self._picked_port and not self._relaunched and self._port_was_taken():
                self._relaunched, self.port = True, 0
                self.launch()
                return False
            raise RuntimeError(f"vllm serve exited with code {self.proc.returncode} during start-up"
                               + (f"; log: {self.log_path}" if self.log_path else ""))
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_ready(self, timeout: float = 300.0) -> "Server":
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.ready():
                return self
            time.sleep(1.0)
        self.stop()
        raise TimeoutError(f"vllm serve not healthy after {timeout:.0f}s")

    def pause(self) -> None:
        """SIGSTOP every process of the server (it uses no CPU until `resume`), e.g. while another one is measured."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)

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
            os.killpg(pgid, signal.SIGCONT)  # a paused server acts on the SIGTERM only once it runs again
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


# What a `vllm serve` log shows as it starts, in the order it happens (vLLM 0.32 log lines; the first phase is before
# any of them): the last phase whose line is in the log is where the start-up is.
START_PHASES = (
    ("starting processes", ()),
    ("starting the engine", ("Initializing a V1 LLM engine",)),
    ("loading weights", ("Starting to load model",)),
    ("compiling (torch.compile)", ("Warming up model for the compilation", "Dynamo bytecode transform")),
    ("warming up", ("saved AOT compiled function", "Directly load AOT compilation", "torch.compile took",
                    "Initial profiling/warmup run")),
    ("starting the API server", ("Warming up done", "init engine (profile, create kv cache, warmup model)")),
    ("ready", ("Application startup complete",)),
)


class StartWatcher:
    """Follows a starting server's log file: `poll()` -> the current start-up phase (START_PHASES), reading only what
    was appended since the last call. `cached`: whether vLLM loaded the compiled graph from its compile cache."""

    def __init__(self, log_path: str | Path):
        self.path = Path(log_path)
        self.phase = 0
        self.cached = False
        self._offset = 0
        self._tail = ""  # an unfinished last line, completed by the next read

    def poll(self) -> str:
        try:
            with open(self.path, errors="replace") as f:
                f.seek(self._offset)
                chunk = f.read()
                self._offset = f.tell()
        except FileNotFoundError:
            chunk = ""
        text, _, self._tail = (self._tail + chunk).rpartition("\n")
        for line in text.splitlines():
            self.cached |= "Directly load AOT compilation" in line
            for i in range(len(START_PHASES) - 1, self.phase, -1):
                if any(m in line for m in START_PHASES[i][1]):
                    self.phase = i
                    break
        return START_PHASES[self.phase][0]
