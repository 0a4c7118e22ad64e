"""Offline generation with our drafter: python examples/offline_llm.py [DRAFT]"""
import os
import sys

if __name__ == "__main__":  # vLLM spawns processes on CPU: keep the guard
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    from vllm_dflash.drafts import ensure_draft
    from vllm_dflash.target import prepare_target
    from vllm_dflash.utils import default_dtype

    target = prepare_target()
    draft, untrained = ensure_draft(sys.argv[1] if len(sys.argv) > 1 else "models/SmolLM2-135M-Instruct-DFlash-b8", target)
    llm = LLM(model=str(target), dtype=default_dtype(), enforce_eager=True, max_model_len=2048, disable_log_stats=False,
              speculative_config={"method": "dflash", "model": str(draft), "num_speculative_tokens": 7})
    out = llm.chat([[{"role": "user", "content": "Write a Python function that reverses a string."}]],
                   SamplingParams(temperature=0.0, max_tokens=128))
    print(out[0].outputs[0].text)
    m = {x.name: x for x in llm.get_metrics() if x.name.startswith("vllm:spec_decode")}
    drafts, acc = m["vllm:spec_decode_num_drafts"].value, m["vllm:spec_decode_num_accepted_tokens"].value
    print(f"mean acceptance length τ = {1 + acc / max(drafts, 1):.2f}" + ("  (untrained draft)" if untrained else ""))
