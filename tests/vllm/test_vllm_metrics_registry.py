# SPDX-License-Identifier: Apache-2.0
"""With PROMETHEUS_MULTIPROC_DIR set (`vllm serve --api-server-count` > 1, or set by the user) vLLM serves /metrics
from a new registry, not the default one our collector is on: the patched `get_prometheus_registry`
(integration/patches/prometheus_registry.py) adds our collector to it, through both names vLLM uses.

Regression (issue 51 item 9, review N-4): no vllm_dflash:* metric reached /metrics in that mode."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.vllm

CODE = textwrap.dedent('''
    import json
    from prometheus_client import generate_latest
    from vllm.plugins import load_general_plugins
    load_general_plugins()  # our plugin's hook (vLLM does this in every process)
    from vllm_dflash.integration import patches
    assert patches.activate() == []  # the patches, as configuring DFlash applies them (the walls)
    from vllm_dflash.serve import metrics as M
    M.register_collector()  # what a DFlash engine's front end does
    sink = M.MetricsSink.get()
    sink.labels = {"model_name": "m", "engine": "0"}  # what MetricsSink.get(vllm_config) stamps in an engine
    sink.inc("draft_steps", 3)
    sink.flush(force=True)
    from vllm.v1.metrics.prometheus import get_prometheus_registry, REGISTRY
    registry = get_prometheus_registry()
    from vllm.entrypoints.serve.instrumentator import metrics as served  # binds the name when imported
    print(json.dumps({"multiprocess": registry is not REGISTRY,
                      "module": generate_latest(registry).decode(),
                      "served": generate_latest(served.get_prometheus_registry()).decode()}))
''')


def test_our_metrics_are_in_the_multiprocess_registry(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DFLASH_", "VLLM_DFLASH_"))}
    env.update(PROMETHEUS_MULTIPROC_DIR=str(tmp_path), PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["multiprocess"], "PROMETHEUS_MULTIPROC_DIR set: vLLM should build its own registry"
    for where in ("module", "served"):
        assert 'vllm_dflash:draft_steps_total{engine="0",model_name="m"} 3.0' in res[where], (where, res[where][:2000])
