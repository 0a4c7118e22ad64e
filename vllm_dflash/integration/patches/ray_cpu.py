# SPDX-License-Identifier: Apache-2.0
"""Patch: `distributed_executor_backend="ray"` on the CPU platform selects our `RayCpuExecutor`
(integration/ray_cpu_executor.py) instead of vLLM's Ray executors, which refuse CPU."""
from __future__ import annotations

from vllm_dflash.integration.patches.base import Patch, acts
from vllm_dflash.utils import get_logger

logger = get_logger(__name__)

RAY_CPU_EXECUTOR = "vllm_dflash.integration.ray_cpu_executor.RayCpuExecutor"


def wants_ray_cpu(vllm_config) -> bool:
    """Backend "ray" (the string; a class or qualname is the user's choice) on the CPU platform."""
    from vllm.platforms import current_platform

    return vllm_config.parallel_config.distributed_executor_backend == "ray" and current_platform.is_cpu()


def apply() -> None:
    from vllm.v1.executor.abstract import Executor

    orig = Executor.__dict__["get_class"].__func__  # a staticmethod
    if getattr(orig, "_vllm_dflash_patched", False):
        return

    def get_class(vllm_config):
        if not (wants_ray_cpu(vllm_config) and acts("fix", vllm_config)):
            return orig(vllm_config)  # GPU and every other backend: vLLM's choice, untouched
        from vllm_dflash.integration.ray_cpu_executor import RayCpuExecutor  # imports ray: only when asked for

        if not getattr(get_class, "_logged", False):
            get_class._logged = True
            logger.info("vllm_dflash: distributed_executor_backend='ray' on CPU -> %s (vLLM's Ray executors "
                        "refuse the CPU platform)", RAY_CPU_EXECUTOR)
        return RayCpuExecutor

    get_class._vllm_dflash_patched = True
    Executor.get_class = staticmethod(get_class)


PATCH = Patch(
    symbol="vllm.v1.executor.abstract.Executor.get_class",
    why="vLLM's Ray executors refuse the CPU platform (CpuPlatform.ray_device_key is '': initialize_ray_cluster "
        "raises 'current platform cpu does not support ray.', bundles and actor resources are keyed by the "
        "device, and no rank gets its OpenMP core binding). For backend 'ray' on CPU we return RayCpuExecutor, "
        "a RayExecutorV2 with CPU bundles and per-rank OpenMP env (everything after start-up is vLLM's). It must "
        "be get_class: VllmConfig.__post_init__ asks it which executor runs (async-scheduling support) before the "
        "platform hook. GPU and every other backend: vLLM's own choice, untouched.",
    removal="when vLLM's Ray executor supports the CPU platform (a CPU ray_device_key and per-rank thread binding)",
    apply=apply,
    kind="fix",
)
