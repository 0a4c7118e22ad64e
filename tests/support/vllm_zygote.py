# SPDX-License-Identifier: Apache-2.0
"""A process that imports vLLM once and forks one child per run_vllm call (tests/support/vllm_helpers.py).

Importing vLLM costs about 13 s of CPU on these 2-core machines, more than building a tiny engine; the vLLM tier
starts dozens of fresh processes. A child forked from this process starts with vLLM imported and nothing else: no
engine was ever built here, no plugin was loaded (vLLM loads plugins when an engine is configured, not at import),
and the child gets the exact environment, working directory and output files a fresh `python vllm_run.py` would
get. What a fork cannot give is what libraries read once at load time (OpenMP's OMP_* / GOMP_* / KMP_*, LD_PRELOAD,
torch's and Inductor's own settings): run_vllm starts a fresh process for a run that sets any of those, or that
builds a multi-process or compiled engine (needs_fresh_process).

Protocol: one JSON request per line on stdin ({"args": [...], "env": {...}, "cwd": ..., "stdout": ..., "stderr": ...});
one JSON reply per line on the reply pipe: {"pid": N} when the child starts, then {"pid": N, "rc": R} when it ends.
The child leads its own session, so the caller can kill a timed-out run with everything it started."""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

# Keys that a library reads once when it is loaded (or that shape how a run's processes are made): a run setting one
# of these gets a fresh interpreter, not a fork of this one.
FRESH_PREFIXES = ("OMP_", "GOMP_", "KMP_", "LD_", "MALLOC_", "TORCH", "PYTHON", "HF_")  # HF_*: huggingface_hub reads
# its settings (HF_HUB_OFFLINE, HF_HOME, ...) once, at import
FRESH_KEYS = ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_WORKER_MULTIPROC_METHOD", "VLLM_CONFIGURE_LOGGING",
              "VLLM_LOGGING_LEVEL", "VLLM_LOGGING_CONFIG_PATH", "VLLM_LOGGING_PREFIX")


def load_time(env: dict[str, str]) -> dict[str, str]:
    """The variables of `env` that libraries read once, at load time."""
    return {k: v for k, v in env.items() if k.startswith(FRESH_PREFIXES) or k in FRESH_KEYS}


def needs_fresh_process(runs: list[dict], env: dict[str, str], zygote_env: dict[str, str]) -> bool:
    """True when a run must not be forked from the zygote: its environment (`env`, the whole of it) differs from the
    zygote's in a load-time variable, or it builds a multi-process or compiled engine (its processes and Inductor's
    workers would be forks of a fork)."""
    if load_time(env) != load_time(zygote_env):
        return True
    for spec in runs:
        kw = spec.get("llm_kwargs", {})
        if kw.get("enforce_eager") is False or kw.get("distributed_executor_backend"):
            return True
        if kw.get("tensor_parallel_size", 1) > 1:
            return True
        if load_time(spec.get("env", {})):
            return True
    return False


def _child(req: dict) -> None:
    """In the forked child: become the fresh process the request describes, run vllm_run.main, exit."""
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, fd)
            os.close(out)
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        sys.argv = list(req["args"])
        import vllm_run  # tests/support/vllm_run.py, on sys.path below

        vllm_run.main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported in the run's stderr, as a fresh process would
        traceback.print_exc()
    finally:
        import atexit

        atexit._run_exitfuncs()  # what a fresh interpreter runs at exit (vLLM's and torch's hooks)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    reply = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from vllm import LLM, SamplingParams  # noqa: F401 - the import every child is spared
    from vllm.inputs import TokensPrompt  # noqa: F401

    assert not any(m == "vllm_dflash" or m.startswith("vllm_dflash.") for m in sys.modules), \
        "the zygote must not load the plugin: children decide by their own environment"
    reply.write(json.dumps({"ready": os.getpid()}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            reply.close()
            _child(req)
        reply.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        reply.write(json.dumps({"pid": pid, "rc": os.waitstatus_to_exitcode(status)}) + "\n")


if __name__ == "__main__":
    main()
