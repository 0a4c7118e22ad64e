# SPDX-License-Identifier: Apache-2.0
"""Patch: on CPU with one worker, the engine core runs the model itself (vLLM's `uni` executor), as vLLM does on
GPUs, instead of the separate worker process vLLM 0.32 forces on CPU.

Why: with a worker process, every engine step crosses two processes through vLLM's shared-memory queues, whose
readers spin (`sched_yield`) for a second after each read. On a machine with few cores the engine core's spin runs on
the cores the worker's OpenMP threads compute on, and every step waits for the hand-off. Measured on a 2-core Xeon
(compiled bf16, both cores to the model, SmolLM2-135M, batch 1): `vllm serve` without speculation generated 31 tok/s
with vLLM's worker process and 56 tok/s with the model in the engine core (a target forward 22.7 -> 13.7 ms);
offline, 37 against 53 tok/s (dev/LOG.md, session 22).

What the patch does:
- `CpuPlatform.check_and_update_config` (wrapped): when vLLM had chosen `uni` (its default for one worker, or the
  user's `--distributed-executor-backend uni`) and the CPU hook replaced it with `mp`, `uni` is put back, provided
  the world size is 1, V1 multiprocessing is on (the engine core is its own process; with it off vLLM keeps `uni`
  itself) and scheduling is synchronous (overlap needs the worker in another process to overlap with). An explicit
  `--distributed-executor-backend mp` is vLLM's CPU layout, untouched.
- `UniProcExecutor._init_executor` (wrapped): in such an engine core, before the worker is built, the process gets
  the OpenMP layout vLLM's multiprocess executor would give its worker for local rank 0 (`OMPProcessManager`, from
  `VLLM_CPU_OMP_THREADS_BIND`: its CPU list as the main thread's affinity, the list's length as torch's thread
  count); `nobind` leaves the threads alone, as vLLM does.
"""
from __future__ import annotations

import functools
import os

from vllm_dflash.integration.patches.base import Patch, acts, acts_for
from vllm_dflash.utils import get_logger

logger = get_logger(__name__)


def multiprocessing_on() -> bool:
    """vLLM V1 runs the engine core in its own process (VLLM_ENABLE_V1_MULTIPROCESSING, on unless "0")."""
    return os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "1"


def keep_uniproc(vllm_config, vllm_chose: str | None) -> bool:
    """Put `uni` back after the CPU hook: vLLM had chosen `uni` (`vllm_chose`, its default for one worker or the
    user's flag), the hook replaced it with `mp`, one worker, multiprocessing on, synchronous scheduling."""
    parallel = vllm_config.parallel_config
    return (vllm_chose == "uni" and parallel.distributed_executor_backend == "mp" and parallel.world_size == 1
            and multiprocessing_on() and not vllm_config.scheduler_config.async_scheduling)


def omp_layout(vllm_config) -> list[int] | None:
    """The CPUs vLLM's multiprocess executor would bind its local-rank-0 worker's OpenMP threads to (None: `nobind`,
    leave the threads alone)."""
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    manager = OMPProcessManager(vllm_config)
    if manager.skip_setup or not manager.cpu_lists:
        return None
    return [int(c) for c in manager.cpu_lists[0]]


def apply_omp_layout(vllm_config) -> list[int] | None:
    """Give this process (the engine core, before its worker exists) the worker's OpenMP layout: the main thread's
    affinity (threads started later inherit it) and torch's thread count. Returns the CPUs (None: left alone)."""
    import torch

    cpus = omp_layout(vllm_config)
    if cpus is None:
        return None
    os.sched_setaffinity(0, cpus)  # this thread: the engine core's main thread, which runs the model
    torch._C.set_num_threads(len(cpus))  # vLLM's CPUWorker later replaces torch.set_num_threads with a no-op
    return cpus


def apply() -> None:
    from vllm.platforms import cpu
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    platform = cpu.CpuPlatform
    hook = platform.check_and_update_config.__func__
    if getattr(hook, "_vllm_dflash_uniproc", False):
        return

    @functools.wraps(hook)
    def check_and_update_config(cls, vllm_config) -> None:
        chose = vllm_config.parallel_config.distributed_executor_backend
        hook(cls, vllm_config)  # replaces "uni" with "mp" when multiprocessing is on
        if keep_uniproc(vllm_config, chose) and acts("speedup", vllm_config):
            vllm_config.parallel_config.distributed_executor_backend = "uni"
            logger.info("vllm_dflash: the engine core runs the model itself on CPU (executor 'uni'; "
                        "--distributed-executor-backend mp restores vLLM's worker process)")

    check_and_update_config._vllm_dflash_uniproc = True
    platform.check_and_update_config = classmethod(check_and_update_config)

    init = UniProcExecutor._init_executor

    @functools.wraps(init)
    def _init_executor(self) -> None:
        from vllm.platforms import current_platform

        # an engine core process that runs the model (backend `uni` kept by the hook above)
        if current_platform.is_cpu() and multiprocessing_on() and acts_for(self, "speedup"):
            cpus = apply_omp_layout(self.vllm_config)
            if cpus is not None:
                logger.info("vllm_dflash: engine core with the model: OpenMP threads on CPUs %s", cpus)
        init(self)

    UniProcExecutor._init_executor = _init_executor


PATCH = Patch(
    symbol="vllm.v1.executor.uniproc_executor.UniProcExecutor._init_executor (and "
           "vllm.platforms.cpu.CpuPlatform.check_and_update_config, for the executor choice)",
    why="vLLM 0.32 replaces the `uni` executor with a worker process on CPU. Its shared-memory hand-off spins on "
        "the cores the model computes on: on 2 cores a served batch-1 step took 1.7x as long as with the model in "
        "the engine core. We keep `uni` for one worker with synchronous scheduling, with the OpenMP layout vLLM "
        "gives its worker.",
    removal="when vLLM's CPU platform keeps `uni` for one worker (or its shared-memory readers stop spinning on the "
            "model's cores)",
    apply=apply,
    kind="speedup",
)
