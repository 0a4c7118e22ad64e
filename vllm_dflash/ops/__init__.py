from vllm_dflash.ops.kv_injection import KVInjectionWeights, inject_context_kv, inject_context_kv_reference

__all__ = ["KVInjectionWeights", "inject_context_kv", "inject_context_kv_reference"]
