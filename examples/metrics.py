"""Read a running server's metrics: python examples/metrics.py [http://127.0.0.1:8000]"""
import sys

from vllm_dflash.bench.stats import adaptive_delta
from vllm_dflash.serve.tau import parse_metrics, spec_decode

if __name__ == "__main__":
    import urllib.request

    url = (sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000") + "/metrics"
    m = parse_metrics(urllib.request.urlopen(url).read().decode())
    sd = spec_decode(m)
    print(f"vLLM's τ (per proposing step): {sd['tau']}; tokens per target forward: {sd['tokens_per_forward']} "
          f"(adaptive drafting counts request-steps; at concurrency 1 also {sd['tokens_per_engine_step']} per "
          "engine step)")
    for name in ("draft_forward_seconds", "kv_injection_seconds", "accepted_tokens_per_step"):
        s, c = m.get(f"vllm_dflash:{name}_sum", 0.0), m.get(f"vllm_dflash:{name}_count", 0.0)
        print(f"vllm_dflash:{name}: mean {s / c if c else float('nan'):.4g} over {int(c)} observations")
    print(f"block size {m.get('vllm_dflash:block_size')}, diffusion steps {m.get('vllm_dflash:diffusion_steps')}")
    ad = adaptive_delta({}, m)  # adaptive drafting: the counters labelled by proposal source
    if ad is not None:
        for src, share in ad["share"].items():
            rate = ad["acceptance_rate"].get(src)
            accepted = f", acceptance {rate:.2f}" if rate is not None else ""
            print(f"source {src}: {share:.0%} of request-steps{accepted}")
