# SPDX-License-Identifier: Apache-2.0
"""Run vLLM configurations in a subprocess (clean plugin state) and read their results."""
import json
import os
import subprocess
import sys
from pathlib import Path

RUNNER = Path(__file__).with_name("vllm_run.py")
ZYGOTE = Path(__file__).with_name("vllm_zygote.py")
BASE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


def linear_probe(ours_attr: str) -> str:
    """An `after` snippet for run_vllm: the names of the target's layers with a `cpu_linear`, sorted into `ours` (the
    layer carries our patch's attribute `ours_attr`), `onednn` (vLLM's oneDNN lambda) and `other`."""
    return f"""
model = llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
ours, onednn, other = [], [], []
for name, m in model.named_modules():
    f = getattr(m, "cpu_linear", None)
    if f is None:
        continue
    if hasattr(m, {ours_attr!r}):
        ours.append(name)
    elif "onednn_mm" in getattr(getattr(f, "__code__", None), "co_names", ()):
        onednn.append(name)
    else:
        other.append(name)
probe.update(ours=ours, onednn=onednn, other=other)
"""


class _Zygote:
    """This process's vLLM zygote (tests/support/vllm_zygote.py): started at the first forked run with `env` (this
    process's environment plus BASE_ENV); ended with the process."""

    def __init__(self, env: dict[str, str]) -> None:
        import atexit

        self.env = env
        r, w = os.pipe()
        self.proc = subprocess.Popen([sys.executable, str(ZYGOTE), str(w)], env=self.env, stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(w,), text=True)
        os.close(w)
        self.replies = os.fdopen(r, "r")
        atexit.register(self.close)
        first = self._reply(timeout=300)
        assert "ready" in first, first

    def _reply(self, timeout: float) -> dict:
        import select

        if not select.select([self.replies], [], [], timeout)[0]:
            raise TimeoutError
        line = self.replies.readline()
        if not line:
            raise RuntimeError(f"the vLLM zygote died (exit {self.proc.poll()})")
        return json.loads(line)

    def run(self, args: list[str], env: dict, stdout: str, stderr: str, timeout: float) -> int:
        import signal

        self.proc.stdin.write(json.dumps({"args": args, "env": env, "cwd": os.getcwd(), "stdout": stdout,
                                          "stderr": stderr}) + "\n")
        self.proc.stdin.flush()
        pid = self._reply(timeout=60)["pid"]
        try:
            return self._reply(timeout=timeout)["rc"]
        except TimeoutError:
            os.killpg(pid, signal.SIGKILL)  # the child leads its own session: it and whatever it started
            self._reply(timeout=60)
            raise subprocess.TimeoutExpired(args, timeout) from None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


_ZYGOTE: _Zygote | None = None


def run_vllm(runs: list[dict], env: dict | None = None, timeout: int = 1200) -> list[dict]:
    """Run each spec in order in ONE fresh process; return one result dict per run (+ "log" on the first).

    The process is a fork of a zygote that has imported vLLM (tests/support/vllm_zygote.py: the same environment,
    the import spared) unless the run sets a variable libraries read at load time or builds a multi-process or
    compiled engine (then a new interpreter); DFLASH_TEST_ZYGOTE=0 always starts a new interpreter."""
    global _ZYGOTE
    import tempfile

    from .vllm_zygote import load_time, needs_fresh_process

    base = {**os.environ, **BASE_ENV}
    full_env = {**base, **(env or {})}
    with tempfile.TemporaryDirectory() as tmp:
        spec_file, out, err = (str(Path(tmp) / n) for n in ("runs.json", "stdout", "stderr"))
        Path(spec_file).write_text(json.dumps(runs))
        fresh = os.environ.get("DFLASH_TEST_ZYGOTE", "1") == "0" or needs_fresh_process(runs, full_env, base)
        if fresh:
            proc = subprocess.run([sys.executable, str(RUNNER), spec_file], env=full_env, capture_output=True,
                                  text=True, timeout=timeout)
            rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        else:
            # a new zygote when this process's own load-time settings changed since it started (an in-process
            # `import vllm` sets TORCHINDUCTOR_* variables, say): its children must match a fresh process
            if _ZYGOTE is None or _ZYGOTE.proc.poll() is not None or load_time(_ZYGOTE.env) != load_time(base):
                if _ZYGOTE is not None:
                    _ZYGOTE.close()
                _ZYGOTE = _Zygote(base)
            rc = _ZYGOTE.run([str(RUNNER), spec_file], full_env, out, err, timeout)
            stdout, stderr = Path(out).read_text(errors="replace"), Path(err).read_text(errors="replace")
    log = stdout + stderr
    if rc != 0:
        raise AssertionError(f"vLLM run failed (rc={rc}):\n{log[-8000:]}")
    results = [json.loads(l[len("RESULT "):]) for l in stdout.splitlines() if l.startswith("RESULT ")]
    assert len(results) == len(runs), log[-4000:]
    for r in results:
        r["log"] = log
    return results


def counter(res: dict, name: str) -> float:
    v = res["metrics"].get(name)
    if isinstance(v, list):
        return float(sum(v))
    return float(v or 0)
