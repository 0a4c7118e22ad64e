# SPDX-License-Identifier: Apache-2.0
"""The table of every vLLM symbol, signature and private attribute vllm_dflash relies on (`CONTRACTS`): data only.
integration/seam.py checks it at registration and renders docs/CONTRACTS.md from it. Imports neither vLLM nor torch."""
from __future__ import annotations

from vllm_dflash.integration.contract_types import KINDS, SCOPES, Contract, Sig  # noqa: F401 (re-exported)
from vllm_dflash.integration.contracts_drafter import ADAPTIVE_CONTRACTS, DRAFTER_CONTRACTS
from vllm_dflash.integration.contracts_ray import RAY_CONTRACTS
from vllm_dflash.integration.contracts_fixes import FIX_CONTRACTS
from vllm_dflash.integration.contracts_sampling import SAMPLING_CONTRACTS

_ADAPTIVE_TEST = "tests/vllm/test_vllm_adaptive.py"
_KV_TEST = "tests/vllm/test_kv_injection_vllm.py"

CONTRACTS: tuple[Contract, ...] = (
    # ---------------------------------------------------------------- plugin loading
    Contract(
        "vllm.plugins", "module", "setup.py, vllm_dflash/__init__.py",
        "entry-point group `vllm.general_plugins`: `vllm_dflash = vllm_dflash:register`",
        "`load_general_plugins()` calls it in every process (API server, engine core, worker) before the worker class "
        "is resolved; an exception from a plugin propagates into vLLM, so `register()` never raises: it hooks the "
        "front end only, and the patches (after this table's check) are applied where DFlash is configured; for a "
        "vLLM that fails this table it warns and only makes configuring DFlash fail",
        attrs=("load_general_plugins",), source=('"vllm.general_plugins"',), test="tests/unit/test_package.py"),
    # ---------------------------------------------------------------- drafter
    *DRAFTER_CONTRACTS,  # our drafter and the draft model (integration/contracts_drafter.py)
    # ---------------------------------------------------------------- tensor parallelism
    Contract(
        "vllm.distributed.parallel_state", "module", "integration/tp_plan.py, serve/metrics.py",
        "`model_parallel_is_initialized()`, `get_tp_group()`, `get_pp_group()`: TP rank 0 broadcasts the adaptive "
        "plan over `group.cpu_group` from `group.ranks[0]`; only the output rank publishes our metrics",
        "the groups exist in every worker once model parallelism is initialised; TP rank 0 of the last PP stage is "
        "vLLM's output rank", attrs=("model_parallel_is_initialized", "get_tp_group", "get_pp_group"),
        test="tests/vllm/test_tp.py"),
    Contract(
        "vllm.distributed.parallel_state:GroupCoordinator", "class", "integration/tp_plan.py, serve/metrics.py",
        "the TP / PP group of the worker", "`world_size`, `rank_in_group`, `ranks` (global ranks), `cpu_group` "
        "(gloo), `is_last_rank`",
        attrs=("world_size", "rank_in_group", "ranks", "cpu_group", "is_last_rank"), test="tests/vllm/test_tp.py"),
    Contract(
        "vllm.config:ParallelConfig", "class", "integration/proposer.py, integration/patches/ray_cpu.py, "
        "integration/ray_cpu_executor.py",
        "`tensor_parallel_size` (draft sharding checks), `distributed_executor_backend` (\"ray\" on CPU -> our "
        "executor; \"uni\" kept on CPU for one worker), `world_size`, `local_world_size`, `placement_group`, "
        "`ray_runtime_env`",
        "vLLM's own fields, pickled with the config; `distributed_executor_backend` is \"uni\" after `__post_init__` "
        "when unset and `world_size` is 1",
        attrs=("tensor_parallel_size", "distributed_executor_backend", "world_size", "local_world_size",
               "placement_group", "ray_runtime_env"), test="tests/vllm/test_tp.py"),
    Contract(
        "vllm.v1.executor.abstract:Executor.get_class", "method", "integration/patches/ray_cpu.py",
        "wrapped (a staticmethod): backend \"ray\" on the CPU platform returns our `RayCpuExecutor`",
        "`VllmConfig.__post_init__` asks it which executor runs (async-scheduling support) before the platform hook; "
        "a qualname string backend is resolved here too",
        params=("vllm_config",), exact=True, patch="ray_cpu",
        test="tests/vllm/test_tp.py::test_ray_backend_on_cpu_selects_ray_cpu_executor"),
    # ---------------------------------------------------------------- attention / KV cache
    Contract(
        "vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl", "class", "integration/vllm_model.py, "
        "csrc/kv_injection_cpu.cpp",
        "`do_kv_cache_update` writes injected context K/V (other ISAs, fp8 caches); for `layer.isa` in `vec`/`vec16` "
        "and `kv_cache_dtype` auto our fused kernel writes the CPU paged cache **directly**",
        "per layer `kv_cache` [num_blocks, nkv, block_size, 2*hd], block interior contiguous; per (block, head): K as "
        "[hd, block_size] (transposed), then V as [block_size, hd]; negative slots are padding (verified against "
        "`cpu_attn_reshape_and_cache`); the metadata builder sets `layer.isa`",
        methods=(Sig("do_kv_cache_update", ("layer", "key", "value", "kv_cache", "slot_mapping")),),
        attrs=("kv_cache_dtype",), source=("layer.isa = self.isa",), test=_KV_TEST),
    Contract(
        "vllm.v1.attention.backends.flash_attn:FlashAttentionImpl", "class", "integration/vllm_model.py, "
        "csrc/kv_injection_cuda.cu",
        "CUDA paged KV-cache layout: the CUDA kernel writes through the cache's strides",
        "logical [num_blocks, nkv, block_size, 2*hd], K in `[..., :hd]`, V in `[..., hd:]` (as `do_kv_cache_update` "
        "splits it); built and checked against the PyTorch reference on an H200; not yet run inside vLLM on a GPU",
        methods=(Sig("do_kv_cache_update", ("layer", "key", "value", "kv_cache", "slot_mapping")),),
        test="tests/unit/test_kv_injection.py::test_cuda_kernel_equals_reference"),
    Contract(
        "vllm.v1.attention.backends.cpu_attn:CPUAttentionBackend.get_supported_head_sizes", "method",
        "integration/validation.py", "start-up check of the draft's head_dim (with `current_platform.is_cpu()`)",
        "the CPU backend's list of head sizes", params=(), test="tests/vllm/test_vllm_validation.py"),
    Contract(
        "vllm.platforms:current_platform", "attribute", "integration/validation.py", "`is_cpu()`",
        "the resolved platform object", attrs=("is_cpu",), test="tests/vllm/test_vllm_validation.py"),
    Contract(
        "vllm.forward_context:set_forward_context", "function", "integration/drafting/step.py",
        "each denoising pass of the draft forward (`DraftStep.run_model`)",
        "the same call as `SpecDecodeBaseProposer.propose`",
        params=("attn_metadata", "vllm_config", "num_tokens", "num_tokens_across_dp", "cudagraph_runtime_mode",
                "slot_mapping"), test="tests/vllm/test_vllm_drafter.py"),
    Contract(
        "vllm.compilation.breakable_cudagraph:BreakableCUDAGraphWrapper", "class", "integration/proposer.py",
        "`unwrap()` reaches our model class behind a graph wrapper", "returns the wrapped module",
        methods=(Sig("unwrap", ()),), test="tests/vllm/test_vllm_drafter.py"),
    # ---------------------------------------------------------------- configuration
    Contract(
        "vllm.engine.arg_utils:EngineArgs.create_speculative_config", "method", "integration/patches/"
        "speculative_config.py, vllm_dflash/settings.py",
        "strips our keys (`adaptive`, `diffusion_steps`, `confidence_threshold`, `overlap`, `kv_injection`, "
        "`drafter`), resolves them (key > `additional_config[\"dflash\"]` > `DFLASH_*` env > default) into a new "
        "`self.additional_config`, validates the draft before engines start; the hook of the guard when this table "
        "fails",
        "runs in the front-end process, once per `create_engine_config`, BEFORE `create_engine_config` builds "
        "`VllmConfig(..., additional_config=self.additional_config)` (same method, later); `SpeculativeConfig` forbids "
        "unknown keys; we assign a new `additional_config` dict (never mutate the caller's)",
        params=("target_model_config", "target_parallel_config"), exact=True,
        attrs=("speculative_config", "additional_config"), patch="speculative_config",
        test="tests/vllm/test_settings_vllm.py, tests/vllm/test_vllm_validation.py"),
    Contract(
        "vllm.v1.engine.utils:CoreEngineProcManager.__init__", "method", "integration/patches/speculative_config.py",
        "wrapped: for an engine with our drafter, `DFLASH_PLUGIN_ACTIVE=1` in this process's environment while it "
        "starts the engine-core processes, the previous value restored after",
        "starts every engine-core process of one engine (its `vllm_config`) before returning; each inherits the "
        "environment of that moment",
        params=("local_engine_count", "start_index", "local_start_index", "vllm_config", "local_client",
                "handshake_address", "executor_class", "log_stats", "client_handshake_address", "tensor_queue"),
        test="tests/vllm/test_walls.py"),
    Contract(
        "vllm.v1.engine.core:EngineCore.__init__", "method", "integration/patches/speculative_config.py",
        "wrapped as `CoreEngineProcManager.__init__`, for an engine core run in this process",
        "builds the engine's executor (which starts its workers) from `vllm_config` before returning",
        params=("vllm_config", "executor_class", "log_stats", "executor_fail_callback", "include_finished_set"),
        test="tests/vllm/test_walls_one_process.py"),
    Contract(
        "vllm.engine.arg_utils:EngineArgs.create_engine_config", "method", "integration/patches/speculative_config.py",
        "calls the patched `create_speculative_config`", "...then passes `self.additional_config` to `VllmConfig`",
        source=("self.create_speculative_config(", "additional_config=self.additional_config"),
        test="tests/vllm/test_settings_vllm.py"),
    Contract(
        "vllm.config:VllmConfig", "class", "vllm_dflash/settings.py (`from_vllm_config`), integration/*",
        "`additional_config[\"dflash\"]` carries our resolved per-deployment settings (a JSON object), read by the "
        "drafter, the drafter switch, `DFlashDraftForVllm`, the CPU platform hook and `AdaptiveAsyncScheduler`",
        "a plain dict field, pickled with the config to the engine core and every worker; kept by "
        "`dataclasses.replace` (the draft's `_create_draft_vllm_config`); hashed into the compile-cache key "
        "(`compute_hash`: `json.dumps(sort_keys=True)`), so it stays JSON-serialisable; vLLM reads only its own keys",
        methods=(Sig("compute_hash", ()),),
        attrs=("additional_config", "model_config", "scheduler_config", "speculative_config"),
        test="tests/vllm/test_settings_vllm.py"),
    Contract(
        "vllm.config:SpeculativeConfig", "class", "integration/patches/speculative_config.py, integration/proposer.py",
        "keys `method`, `model`, `num_speculative_tokens` as vLLM defines them; `disable_eagle_block_drop` set to True "
        "for our drafter unless the user gives it (`keep_prefix_block`); `draft_model_config.hf_config`",
        "the scheduler's KV-cache manager then keeps the last matched prefix-cache block instead of recomputing it; "
        "correct for DFlash: a draft context K/V row depends only on the target hidden state at its own position and "
        "is injected in the step that computes it, and the draft's block queries only write not-yet-computed slots",
        attrs=("method", "model", "num_speculative_tokens", "disable_eagle_block_drop", "draft_model_config"),
        test="tests/vllm/test_vllm_prefix_cache.py"),
    Contract(
        "vllm.config:SchedulerConfig", "class",
        "integration/patches/async_scheduling.py, integration/drafting/mode.py",
        "`async_scheduling` (re-set after the CPU hook), `scheduler_cls` = `AdaptiveAsyncScheduler` for adaptive "
        "drafting under overlap when the user set no class",
        "`get_scheduler_cls()` resolves a dotted path in the engine core; `VllmConfig.__post_init__` runs the platform "
        "hook before it",
        methods=(Sig("get_scheduler_cls", ()),),
        attrs=("async_scheduling", "scheduler_cls", "max_num_seqs", "max_num_batched_tokens"), test=_ADAPTIVE_TEST),
    Contract(
        "vllm.platforms.cpu:CpuPlatform.check_and_update_config", "method", "integration/patches/async_scheduling.py, "
        "integration/patches/cpu_uniproc.py",
        "wrapped: re-sets `scheduler_config.async_scheduling = True` after it for our dflash drafter (setting "
        "`overlap`); then (cpu_uniproc, outermost) puts `parallel_config.distributed_executor_backend` back to "
        "\"uni\" where the hook replaced it with \"mp\" (one worker, multiprocessing on, synchronous scheduling)",
        "`VllmConfig.__post_init__` decides `async_scheduling` (flag or default) BEFORE calling the platform hook, "
        "which then forces False on CPU and, with VLLM_ENABLE_V1_MULTIPROCESSING on, replaces backend \"uni\" with "
        "\"mp\"; the config is pickled to the engine core as is; `UniProcExecutor` / "
        "`MultiprocExecutor.supports_async_scheduling()` are True",
        params=("vllm_config",), exact=True, patch="async_scheduling",
        test="tests/vllm/test_vllm_drafter.py::test_overlap_scheduling_on_for_our_drafter_only"),
    Contract(
        "vllm.config.vllm:VllmConfig.__post_init__", "method", "integration/patches/engine_config.py",
        "wrapped, for an engine with our DFlash drafter only: before it, `VLLM_USE_V2_MODEL_RUNNER=1` is refused with "
        "the fix; after it (the platform hook included), the `overlap` rule on every platform (adaptive drafting: "
        "async scheduling off under auto/false, our scheduler under true) and a config still on Model Runner V2 is "
        "refused",
        "runs on every `VllmConfig(...)` (pydantic calls it by name), in the front end; decides `async_scheduling` "
        "(True for dflash where the executor supports it) and then calls `current_platform.check_and_update_config`, "
        "which only the CPU platform uses to force async scheduling off; nothing after the platform hook reads "
        "`async_scheduling` except the V1/V2 runner validation",
        params=(), exact=True, source=("current_platform.check_and_update_config(self)",), patch="engine_config",
        test="tests/vllm/test_gpu_startup.py"),
    Contract(
        "vllm.config.vllm:VllmConfig._get_v2_model_runner_unsupported_features", "method",
        "integration/patches/engine_config.py",
        "wrapped: names our DFlash drafter for an engine that has it, so `use_v2_model_runner` picks the V1 runner "
        "(whose `DFlashProposer` global we replace) and logs vLLM's reason",
        "`VllmConfig.use_v2_model_runner` (a property read on every use, front end and worker) returns False when "
        "this list is non-empty, unless `VLLM_USE_V2_MODEL_RUNNER` is set or a V2-only feature forces V2; on a GPU "
        "with Triton V2 is the default",
        params=(), exact=True, attrs=("use_v2_model_runner",),
        test="tests/vllm/test_gpu_startup.py::test_default_dflash_config_starts_on_cuda"),
    Contract(
        "vllm.v1.executor.uniproc_executor:UniProcExecutor._init_executor", "method",
        "integration/patches/cpu_uniproc.py",
        "wrapped: in a CPU engine core process that runs the model (backend \"uni\" kept by the platform-hook "
        "wrapper), the OpenMP layout of vLLM's worker (`OMPProcessManager`) is applied before it builds the worker",
        "it builds the worker in this process (`init_worker`, `init_device`, `load_model`); `collective_rpc` runs "
        "worker methods in the calling thread, so the engine core's step runs the forward itself",
        params=(), exact=True, source=("self.driver_worker.init_device()",), patch="cpu_uniproc",
        test="tests/vllm/test_vllm_patches.py::test_cpu_engine_core_runs_the_model"),
    Contract(
        "vllm.utils.ompmultiprocessing:OMPProcessManager", "class", "integration/patches/cpu_uniproc.py",
        "built from the config in the engine core to read the CPU list vLLM's multiprocess executor would give its "
        "local-rank-0 worker",
        "`cpu_lists[local_rank]` are CPU ids parsed from VLLM_CPU_OMP_THREADS_BIND (auto: per NUMA node, cores "
        "reserved for the engine core removed); `skip_setup` is True for \"nobind\"",
        methods=(Sig("__init__", ("config",)),), attrs=("skip_setup", "cpu_lists"),
        test="tests/vllm/test_vllm_patches.py::test_cpu_engine_core_runs_the_model"),
    # ---------------------------------------------------------------- adaptive drafting
    *ADAPTIVE_CONTRACTS,  # adaptive drafting (integration/contracts_drafter.py)
    # ---------------------------------------------------------------- patched bugs / metrics
    Contract(
        "vllm.v1.worker.gpu_model_runner:GPUModelRunner._bookkeeping_sync", "method",
        "integration/patches/generator_rewind.py",
        "wrapped: CPU generators get no-op `get_offset/set_offset` while it runs",
        "on CPU it rewinds generators of discarded partial-prefill samples with offsets CPU generators lack; we read "
        "`self.input_batch`, `self.discard_request_mask.np`, `self.device`",
        attrs=("input_batch", "discard_request_mask", "device"), patch="generator_rewind",
        test="tests/vllm/test_vllm_patches.py::test_seeded_sampling_with_chunked_prefill"),
    *FIX_CONTRACTS,  # the vLLM bugs our fix-kind patches mend (integration/contracts_fixes.py)
    Contract(
        "vllm.v1.worker.cpu_model_runner:CPUModelRunner", "class", "integration/patches/cpu_omp_threads.py",
        "`__init__` and `propose_draft_token_ids` wrapped: torch's intra-op thread count is put back to the count "
        "the worker bound when the drafter changed it",
        "the CPU worker binds its OpenMP threads (CPUWorker.init_device) before it builds this runner, whose "
        "`__init__` builds the drafter (vLLM's NgramProposer JIT-compiles numba then); the drafter runs inside "
        "`propose_draft_token_ids`",
        methods=(Sig("__init__", ("vllm_config", "device")),
                 Sig("propose_draft_token_ids", ("scheduler_output", "sampled_token_ids", "sampling_metadata",
                                                 "hidden_states", "sample_hidden_states", "aux_hidden_states",
                                                 "spec_decode_metadata", "common_attn_metadata", "slot_mappings"))),
        patch="cpu_omp_threads",
        test="tests/vllm/test_vllm_patches.py::test_numba_ngram_drops_omp_threads"),
    Contract(
        "vllm.v1.worker.cpu_model_runner:CPUModelRunner.load_model", "method",
        "integration/patches/profile_forward.py",
        "wrapped: with `DFLASH_PROFILE=1`, after it returns we wrap `self.model`'s `forward` (that instance) with a "
        "host timer",
        "it sets `self.model` to the loaded target (an `nn.Module`), which the runner calls once per engine step "
        "(`_model_forward`); on CPU that call has finished the forward when it returns, eager or compiled",
        params=("load_dummy_weights",), source=("self.model = get_model(",), patch="profile_forward",
        test="tests/vllm/test_vllm_profile.py, tests/vllm/test_vllm_serve.py::test_serve_end_to_end"),
    Contract(
        "vllm.v1.worker.cpu_model_runner:CPUModelRunner.load_model", "method",
        "integration/forward_timer.py, integration/drafting/adaptive.py",
        "adaptive drafting on CPU with synchronous scheduling: the drafter's `load_model(target_model)` wraps that "
        "instance's `forward` and `compute_logits` with a host timer (`ForwardTimer`) whose time per step feeds the "
        "step-cost fit",
        "it passes the loaded target (`self.model`, which the runner calls once per engine step) to "
        "`self.drafter.load_model`; on CPU that call has finished the forward when it returns, eager or compiled",
        params=("load_dummy_weights",), source=("self.drafter.load_model(self.model)",),
        test=f"{_ADAPTIVE_TEST}, tests/unit/test_adaptive_step_cost.py"),
    Contract(
        "vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model", "method",
        "integration/forward_timer.py",
        "adaptive drafting on CPU (synchronous): the target's logits time joins its forward time in the step-cost fit",
        "each step calls `self.model.compute_logits` on the instance the drafter was given, on the hidden states at "
        "`logits_indices` (every verified position of a speculating request), so its time grows with query tokens",
        source=("self.model.compute_logits(sample_hidden_states)",),
        test=f"{_ADAPTIVE_TEST}, tests/unit/test_adaptive_step_cost.py"),
    *SAMPLING_CONTRACTS,  # sampling on CPU (integration/contracts_sampling.py)
    Contract(
        "vllm.model_executor.layers.utils:dispatch_cpu_unquantized_gemm", "function",
        "integration/patches/cpu_gemv.py", "wrapped (settings cpu_gemv, cpu_gemm_f32): eligible bf16 / fp32 layers "
        "get our `layer.cpu_linear`; every other call goes to the original unchanged",
        "called once per linear / vocab layer after its weights load (CPU); it sets `layer.cpu_linear(x, weight, "
        "bias)`, which `cpu_unquantized_gemm` calls on every forward; with `remove_weight` it empties `layer.weight`. "
        "Our eligibility test mirrors its branches: meta / non-2-D weights, zentorch, `check_cpu_sgl_kernel`, oneDNN",
        params=("layer", "remove_weight"), exact=True,
        source=("check_cpu_sgl_kernel(N, K, dtype)", "ops.create_onednn_mm(origin_weight.t(), 32)",
                "layer.cpu_linear"), patch="cpu_gemv",
        test="tests/vllm/test_vllm_cpu_gemv.py, tests/vllm/test_vllm_gemm_f32.py"),
    Contract(
        "vllm.model_executor.layers.utils:check_cpu_sgl_kernel", "function", "integration/patches/cpu_gemv.py",
        "called: a layer vLLM gives to its sgl-kernel GEMM keeps vLLM's choice",
        "True where `dispatch_cpu_unquantized_gemm` uses `weight_packed_linear_cpu` instead of oneDNN",
        params=("n", "k", "dtype"), test="tests/vllm/test_vllm_cpu_gemv.py"),
    Contract(
        "vllm.model_executor.layers.linear:UnquantizedLinearMethod.process_weights_after_loading", "method",
        "integration/patches/cpu_gemv.py", "reaches our wrapper",
        "imports `dispatch_cpu_unquantized_gemm` from `vllm.model_executor.layers.utils` inside the method (so the "
        "patched module attribute is what it calls)", params=("layer",),
        source=("from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm",),
        test="tests/vllm/test_vllm_cpu_gemv.py"),
    Contract(
        "vllm.model_executor.layers.vocab_parallel_embedding:UnquantizedEmbeddingMethod.process_weights_after_loading",
        "method", "integration/patches/cpu_gemv.py", "reaches our wrapper (the LM head; `remove_weight=False`, the "
        "embedding keeps its weight)",
        "imports `dispatch_cpu_unquantized_gemm` from `vllm.model_executor.layers.utils` inside the method (so the "
        "patched module attribute is what it calls)", params=("layer",),
        source=("from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm",),
        test="tests/vllm/test_vllm_cpu_gemv.py"),
    Contract(
        "vllm._custom_ops:create_onednn_mm", "function", "integration/patches/cpu_onednn_cache.py, "
        "integration/patches/cpu_gemv.py, csrc/cpu_linear_route.h",
        "wrapped (setting onednn_cache): a larger row-count cache, and the decode-sized row counts built when the "
        "first layer of each weight shape loads; called by cpu_gemv for the oneDNN handler `linear_bf16` / "
        "`linear_f32` use for calls with more rows than their threshold (none with cpu_gemm_f32 `all`)",
        "`primitive_cache_size` sizes the LRU of built primitives keyed by row count that all handlers of one "
        "weight shape share (the first handler of the shape sets it; csrc/cpu/dnnl_helper.cpp); the handler's "
        "`handler_tensor` (int64) is what `_C::onednn_mm(Tensor(a!) c, Tensor a, Tensor? bias, Tensor "
        "handler_tensor)` takes; the C++ op calls that schema through the dispatcher (c [M, N] preallocated, "
        "a [M, K]); `weight` is [K, N] (vLLM passes `layer.weight.t()`)", params=("weight", "primitive_cache_size"),
        exact=True, source=("handler.handler_tensor", "torch.ops._C.create_onednn_mm_handler"),
        patch="cpu_onednn_cache", test="tests/vllm/test_vllm_onednn_cache.py, tests/vllm/test_vllm_cpu_gemv.py"),
    Contract(
        "vllm.config:get_current_vllm_config_or_none", "function", "integration/patches/cpu_onednn_cache.py",
        "called while a layer's weights are processed: how many row counts to build up front",
        "returns the VllmConfig of the engine being loaded (set around worker construction and model loading), "
        "else None; we read `scheduler_config.max_num_seqs`, `scheduler_config.max_num_batched_tokens` and "
        "`speculative_config.num_speculative_tokens`", params=(),
        test="tests/vllm/test_vllm_onednn_cache.py"),
    Contract(
        "vllm._custom_ops:onednn_mm", "function", "csrc/cpu_linear_route.h (linear_bf16, linear_f32)",
        "mirrored in C++: the same `_C::onednn_mm` call for calls with more rows than the threshold",
        "`torch.ops._C.onednn_mm(output, x.reshape(-1, k), bias, handler_tensor)` with `output` [M, N] in x's dtype",
        params=("dnnl_handler", "x", "bias"),
        source=("torch.ops._C.onednn_mm(", "dnnl_handler.handler_tensor"),
        test="tests/vllm/test_vllm_cpu_gemv.py, tests/vllm/test_vllm_gemm_f32.py"),
    Contract(
        "vllm.platforms.cpu:CpuPlatform.register_triton_kernel_overrides", "method", "integration/patches/"
        "cpu_expand_kernel.py", "reads `cpu_triton_utils._expand_kernel_impl` (our replacement)",
        "it scans `sys.modules` when the worker initialises (it breaks once numba/llvmlite is imported, so "
        "`vllm-dflash eval --engine vllm --ngram K` runs the n-gram engine last)",
        params=(), source=("_expand_kernel_impl",), test="tests/vllm/test_vllm_sampling.py"),
    Contract(
        "vllm.v1.core.sched.scheduler:Scheduler.make_spec_decoding_stats", "method", "integration/patches/"
        "observe_draft.py, serve/metrics.py",
        "wrapped: per-request accepted-length histogram (`vllm_dflash:accepted_tokens_per_step`), for an engine with "
        "our drafter (the scheduler's `vllm_config`)",
        "called once per request per verify step in the scheduler (engine core), also by `AsyncScheduler` (inherited); "
        "returns None when stats are off or no draft was verified, else the batch's `SpecDecodingStats` after "
        "`observe_draft`",
        params=("spec_decoding_stats", "num_draft_tokens", "num_accepted_tokens", "num_invalid_spec_tokens",
                "request_id"), exact=True, attrs=("vllm_config",), patch="observe_draft",
        test="tests/vllm/test_vllm_serve.py"),
    Contract(
        "vllm.v1.core.sched.scheduler:Scheduler.reset_prefix_cache", "method", "integration/patches/"
        "prefix_cache_reset.py, adaptive/cross_lookup.py",
        "wrapped: a successful reset also empties the cross-request lookup index (setting cross_lookup), for an "
        "engine with our drafter (the scheduler's `vllm_config`)",
        "called in the engine core for /reset_prefix_cache (and `LLM.reset_prefix_cache`); returns whether the cache "
        "was reset",
        params=("reset_running_requests", "reset_connector"), exact=True, attrs=("vllm_config",),
        patch="prefix_cache_reset", test="tests/vllm/test_vllm_cross_lookup.py"),
    Contract(
        "prometheus_client:REGISTRY", "attribute", "serve/metrics.py",
        "our `DFlashCollector` (names `vllm_dflash:*`)", "vLLM serves the default registry on `/metrics`",
        test="tests/vllm/test_vllm_serve.py"),
    Contract(
        "vllm.v1.metrics.prometheus:get_prometheus_registry", "function", "integration/patches/"
        "prometheus_registry.py, serve/metrics.py",
        "wrapped: a registry other than the default one (PROMETHEUS_MULTIPROC_DIR set) gets our collector too",
        "builds the registry `/metrics` serves (`attach_router` in vllm/entrypoints/serve/instrumentator/metrics.py, "
        "which imports it by name): the default REGISTRY, or a new one with vLLM's MultiProcessCollector",
        params=(), exact=True, patch="prometheus_registry", test="tests/vllm/test_vllm_metrics_registry.py"),
    Contract(
        "vllm.v1.metrics.prometheus:unregister_vllm_metrics", "function", "serve/metrics.py",
        "leaves our collector registered", "only removes collectors named `vllm:`", params=(),
        source=('startswith("vllm:")',), test="tests/vllm/test_vllm_serve.py"),
    # ---------------------------------------------------------------- read by tests and benchmarks only
    Contract(
        "vllm.v1.worker.gpu_model_runner:GPUModelRunner", "class", "tests/vllm/test_vllm_prefix_cache.py",
        "negative control (zero the draft's KV cache): `llm.llm_engine.model_executor.driver_worker.worker."
        "model_runner`, `runner.drafter._draft_attn_layer_names`, `runner.compilation_config.static_forward_context"
        "[name].kv_cache`",
        "in-process engine (`VLLM_ENABLE_V1_MULTIPROCESSING=0`); the draft's attention layers are named in the "
        "drafter and their caches live in the static forward context", attrs=("drafter", "compilation_config"),
        scope="tests", test="tests/vllm/test_vllm_prefix_cache.py"),
    Contract(
        "vllm.v1.spec_decode.dflash:DFlashProposer", "class", "tests/vllm/test_vllm_prefix_cache.py",
        "`_draft_attn_layer_names`", "the names of the draft's attention layers",
        attrs=("_draft_attn_layer_names",), scope="tests", test="tests/vllm/test_vllm_prefix_cache.py"),
    Contract(
        "vllm.outputs:RequestOutput", "class", "tests/vllm/test_vllm_prefix_cache.py", "`num_cached_tokens`",
        "tokens of the prompt served from the prefix cache", attrs=("num_cached_tokens",), scope="tests",
        test="tests/vllm/test_vllm_prefix_cache.py"),
    Contract(
        "vllm.v1.worker.gpu_model_runner:GPUModelRunner._input_fits_in_drafter", "method",
        "integration/proposer.py (`_check_position_range`), tests/vllm/test_vllm_position_range.py",
        "why no position past the draft's RoPE cache reaches our drafter by default (its start-up line says so)",
        "a step whose longest request plus the block passes the draft's max_model_len runs no draft forward",
        params=("common_attn_metadata",), source=("effective_drafter_max_model_len",), scope="tests",
        test="tests/vllm/test_vllm_position_range.py"),
    Contract(
        "vllm.config.speculative:SpeculativeConfig._maybe_override_draft_max_model_len", "method",
        "tests/vllm/test_vllm_position_range.py", "replaced in the test (`WIDEN`): a draft whose max_model_len "
        "outgrows its RoPE cache", "sets the draft's max_model_len (the runner's guard above reads it)",
        params=("speculative_max_model_len", "draft_max_model_len", "target_max_model_len"), exact=True,
        scope="tests", test="tests/vllm/test_vllm_position_range.py"),
    Contract(
        "vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model", "class", "bench/kernels.py",
        "runs vLLM's own precompute on stand-in layers", "the attribute names of the serving row above",
        methods=(Sig("_project_context_kv", ("context_states", "num_ctx", "num_layers", "num_kv_heads", "head_dim")),
                 Sig("_normalize_context_k", ("all_k",)),
                 Sig("precompute_and_store_context_kv", ("context_states", "context_positions",
                                                         "context_slot_mapping"))),
        scope="tests"),
    Contract(
        "vllm.entrypoints.serve.dev.cache.api_router:reset_prefix_cache", "function",
        "serve/server.py, bench/waves.py",
        "`POST /reset_prefix_cache` before each benchmark wave (the servers run with `VLLM_SERVER_DEV_MODE=1`), so a "
        "prompt an earlier level sent is not served from the cache",
        "served only in dev mode (404 otherwise: `Server.reset_prefix_cache` names the fix); answers "
        "`{\"success\": false}` while blocks are held, so it is retried",
        params=("raw_request", "reset_running_requests", "reset_external"), source=('"/reset_prefix_cache"',),
        scope="tests", test="tests/e2e/test_bench_serving_quick.py"),
) + RAY_CONTRACTS  # Ray on CPU last (integration/contracts_ray.py)
