# SPDX-License-Identifier: Apache-2.0
"""The one evaluation report, filled by both backends (the offline reference loop, eval/reference.py, and an
in-process vLLM engine, eval/vllm_engine.py), and its text rendering. `vllm-dflash eval --json` prints to_dict()."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class EvalReport:
    engine: str  # "reference" | "vllm"
    target: str
    draft: str
    prompts: str
    num_prompts: int
    block_size: int
    diffusion_steps: int
    max_new_tokens: int
    acceptance_length: float  # vLLM's τ: 1 + accepted / verify steps that carried a proposal
    tokens_per_forward: float | None  # generated tokens / request-steps (every target forward counts)
    per_position_acceptance: list[float]
    histogram: list[int]  # verify steps by tokens gained (1..B)
    num_steps: int  # verify steps that carried a proposal
    output_tokens: int
    tokens_per_s: float
    draft_time_share: float  # draft forward (+ KV injection) time / generation time
    concurrency: int = 1
    speedup: float | None = None  # over the baseline below (None: not measured)
    baseline_tokens_per_s: float | None = None
    ngram: dict[str, Any] | None = field(default=None)  # vLLM prompt lookup on the same prompts (vLLM engine only)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def format_report(r: EvalReport | dict[str, Any]) -> str:
    r = r.to_dict() if isinstance(r, EvalReport) else r
    tpf = r.get("tokens_per_forward")
    lines = [f"[{r.get('engine', 'reference')}] draft {r['draft']}  on {r['prompts']} ({r['num_prompts']} prompts, "
             f"{r['max_new_tokens']} new tokens, block {r['block_size']}, diffusion steps {r['diffusion_steps']})",
             f"  acceptance length τ  {r['acceptance_length']:.3f}  ({r['num_steps']} verify steps)",
             f"  tokens per target forward  {tpf:.3f}" if tpf is not None else "  tokens per target forward  n/a",
             "  per-position acceptance " + " ".join(f"{x:.2f}" for x in r["per_position_acceptance"]),
             "  histogram (tokens/step 1..B) " + " ".join(str(h) for h in r["histogram"]),
             f"  throughput {r['tokens_per_s']:.1f} tok/s (draft share {100 * r['draft_time_share']:.0f}%)"]
    if r.get("speedup") is not None:
        base = "stock vLLM, no speculation" if r.get("engine") == "vllm" else "block size 1"
        lines.append(f"  speedup over {base}: {r['speedup']:.2f}x  (baseline {r['baseline_tokens_per_s']:.1f} tok/s)")
    ng = r.get("ngram")
    if ng:
        lines.append(f"  stock vLLM prompt lookup, {ng['num_speculative_tokens']} tokens, same prompts: τ "
                     f"{ng['acceptance_length']:.3f}"
                     + (f" ({ng['tokens_per_forward']:.3f} tokens per target forward)"
                        if ng.get("tokens_per_forward") is not None else "")
                     + ", per position "
                     + " ".join(f"{x:.2f}" for x in ng["per_position_acceptance"])
                     + (f", speedup {ng['speedup']:.2f}x" if ng.get("speedup") is not None else ""))
    return "\n".join(lines)
