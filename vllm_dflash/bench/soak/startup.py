# SPDX-License-Identifier: Apache-2.0
"""Bad configurations for `vllm serve` with the soak's target: each must exit non-zero, before serving, with a
message that names the problem (checked against expected words).

  bad_json            --speculative-config that is not JSON
  missing_draft       draft folder that does not exist
  other_target        a copy of the soak's draft whose config.json claims a target with 2 more layers
  unsupported_block   a copy of the soak's draft with block_size 6 (supported: 4, 8, 16)

The two copies are built in a temporary folder (nothing from a source checkout is needed).

Two ways to run them. `exec`: each case is its own `vllm serve` process (~40 s each on a busy 2-core machine,
mostly `import vllm`). `fork` (the quick mode's default): one helper process imports vLLM's CLI once, then forks a
child per case that runs the `vllm` console script's own entry point (`vllm.entrypoints.cli.main:main`) with the
case's argv; the child's exit code and output are the CLI's. Same code path, one import for all cases.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from vllm_dflash.serve.server import vllm_executable

OTHER_TARGET_EXTRA_LAYERS = 2  # other_target: the copy claims a target this many layers deeper than the real one


def _edited_copy(draft: Path, tmp: Path, name: str, **changes: Any) -> Path:
    """A copy of the draft folder with `changes` written into its config.json."""
    d = tmp / name
    shutil.copytree(draft, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _block6_copy(draft: Path, tmp: Path) -> Path:
    return _edited_copy(draft, tmp, "draft-block6", block_size=6)


def _other_target_copy(draft: Path, tmp: Path) -> tuple[Path, int]:
    """A copy of the draft that claims another target (num_target_layers off by OTHER_TARGET_EXTRA_LAYERS; its
    target_layer_ids stay valid, so the target check is what rejects it). -> (folder, the layers it claims)."""
    layers = int(json.loads((draft / "config.json").read_text())["num_target_layers"]) + OTHER_TARGET_EXTRA_LAYERS
    return _edited_copy(draft, tmp, "draft-other-target", num_target_layers=layers), layers


def cases(draft: Path, tmp: Path) -> list[dict[str, Any]]:
    """name, the --speculative-config string, the words the output must contain (all of them)."""
    def spec(model: Path, k: int) -> str:
        return json.dumps({"method": "dflash", "model": str(model), "num_speculative_tokens": k})

    other, other_layers = _other_target_copy(draft, tmp)
    return [
        {"name": "bad_json", "spec": '{"method": "dflash", "model": ',
         "expect": ["--speculative-config", "cannot be converted"]},  # vLLM's argparse message
        {"name": "missing_draft", "spec": spec(tmp / "no-such-draft", 7),
         "expect": ["speculative_config.model", "does not exist", "Fix:"]},
        {"name": "other_target", "spec": spec(other, 7),  # vllm_dflash.config DFlashConfig.check_target's message
         "expect": ["num_target_layers", f"draft was built for a {other_layers}-layer target", "Fix:"]},
        {"name": "unsupported_block", "spec": spec(_block6_copy(draft, tmp), 5),
         "expect": ["block_size", "6 is not supported", "Fix:"]},
    ]


def _last_error_line(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "error:" in ln:
            return ln[:400]
    return lines[-1][:400] if lines else ""


def _run_one(target: Path, case: dict[str, Any], timeout: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    p = subprocess.Popen(vllm_executable() + _serve_argv(target, case), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env=_env(), start_new_session=True)
    try:
        output, _ = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # our own process group: the server and anything it spawned
        output, _ = p.communicate()
        rc, output = None, f"did not exit within {timeout:.0f}s\n" + (output or "")[-2000:]
    return _result(case, rc, output, time.perf_counter() - t0)


def _serve_argv(target: Path, case: dict[str, Any]) -> list[str]:
    return ["serve", str(target), "--host", "127.0.0.1", "--port", "0", "--max-model-len", "2048", "--enforce-eager",
            "--speculative-config", case["spec"]]


def _result(case: dict[str, Any], rc: int | None, output: str, seconds: float) -> dict[str, Any]:
    missing = [w for w in case["expect"] if w not in output]
    return {"name": case["name"], "exit_code": rc, "seconds": round(seconds, 1), "expect": case["expect"],
            "missing_words": missing, "message": _last_error_line(output), "ok": rc not in (0, None) and not missing}


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}


def _fork_runner(target: Path, todo: list[dict[str, Any]], timeout: float) -> list[dict[str, Any]]:
    """In the helper process: import the CLI once, then run each case in a forked child (its own session)."""
    import traceback

    import vllm.entrypoints.cli.main as cli
    import vllm.entrypoints.cli.serve  # noqa: F401  (the heavy imports, done once before forking)

    out = []
    for case in todo:
        log = tempfile.NamedTemporaryFile(prefix="soak-startup-", suffix=".log", delete=False)
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:  # child: the `vllm serve ...` command line
            os.setsid()
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            sys.argv = ["vllm"] + _serve_argv(target, case)
            code = 0
            try:
                cli.main()
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        rc = None
        while time.perf_counter() - t0 < timeout:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rc = os.waitstatus_to_exitcode(status)
                break
            time.sleep(0.2)
        if rc is None:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        output = Path(log.name).read_text(errors="replace")
        os.unlink(log.name)
        out.append(_result(case, rc, output if rc is not None else f"did not exit within {timeout:.0f}s\n" + output,
                           time.perf_counter() - t0))
    return out


def run_startup_suite(target: Path, draft: Path, mode: str = "fork", parallel: int = 1,
                      timeout: float = 300.0) -> list[dict[str, Any]]:
    """Run every bad configuration; one result dict per case (mode: fork | exec, see the module doc)."""
    with tempfile.TemporaryDirectory(prefix="soak-startup-") as tmp:
        todo = cases(draft, Path(tmp))
        if mode == "exec":
            with ThreadPoolExecutor(max_workers=max(1, parallel)) as ex:
                return list(ex.map(lambda c: _run_one(target, c, timeout), todo))
        spec_file = Path(tmp) / "cases.json"
        spec_file.write_text(json.dumps({"target": str(target), "cases": todo, "timeout": timeout}))
        runner = [sys.executable, "-m", "vllm_dflash.bench.soak.startup", "--fork-runner", str(spec_file)]
        p = subprocess.Popen(runner, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                             start_new_session=True)
        try:
            stdout, stderr = p.communicate(timeout=timeout * len(todo) + 120)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            stdout, stderr = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"start-up suite runner failed (exit {p.returncode}): {stderr[-2000:]}")
        return json.loads(stdout.strip().splitlines()[-1])


if __name__ == "__main__" and sys.argv[1:2] == ["--fork-runner"]:
    job = json.loads(Path(sys.argv[2]).read_text())
    res = _fork_runner(Path(job["target"]), job["cases"], job["timeout"])
    print(json.dumps(res), flush=True)
