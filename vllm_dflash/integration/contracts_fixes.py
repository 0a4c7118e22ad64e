# SPDX-License-Identifier: Apache-2.0
"""The seam table's rows for the vLLM bugs our fix-kind patches mend (they act in DFlash engines, and in any engine
under DFLASH_VLLM_EXTRAS=fixes): LoRA on CPU (prompt logprobs, base-model rows batched with adapter rows) and the
compile cache that never loads on CPU. Part of `CONTRACTS` (integration/contracts.py), in place."""
from __future__ import annotations

from vllm_dflash.integration.contract_types import Contract, Sig

_LORA_KERNEL_USE = ("replaced (in lora_ops, the torch_ops package and punica_cpu) by a wrapper that zeroes the input "
                    "rows whose adapter index is -1, then calls it")
_LORA_KERNEL_CONTRACT = ("the CPU LoRA kernel: `lora_b_weights[lora_indices_tensor]` selects each row's adapter "
                         "(-1: the last slot); called with the first four arguments positional (punica_cpu, and "
                         "the sgmv_* kernels through the module global)")
_LORA_MIXED_TEST = "tests/vllm/test_vllm_lora.py::test_base_requests_batched_with_an_adapter_request"

FIX_CONTRACTS: tuple[Contract, ...] = (
    Contract(
        "vllm.lora.ops.torch_ops.lora_ops:bgmv_shrink", "function", "integration/patches/cpu_lora_no_adapter.py",
        _LORA_KERNEL_USE, _LORA_KERNEL_CONTRACT,
        params=("inputs", "lora_b_weights", "output_tensor", "lora_indices_tensor", "scaling"),
        source=("lora_b_weights[lora_indices_tensor]",), test=_LORA_MIXED_TEST),
    Contract(
        "vllm.lora.ops.torch_ops.lora_ops:bgmv_expand", "function", "integration/patches/cpu_lora_no_adapter.py",
        _LORA_KERNEL_USE, _LORA_KERNEL_CONTRACT,
        params=("inputs", "lora_b_weights", "output_tensor", "lora_indices_tensor", "add_inputs"),
        source=("lora_b_weights[lora_indices_tensor]",), test=_LORA_MIXED_TEST),
    Contract(
        "vllm.lora.ops.torch_ops.lora_ops:bgmv_expand_slice", "function", "integration/patches/cpu_lora_no_adapter.py",
        _LORA_KERNEL_USE, _LORA_KERNEL_CONTRACT,
        params=("inputs", "lora_b_weights", "output_tensor", "lora_indices_tensor", "slice_offset",
                "slice_size", "add_inputs"),
        source=("lora_b_weights[lora_indices_tensor]",), test=_LORA_MIXED_TEST),
    Contract(
        "vllm.compilation.decorators:_try_load_aot_compiled_fn", "function",
        "integration/patches/aot_compile_load.py",
        "wrapped: while it runs, `torch.compiler.load_compiled_function` gives the loaded compiled function a no-op "
        "`finalize_loading` where it has none",
        "called from the compiled model's `__call__` (a module global, looked up at call time); loads the saved "
        "artifact with `torch.compiler.load_compiled_function` and calls `_artifacts.compiled_fn.finalize_loading`",
        params=("model", "aot_compilation_path"), exact=True,
        source=("torch.compiler.load_compiled_function(", "compiled_fn.finalize_loading("), patch="aot_compile_load",
        test="tests/vllm/test_vllm_compile_cache.py::test_compile_cache_loads"),
    Contract(
        "vllm.compilation.caching:aot_compile_hash_factors", "function", "integration/patches/aot_compile_load.py",
        "wrapped: where our CPU linear op runs (cpu_gemv.py: DFLASH_CPU_GEMM_F32, DFLASH_CPU_GEMV, "
        "DFLASH_VLLM_EXTRAS), one more factor names its row limits",
        "the factors of the AOT compile-cache key (the folder under VLLM_CACHE_ROOT/torch_compile_cache/"
        "torch_aot_compile/), computed in the process that compiles; `vllm_config.compute_hash()` covers "
        "`additional_config`, not our process settings",
        params=("vllm_config",), exact=True, source=("vllm_config.compute_hash()",),
        test="tests/vllm/test_vllm_compile_cache.py::test_another_gemm_routing_compiles_its_own"),
    Contract(
        "vllm.compilation.decorators:_support_torch_compile", "function", "integration/patches/aot_compile_load.py",
        "its compiled model's `__call__` reaches our wrapped `aot_compile_hash_factors`",
        "`__call__` imports `aot_compile_hash_factors` from vllm.compilation.caching at call time (a module "
        "attribute replaced after vLLM's import reaches it)",
        source=("from .caching import aot_compile_hash_factors",),
        test="tests/vllm/test_vllm_compile_cache.py::test_another_gemm_routing_compiles_its_own"),
    Contract(
        "vllm.v1.worker.gpu_model_runner:GPUModelRunner._get_prompt_logprobs_dict", "method",
        "integration/patches/lora_prompt_logprobs.py",
        "wrapped: while it runs, `self.model.compute_logits` on a slice of `hidden_states` gets the LoRA sampler "
        "indices of those rows",
        "it calls `self.model.compute_logits(hidden_states[offset : offset + n])` per request; we read "
        "`self.num_prompt_logprobs`, `self.lora_config`, `self.model`",
        params=("hidden_states", "num_scheduled_tokens"), exact=True,
        attrs=("num_prompt_logprobs", "lora_config", "model"), source=("self.model.compute_logits(",),
        patch="lora_prompt_logprobs",
        test="tests/vllm/test_vllm_lora.py::test_prompt_logprobs_with_lora_in_a_batch"),
    Contract(
        "vllm.lora.punica_wrapper.punica_cpu:PunicaWrapperCPU", "class",
        "integration/patches/lora_prompt_logprobs.py, integration/patches/cpu_lora_no_adapter.py",
        "`__init__` wrapped (records whether the engine being loaded gets our fixes; its `add_*` / "
        "`apply_lora_full_linear` calls then pick the kernels for that engine); `_sampler_indices[:n]` and "
        "`indices_len[1]` set to `token_lora_indices` of the prompt rows, then restored",
        "built while vLLM loads the model (its config current); `add_lora_logits` maps logits rows to adapters by "
        "`sampler_indices` (`_sampler_indices[:indices_len[1]]`, a buffer of max_num_batched_tokens); "
        "`token_lora_indices` holds the step's adapter slot per token, same encoding (-1: none); the module imports "
        "the torch_ops kernels by name",
        methods=(Sig("__init__", ("max_num_batched_tokens", "max_batches", "device")),),
        attrs=("_sampler_indices", "indices_len", "token_lora_indices", "sampler_indices", "add_shrink", "add_expand",
               "add_lora_embedding", "add_lora_linear", "add_lora_logits", "apply_lora_full_linear"),
        source=("from vllm.lora.ops.torch_ops import",), patch="cpu_lora_no_adapter",
        test="tests/vllm/test_vllm_lora.py::test_prompt_logprobs_with_lora_in_a_batch"),
    Contract(
        "vllm.lora.layers:LogitsProcessorWithLoRA", "class", "integration/patches/lora_prompt_logprobs.py",
        "found among the model's modules; its `punica_wrapper` is the one remapped",
        "the LoRA wrapper of the target's logits processor, holding the punica wrapper it applies",
        attrs=("punica_wrapper",),
        test="tests/vllm/test_vllm_lora.py::test_prompt_logprobs_with_lora_in_a_batch"),
)
