# SPDX-License-Identifier: Apache-2.0
"""The walls: installing vllm_dflash changes nothing in an engine that did not ask for our DFlash drafter (issue 52).

Every probe runs in a fresh process (the plugin's state is per process): vLLM's own plugin loading, then engine
configs built as `LLM(...)` / `vllm serve` build them. Engines that generate (bit-identical to stock vLLM, before and
after an engine with our drafter in the same process): tests/vllm/test_walls_one_process.py."""
import json
import os
import subprocess
import sys

import pytest
from support.vllm_helpers import BASE_ENV

pytestmark = pytest.mark.vllm

TARGET = "tests/assets/tiny-pair/target"
DRAFT = "tests/assets/tiny-pair/draft-b8"

_PROBE = r"""
import json, os, sys
BEFORE = {k for k in os.environ if k.startswith("DFLASH_")}  # the caller's: not the plugin's doing
from types import SimpleNamespace as NS
from vllm.plugins import load_general_plugins
from vllm.engine.arg_utils import EngineArgs
load_general_plugins()
import prometheus_client
from vllm_dflash.integration import patches
from vllm_dflash.serve.metrics import DFlashCollector

def state(cfg):
    return {"applies": [p.name for p in patches.PATCHES if p.applies(cfg)], "applied": patches._APPLIED,
            "collector": any(isinstance(c, DFlashCollector) for c in prometheus_client.REGISTRY._collector_to_names),
            "env": sorted(k for k, v in os.environ.items() if k.startswith("DFLASH_") and v and k not in BEFORE)}

out = {}
build = lambda spec: EngineArgs(model=sys.argv[1], dtype="float32", max_model_len=256,
                                speculative_config=spec).create_engine_config()
out["none"] = state(build(None))
ngram = build({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})
out["ngram"] = state(ngram)
# an EAGLE-style engine (its config as the runner sees it; an EAGLE checkpoint is not needed for the decision)
out["eagle"] = state(NS(speculative_config=NS(method="eagle3"), additional_config=None))
out["vllm_dflash_drafter"] = state(NS(speculative_config=NS(method="dflash"),
                                      additional_config={"dflash": {"drafter": "vllm"}}))
if len(sys.argv) > 2:  # the bad values would (rightly) stop a DFlash engine: cleared first
    for k in [k for k in os.environ if k.startswith("DFLASH_") and k != "DFLASH_VLLM_EXTRAS"]:
        del os.environ[k]
    dflash = build({"method": "dflash", "model": sys.argv[2]})
    out["dflash"] = state(dflash)
    # the marker in the environment of the engine core process each engine starts (vLLM's own process manager; the
    # engine core's body replaced by a report of what it inherited; forked, not spawned as vLLM does on CPU: the same
    # environment, without a second vLLM import)
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
    import tempfile
    from vllm.v1.engine.core import EngineCoreProc
    from vllm.v1.engine.utils import CoreEngineProcManager
    from vllm.v1.executor.abstract import Executor
    seen = tempfile.mkdtemp()

    def report(*args, **kwargs):
        with open(os.path.join(seen, str(os.getpid())), "w") as f:
            f.write(json.dumps(os.environ.get("DFLASH_PLUGIN_ACTIVE")))

    EngineCoreProc.run_engine_core = staticmethod(report)
    out["engine_core_marker"] = {}
    for name, cfg in (("dflash", dflash), ("ngram", ngram)):
        m = CoreEngineProcManager(local_engine_count=1, start_index=0, local_start_index=0, vllm_config=cfg,
                                  local_client=True, handshake_address="ipc:///tmp/unused", log_stats=False,
                                  executor_class=Executor.get_class(cfg))
        m.processes[0].join(60)
        with open(os.path.join(seen, str(m.processes[0].pid))) as f:
            out["engine_core_marker"][name] = json.load(f)
    out["marker_after"] = os.environ.get("DFLASH_PLUGIN_ACTIVE")
print("PROBE " + json.dumps(out))
"""


def _probe(env: dict, dflash: bool = False) -> tuple[dict, str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("DFLASH_", "VLLM_DFLASH_"))}
    full.update(BASE_ENV)
    full.update(env)
    args = [sys.executable, "-c", _PROBE, TARGET] + ([DRAFT] if dflash else [])
    proc = subprocess.run(args, env=full, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE "))
    return json.loads(line[len("PROBE "):]), proc.stdout + proc.stderr


def test_no_patch_without_dflash_then_all_with_it():
    """No speculation, n-gram, an EAGLE-style config and vLLM's own DFlash drafter: no patch applies, the seam check
    never ran (no patch even installed), no collector is registered, no DFLASH_* variable is set, even with bad
    DFLASH_* values in the environment (warned about, never fatal), and the plugin logs one line saying it is
    inactive. Then a config for our drafter in the same process applies every patch, registers the collector and
    sets the metrics folder. The process marker reaches the engine core process our engine starts, and no other: not
    the front end after that start, not the engine core of an n-gram engine started later by the same process."""
    bad = {"DFLASH_ADAPTIVE": "bogus", "DFLASH_CPU_GEMM_F32": "bogus", "DFLASH_OVERLAP": "bogus",
           "DFLASH_LOG_LEVEL": "bogus", "DFLASH_VLLM_EXTRAS": "bogus"}
    out, log = _probe(bad, dflash=True)
    for name in ("none", "ngram", "eagle", "vllm_dflash_drafter"):
        assert out[name] == {"applies": [], "applied": False, "collector": False, "env": []}, (name, out[name])
    assert log.count("vllm_dflash: inactive for this engine") == 1, log[-4000:]
    assert "DFLASH_VLLM_EXTRAS" in log and "read as off" in log
    d = out["dflash"]
    from vllm_dflash.integration.patches import PATCHES

    assert d["applied"] and d["collector"] and d["applies"] == [p.name for p in PATCHES], d
    assert d["env"] == ["DFLASH_METRICS_DIR"], d
    assert "vllm_dflash: DFlash engine (our drafter): patches active: generator_rewind, drafter_class" in log
    assert out["engine_core_marker"] == {"dflash": "1", "ngram": None} and out["marker_after"] is None, out


@pytest.mark.parametrize("level", ["fixes", "all"])
def test_opt_in_applies_the_patches_to_every_engine(level):
    """DFLASH_VLLM_EXTRAS=fixes: our vLLM bug fixes act in engines without our drafter; all: the CPU speed-ups too.
    The DFlash-only patches (drafter, settings, metrics, scheduling) and the collector stay out."""
    from vllm_dflash.integration.patches import PATCHES

    out, log = _probe({"DFLASH_VLLM_EXTRAS": level})
    kinds = ("fix",) if level == "fixes" else ("fix", "speedup")
    want = [p.name for p in PATCHES if p.kind in kinds]
    assert {"generator_rewind", "lora_prompt_logprobs", "cpu_expand_kernel", "ray_cpu", "cpu_omp_threads"} <= set(want)
    for name in ("none", "ngram", "eagle"):
        assert out[name]["applies"] == want and out[name]["applied"], (name, out[name])
        assert not out[name]["collector"] and out[name]["env"] == [], out[name]
    assert f"DFLASH_VLLM_EXTRAS={level}: patches active: {', '.join(want)}" in log
