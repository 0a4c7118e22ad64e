# SPDX-License-Identifier: Apache-2.0
"""The seam table's rows for Ray on CPU (backend "ray", patches/ray_cpu.py): the internals of vLLM's Ray executor that
`RayCpuExecutor` (integration/ray_cpu_executor.py) relies on. Scope "ray": checked by `seam --check` and the tests,
never at registration (importing them imports ray). Part of `CONTRACTS` (integration/contracts.py)."""
from __future__ import annotations

from vllm_dflash.integration.contract_types import Contract, Sig

RAY_CONTRACTS: tuple[Contract, ...] = (
    Contract(
        "vllm.v1.executor.ray_executor_v2:RayExecutorV2", "class", "integration/ray_cpu_executor.py",
        "base class of `RayCpuExecutor` (replaces `_init_executor`, extends `shutdown`)",
        "the parent's start-up steps, CPU-keyed; everything after start-up (MessageQueue RPC, worker monitor) is the "
        "parent's",
        methods=(Sig("_init_executor", (), exact=True), Sig("shutdown", (), exact=True),
                 Sig("_get_parallel_sizes", ()), Sig("_build_runtime_env", ()), Sig("_is_driver_worker", ("rank",)),
                 Sig("_post_init_executor", ()), Sig("start_worker_monitor", ()), Sig("_get_output_rank", ()),
                 Sig("collective_rpc", ("method", "timeout"))),
        attrs=("parallel_config", "vllm_config", "world_size", "rpc_broadcast_mq", "response_mqs",
               "ray_worker_handles", "driver_env_vars", "futures_queue", "output_rank", "is_failed",
               "failure_callback", "shutting_down", "shutdown_lock"),
        scope="ray", test="tests/vllm/test_tp.py::test_ray_cpu_executor_tp2_equals_mp"),
    Contract(
        "vllm.v1.executor.ray_executor_v2:RayWorkerProc", "class", "integration/ray_cpu_executor.py",
        "base class of `RayCpuWorkerProc`", "`get_node_and_physical_gpu_ids()` looks up `ray_device_key` (\"\" on CPU)",
        methods=(Sig("get_node_and_physical_gpu_ids", (), exact=True),), attrs=("READY_STR",), scope="ray",
        test="tests/vllm/test_tp.py::test_ray_cpu_executor_tp2_equals_mp"),
    Contract(
        "vllm.v1.executor.ray_executor_v2", "module", "integration/ray_cpu_executor.py",
        "`RayWorkerHandle(actor, rank, local_rank, node_id, bundle_id_idx)`", "the handle the parent's RPC uses",
        attrs=("RayWorkerHandle",), scope="ray", test="tests/vllm/test_tp.py::test_ray_cpu_executor_tp2_equals_mp"),
    Contract(
        "vllm.v1.executor.ray_utils", "module", "integration/ray_cpu_executor.py",
        "`WORKER_SPECIFIC_ENV_VARS`, `build_actor_name`, `ray`", "as the parent executor uses them",
        attrs=("WORKER_SPECIFIC_ENV_VARS", "build_actor_name", "ray"), scope="ray",
        test="tests/vllm/test_tp.py::test_ray_cpu_executor_tp2_equals_mp"),
    Contract(
        "vllm.distributed.device_communicators.shm_broadcast:MessageQueue", "class", "integration/ray_cpu_executor.py",
        "reads `mq.buffer.shared_memory.name` to unlink the /dev/shm segments of queues whose actors were killed at "
        "shutdown", "`MessageQueue.buffer` is a `ShmRingBuffer` (None for a remote reader) holding `shared_memory`",
        attrs=("buffer",), scope="ray", test="tests/vllm/test_tp.py::test_ray_cpu_executor_tp2_equals_mp"),
    Contract(
        "vllm.distributed.device_communicators.shm_broadcast:ShmRingBuffer", "class",
        "integration/ray_cpu_executor.py", "the segment name of a queue's ring buffer",
        "`ShmRingBuffer.shared_memory` is a `multiprocessing.shared_memory.SharedMemory`",
        attrs=("shared_memory",), scope="ray", test="tests/vllm/test_tp.py::test_ray_cpu_executor_tp2_equals_mp"),
    Contract(
        "vllm.utils.ompmultiprocessing:OMPProcessManager", "class", "integration/ray_cpu_executor.py",
        "each rank's OpenMP env, as the mp executor sets it", "`configure_omp_envs` is a context manager setting "
        "`OMP_*` / `GOMP_CPU_AFFINITY` in `os.environ`",
        methods=(Sig("configure_omp_envs", ("rank", "local_rank")),), scope="ray",
        test="tests/vllm/test_tp.py::test_ray_cpu_executor_tp2_equals_mp"),
)
