# SPDX-License-Identifier: Apache-2.0
"""Losslessness of the serving benchmark: each configuration's greedy outputs against stock `none` on the same
prompts, every difference explained by the target's top-2 logprob margin where it starts (vllm_dflash.exactness),
and the per-configuration tally of the JSON's `losslessness` block."""
from __future__ import annotations

from typing import Any

from vllm_dflash import settings
from vllm_dflash.bench.configs import BenchConfig


def own_f32_gemm(cfg: BenchConfig, dtype: str) -> bool:
    """Do this configuration's float32 linear layers run on our GEMM (DFLASH_CPU_GEMM_F32 on this CPU), while stock
    `none` runs oneDNN's? Only in a server where the plugin acts: a DFlash engine with our drafter, or the opt-in
    DFLASH_VLLM_EXTRAS=all."""
    from vllm_dflash.integration.patches.cpu_gemv import runs_own_f32_gemm

    if cfg.stock or dtype != "float32":
        return False
    ours = cfg.env.get("DFLASH_DRAFTER", cfg.spec_extra.get("drafter", "ours")) == "ours"
    if not (cfg.env.get("DFLASH_VLLM_EXTRAS") == "all" or (cfg.method == "dflash" and ours)):
        return False
    return runs_own_f32_gemm(cfg.env.get("DFLASH_CPU_GEMM_F32", settings.PROCESS_FIELDS["cpu_gemm_f32"].default))


def exactness(server: Any, tokenizer: Any, items: list[dict[str, Any]], base: dict[str, Any],
              run: dict[str, Any], kernels_differ: bool = False) -> dict[str, Any]:
    """Greedy outputs vs `none` on the same prompts; each difference explained by the target's top-2 logprob margin
    at its first differing token (vllm_dflash.exactness: float32 must be identical, bf16 may differ at near-ties;
    kernels_differ: float32 through our GEMM against stock oneDNN, near-ties within F32_KERNELS_NATS).
    Compared on the servers' token ids where both runs have them (else on the re-encoded text)."""
    from vllm_dflash.exactness import explain, server_ids, summarize

    by_id = {it["id"]: it for it in items}
    outputs, tok = run["outputs"], run.get("token_ids") or {}
    ids = [i for i in outputs if i in base["outputs"]]
    divs = []
    for i in ids:  # explain: None when the outputs are identical
        a, b = (base["token_ids"].get(i) or {}), (tok.get(i) or {})
        d = explain(server.url, tokenizer, by_id[i], base["outputs"][i], outputs[i], server.dtype,
                    ids=server_ids(a.get("prompt"), a.get("output"), b.get("output")), kernels_differ=kernels_differ)
        if d:
            divs.append(d)
    return summarize(len(ids), divs, server.dtype, kernels_differ)


def losslessness(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per configuration: identical / compared, near-ties (bf16 numerics, explained) and real differences."""
    per: dict[str, dict[str, Any]] = {}
    for r in runs:
        if r.get("vs_baseline"):
            v = per.setdefault(r["config"], {"identical": 0, "compared": 0, "near_ties": 0, "real": 0, "unjudged": 0,
                                             "margins": []})
            ex = r.get("exactness")
            if ex:  # judged on the servers' token ids (or the texts where a run has none)
                for k in ("identical", "compared", "near_ties", "real", "unjudged"):
                    v[k] += ex.get(k, 0)
                v["margins"] += [d["margin"] for d in ex.get("divergences", []) if d["near_tie"]]
            else:  # not judged: every text difference counts as real
                v["identical"] += r["vs_baseline"]["identical"]
                v["compared"] += r["vs_baseline"]["compared"]
                v["real"] += r["vs_baseline"]["compared"] - r["vs_baseline"]["identical"]
    return {"per_config": per, "mismatches": sum(v["compared"] - v["identical"] for v in per.values()),
            "real": sum(v["real"] for v in per.values()), "unjudged": sum(v["unjudged"] for v in per.values())}
