# SPDX-License-Identifier: Apache-2.0
"""Patch: our collector in the registry vLLM serves when PROMETHEUS_MULTIPROC_DIR is set."""
from __future__ import annotations

import sys

from vllm_dflash.integration.patches.base import Patch

_SERVING_MODULE = "vllm.entrypoints.serve.instrumentator.metrics"  # binds the function by name at import


def apply() -> None:
    from prometheus_client import REGISTRY
    from vllm.v1.metrics import prometheus

    orig = prometheus.get_prometheus_registry
    if getattr(orig, "_vllm_dflash_patched", False):
        return

    def get_prometheus_registry():
        registry = orig()
        if registry is not REGISTRY:  # a new multiprocess registry: our collector is only on the default one
            from vllm_dflash.serve.metrics import add_to_registry

            add_to_registry(registry)
        return registry

    get_prometheus_registry._vllm_dflash_patched = True
    prometheus.get_prometheus_registry = get_prometheus_registry
    serving = sys.modules.get(_SERVING_MODULE)
    if serving is not None and getattr(serving, "get_prometheus_registry", None) is orig:
        serving.get_prometheus_registry = get_prometheus_registry


PATCH = Patch(
    symbol="vllm.v1.metrics.prometheus.get_prometheus_registry",
    why="with PROMETHEUS_MULTIPROC_DIR set (--api-server-count > 1, or set by the user) vLLM serves /metrics from a "
        "new registry holding only its multiprocess collector, so our collector on the default registry was never "
        "scraped; the wrapper adds it (in a process that registered one: a DFlash engine's front end).",
    removal="when vLLM lets a plugin add collectors to the registry it serves",
    apply=apply,
)
