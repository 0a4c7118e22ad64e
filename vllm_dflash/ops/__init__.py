from vllm_dflash.ops.kv_injection import (CPU_VEC_LAYOUT, CUDA_LAYOUT, KVInjectionWeights, inject_context_kv,
                                          inject_context_kv_reference, inject_context_kv_to_cache,
                                          write_cache_reference)

__all__ = ["CPU_VEC_LAYOUT", "CUDA_LAYOUT", "KVInjectionWeights", "inject_context_kv", "inject_context_kv_reference",
           "inject_context_kv_to_cache", "write_cache_reference"]
