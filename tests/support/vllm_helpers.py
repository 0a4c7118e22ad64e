# SPDX-License-Identifier: Apache-2.0
"""Run vLLM configurations in a subprocess (clean plugin state) and read their results."""
import json
import os
import subprocess
import sys
from pathlib import Path

RUNNER = Path(__file__).with_name("vllm_run.py")
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


def run_vllm(runs: list[dict], env: dict | None = None, timeout: int = 1200) -> list[dict]:
    """Run each spec in order in ONE fresh process; return one result dict per run (+ "log" on the first)."""
    import tempfile

    full_env = {**os.environ, **BASE_ENV, **(env or {})}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(runs, f)
    try:
        proc = subprocess.run([sys.executable, str(RUNNER), f.name], env=full_env, capture_output=True,
                              text=True, timeout=timeout)
    finally:
        os.unlink(f.name)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise AssertionError(f"vLLM run failed (rc={proc.returncode}):\n{log[-8000:]}")
    results = [json.loads(l[len("RESULT "):]) for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert len(results) == len(runs), log[-4000:]
    for r in results:
        r["log"] = log
    return results


def counter(res: dict, name: str) -> float:
    v = res["metrics"].get(name)
    if isinstance(v, list):
        return float(sum(v))
    return float(v or 0)
