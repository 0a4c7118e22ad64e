# SPDX-License-Identifier: Apache-2.0
"""Benchmark report: the markdown table (with settings, layout and losslessness) and two PNG plots
(speedup vs concurrency per configuration; acceptance rate by draft position)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vllm_dflash import exactness
from vllm_dflash.bench.categories import CAPTION, render_categories


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "–" if x is None else fmt.format(x)


def _pcts(s: dict[str, float | None]) -> str:
    return " / ".join(_f(s.get(k), "{:.0f}") for k in ("p50", "p90", "p99"))


def aggregate_acceptance(runs: list[dict[str, Any]]) -> dict[tuple[str, str], list[float]]:
    """Per (prompt set, config): acceptance rate by draft position over all its concurrency levels
    (sum of accepted at position k / sum of drafts)."""
    acc: dict[tuple[str, str], tuple[list[float], float]] = {}
    for r in runs:
        sd = r.get("spec_decode")
        if not r.get("ok") or not sd or not sd["drafts"]:
            continue
        key = (r["prompt_set"], r["config"])
        tot, drafts = acc.get(key, ([], 0.0))
        per = sd["per_position_accepted"]
        tot = [(tot[i] if i < len(tot) else 0.0) + (per[i] if i < len(per) else 0.0)
               for i in range(max(len(tot), len(per)))]
        acc[key] = (tot, drafts + sd["drafts"])
    return {k: [a / d for a in tot] for k, (tot, d) in acc.items()}


def render_table(runs: list[dict[str, Any]]) -> str:
    """The main results table, one row per run (prompt set, concurrency, configuration)."""
    lines = ["| prompts | concurrency | configuration | output tok/s | speedup | over none+extras | τ "
             "| tokens / forward | tokens / chunk | limit tok/s (bound) | of limit | TTFT p50 / p90 / p99 (ms) "
             "| TPOT p50 / p90 / p99 (ms) | greedy identical to none | load avg 1m |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        if not r.get("ok"):
            lines.append(f"| {r['prompt_set']} | {r['concurrency']} | {r['config']} | failed: {r.get('error', '?')} "
                         "| | | | | | | | | | | |")
            continue
        sd, vs = r.get("spec_decode") or {}, r.get("vs_baseline")
        load = "–" if not r.get("loadavg_1m") else "{:.1f}–{:.1f}".format(*r["loadavg_1m"])  # machine noise
        same = "–" if vs is None else _exact_cell(vs, r.get("exactness"))
        lines.append(f"| {r['prompt_set']} | {r['concurrency']} | {r['config']} | {_f(r['output_tok_s'])} "
                     f"| {speedup_cell(r)} | {over_cell(r)} | {_f(sd.get('tau'), '{:.2f}')} "
                     f"| {_f(sd.get('tokens_per_forward'), '{:.2f}')} | {_f(r.get('tokens_per_chunk'), '{:.2f}')} "
                     f"| {_limit_cells(r.get('limit'))} "
                     f"| {_pcts(r['ttft_ms'])} "
                     f"| {_pcts(r['tpot_ms'])} | {same} | {load} |")
    return "\n".join(lines)


ROUND_SPREAD_NOTE = ("in brackets, for a run in interleaved rounds: the lowest and highest speed-up of a single round, "
                     "each round sending the same prompts to every configuration back to back, so their spread is how "
                     "far the machine's drift moves the figure")


def round_spread(r: dict[str, Any]) -> str:
    """' (0.98–1.09)': the lowest and highest per-round speed-up of a run interleaved in rounds
    (stats.paired_ratios), or '' for a run without paired rounds."""
    return spread(r.get("speedup_rounds"))


def spread(rounds: list[float] | None) -> str:
    """' (0.98–1.09)': the lowest and highest of per-round ratios, or '' without them."""
    return f" ({min(rounds):.2f}–{max(rounds):.2f})" if rounds else ""


def speedup_cell(r: dict[str, Any]) -> str:
    """'1.04×', with `round_spread` after it ('1.04× (0.98–1.09)')."""
    return _f(r.get("speedup"), "{:.2f}×") + round_spread(r)


def run_kind(meta: dict[str, Any]) -> str:
    """'avx512_bf16, bfloat16': the CPU kind (meta machine.cpu_class) and the dtype of a run. Results written before
    the kind was recorded: a Xeon of this project's runs had AMX, an EPYC in bf16 avx512_bf16, else AVX2 (marked
    'inferred')."""
    mach, dtype = meta.get("machine", {}), meta.get("engine", {}).get("dtype", "?")
    kind = mach.get("cpu_class")
    if kind is None:
        cpu = mach.get("cpu", "")
        kind = ("AMX" if "Xeon" in cpu else "avx512_bf16" if dtype in ("bfloat16", "auto") else "AVX2") + " (inferred)"
    return f"{kind}, {dtype}"


def over_cell(r: dict[str, Any], baseline: str = "none+extras") -> str:
    """'0.97× (0.95–0.99)': output tok/s over `baseline` at the same level, its per-round spread (stats.attach_over),
    '–' where the run has no such baseline (a result without it, or the baseline itself)."""
    o = (r.get("over") or {}).get(baseline)
    if o is None:
        return "–"
    return f"{o['ratio']:.2f}×" + spread(o.get("rounds"))


def _limit_cells(lim: dict[str, Any] | None) -> str:
    """'limit (memory|compute) | fraction' of a run (bench/limit.py), or dashes for a result without one."""
    if not lim:
        return "– | –"
    return f"{lim['limit_tok_s']:.0f} ({lim['bound']}) | {100 * lim['fraction']:.0f} %"


def _exact_cell(vs: dict[str, Any], ex: dict[str, Any] | None) -> str:
    """identical/compared, then near-ties (bf16 numerics, with the largest margin) and real differences."""
    cell = f"{vs['identical']}/{vs['compared']}"
    diff = vs["compared"] - vs["identical"]
    if not diff:
        return cell
    near = (ex or {}).get("near_ties", 0)
    unj = (ex or {}).get("unjudged", 0)
    if near:
        cell += f" + {near} near-tie{'s' if near > 1 else ''} (margin ≤ {ex['max_near_tie_margin']:.2f})"
    if unj:
        cell += f" + {unj} not judged"
    return cell + (f" **{diff - near - unj} MISMATCH**" if diff - near - unj else "")


def render_acceptance(runs: list[dict[str, Any]]) -> str:
    agg = aggregate_acceptance(runs)
    if not agg:
        return "(no drafts)"
    width = max(len(v) for v in agg.values())
    lines = ["| prompts | configuration | " + " | ".join(f"pos {k + 1}" for k in range(width)) + " |",
             "|---|---|" + "---|" * width]
    for (ps, cfg), rates in sorted(agg.items()):
        cells = [f"{x:.3f}" for x in rates] + [""] * (width - len(rates))
        lines.append(f"| {ps} | {cfg} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_adaptive(runs: list[dict[str, Any]]) -> str | None:
    """What adaptive drafting chose, per run: share of request-steps per source, mean draft length, and each
    source's acceptance rate (accepted / drafted tokens)."""
    rows = [r for r in runs if r.get("ok") and r.get("adaptive")]
    if not rows:
        return None
    lines = ["| prompts | concurrency | configuration | DFlash | n-gram | merged | none | mean draft len "
             "| accept DFlash | accept n-gram | accept merged |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a = r["adaptive"]
        sh, ar = a["share"], a["acceptance_rate"]
        lines.append(f"| {r['prompt_set']} | {r['concurrency']} | {r['config']} | {sh['dflash']:.0%} | "
                     f"{sh['ngram']:.0%} | {sh.get('merged', 0.0):.0%} | {sh['none']:.0%} "
                     f"| {a['mean_draft_len']:.2f} | {_f(ar['dflash'], '{:.2f}')} | {_f(ar['ngram'], '{:.2f}')} "
                     f"| {_f(ar.get('merged'), '{:.2f}')} |")
    return "\n".join(lines)


def render_time_split(runs: list[dict[str, Any]]) -> str | None:
    """Where a run's wall time goes, measured in the worker: our draft forward and KV injection (our drafter only),
    the target forward (verification: the target's pass over [token, drafts] per request; every configuration since
    0.2.0), and the rest (sampling, rejection, input preparation, other drafters, scheduling and other host work not
    overlapped); per target forward (one per engine step), its time and the rest of the wall time."""
    rows = [r for r in runs if r.get("ok") and r.get("time_split_s")]
    if not rows:
        return None
    lines = ["| prompts | concurrency | configuration | wall s | draft forward | KV injection | target forward "
             "(verify) | host + other | target forwards | ms per forward | other ms per forward |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = r["time_split_s"]
        w = t["wall"] or 1.0
        tf = t.get("target_forward", 0.0)
        rest = max(w - t["draft_forward"] - t["kv_injection"] - tf, 0.0)
        n = t.get("target_forwards") or 0
        per = f"{tf / n * 1e3:.1f} | {(w - tf) / n * 1e3:.1f}" if n and tf else "– | –"
        lines.append(f"| {r['prompt_set']} | {r['concurrency']} | {r['config']} | {w:.1f} "
                     f"| {t['draft_forward'] / w:.0%} | {t['kv_injection'] / w:.1%} "
                     f"| {_f(tf / w if tf else None, '{:.0%}')} | {rest / w:.0%} | {n or '–'} | {per} |")
    return "\n".join(lines)


def _limit_inputs(rec: dict[str, Any] | None) -> str:
    if not rec:
        return ""
    hw, m = rec["hardware"], rec["model"]
    return (f". Inputs, measured before the servers started on {hw['threads']} thread(s): read bandwidth "
            f"{hw['read_gb_s']:.1f} GB/s, {hw['dtype']} GEMM {hw['gemm_tflops'] * 1e3:.0f} GFLOP/s at the target's "
            f"MLP shape {tuple(hw['gemm_shape'])} ({hw.get('gemm_op', 'torch')}'s); "
            f"target {m['params'] / 1e6:.1f} M parameters, "
            f"{m['weight_bytes'] / 1e6:.0f} MB"
            + (f". The weights fit in this CPU's {hw['l3_bytes'] / 2**20:.0f} MiB L3 cache, so a step need not stream "
               "them from DRAM: the memory bound understates what this machine allows, and fractions of it are "
               "overstated" if hw.get("l3_bytes") and m["weight_bytes"] < hw["l3_bytes"] else ""))


def idle_servers_worst(result: dict[str, Any]) -> tuple[float, float, float] | None:
    """Interleaved runs: the run whose idle servers used the largest share of the machine, as (their CPU seconds,
    the run's wall seconds, percent of the machine's cores); None when no run recorded it."""
    idle = [(r["idle_servers_cpu_s"], r["wall_s"]) for r in result["runs"]
            if r.get("ok") and "idle_servers_cpu_s" in r and r["wall_s"]]
    if not idle:
        return None
    cpu, wall = max(idle, key=lambda x: x[0] / x[1])
    return cpu, wall, 100 * cpu / (wall * (result["meta"]["machine"].get("cores") or 1))


def outside_worst(result: dict[str, Any]) -> tuple[dict[str, Any], float, float] | None:
    """The run that other processes (idle servers, the client, anything else on the machine) competed with most, as
    (the run, their CPU seconds, percent of the machine's cores over its wall time); None when no run recorded it."""
    rows = [(r, sum(r["outside_cpu_s"].values())) for r in result["runs"]
            if r.get("ok") and r.get("outside_cpu_s") is not None and r.get("wall_s")]
    if not rows:
        return None
    cores = result["meta"]["machine"].get("cores") or 1
    run, cpu = max(rows, key=lambda x: x[1] / x[0]["wall_s"])
    return run, cpu, 100 * cpu / (run["wall_s"] * cores)


def render_markdown(result: dict[str, Any]) -> str:
    """The run's markdown page; a result written before schema 2 is shown under today's configuration names
    (meta.upgrade)."""
    from vllm_dflash.bench.meta import upgrade

    from vllm_dflash.bench.stats import EXTRAS_BASELINE, attach_over

    result = upgrade(result)
    attach_over(result["runs"], EXTRAS_BASELINE)  # results written before the column had it computed
    m = result["meta"]
    eng, lay = m["engine"], m["layout"]
    out = [f"# Serving benchmark `{m['name']}`", "",
           f"{m['started']}; vllm_dflash {m['versions']['vllm_dflash']}, vLLM {m['versions']['vllm']}, "
           f"torch {m['versions']['torch']}; machine: {m['machine']['cpu']} ({m['machine']['cores']} cores; kind "
           f"**{run_kind(m)}**), "
           f"load average at start {m['machine']['loadavg_start']}, at end {m['machine'].get('loadavg_end')}.", "",
           f"- target: `{m['target']}`; draft: `{m['draft']}`"
           + ("" if m["draft_trained"] else " (**UNTRAINED**: τ ≈ 1 and a slowdown are expected)"),
           f"- workload: {workload_text(m.get('temperature') or 0.0)}, max_tokens {m['max_tokens']}, "
           f"ignore_eos {m['ignore_eos']}, "
           f"prompt sets {', '.join(m['prompt_sets'])}, {prompts_per_run_text(m)}, "
           f"concurrency {', '.join(map(str, m['concurrency']))}; streaming OpenAI chat clients (asyncio); "
           "one warm-up request per prompt set before measuring",
           f"- engine (every configuration): `vllm serve --dtype {eng['dtype']}"
           f"{' --enforce-eager' if eng.get('enforce_eager', True) else ''} --max-model-len "
           f"{eng['max_model_len']} --max-num-seqs {eng['max_num_seqs']}`, "
           f"VLLM_CPU_KVCACHE_SPACE={eng['kv_cache_gib']} GiB, OMP_NUM_THREADS={lay['omp_num_threads']}, "
           f"VLLM_CPU_OMP_THREADS_BIND={lay['cpu_bind']}, "
           f"DFLASH_CPU_GEMV={eng.get('cpu_gemv', 0) or 'off'}, "
           + (f"DFLASH_CPU_GEMM_F32={eng['cpu_gemm_f32']} (`@onednn` configurations: off), " if "cpu_gemm_f32" in eng
              else "")
           + (f"LD_PRELOAD={lay['ld_preload']}" if lay.get("ld_preload") else "no LD_PRELOAD (vLLM warns that CPU "
              "speculative decoding is slower without Intel OpenMP preloaded)"),
           f"- layout: {lay['description']}"]
    idle = idle_servers_worst(result)
    if idle:
        cpu, wall, pct = idle
        out.append(f"  - idle servers during a run: at most {cpu:.1f} CPU-s over its {wall:.1f} s "
                   f"({pct:.1f} % of the machine)")
    worst = outside_worst(result)
    if worst:
        run, cpu, pct = worst
        top = ", ".join(f"{k} {v:.1f}" for k, v in list(run["outside_cpu_s"].items())[:4])
        out.append(f"  - other processes during a run: at most {cpu:.1f} CPU-s over its {run['wall_s']:.1f} s "
                   f"({pct:.1f} % of the machine; {run['config']}, {run['prompt_set']}, c{run['concurrency']}"
                   + (f": {top}" if top else "") + ")")
    for name, c in result["configs"].items():
        procs = [p for p in c.get("processes") or [] if "resource_tracker" not in p["cmd"]]
        if procs:  # the API server's command line is long: its pid stands for it
            out.append(f"  - {name}: " + "; ".join(
                f"{p['cmd'] if p['cmd'].startswith('VLLM::') else 'API server'} cpus {p['cpus_allowed']} "
                f"({p['threads']} threads)" for p in procs)
                + (f"; vLLM OMP binding: {', '.join(c['omp_binding'])}" if c.get("omp_binding") else ""))
    out += ["", "## Configurations", "", "| name | description | speculative config | env | status |",
            "|---|---|---|---|---|"]
    for name, c in result["configs"].items():
        status = c["status"] + (f": {c['reason']}" if c.get("reason") else "")
        env = ", ".join(f"{k}={v}" for k, v in c["env"].items()) or "–"
        spec = f"`{json.dumps(c['speculative_config'])}`" if c["speculative_config"] else "–"
        out.append(f"| {name} | {c['description']} | {spec} | {env} | {status} |")
    out += ["", "## Results", "", "speedup = output tok/s over `none` (stock vLLM, no speculation) at the same prompt "
            "set and concurrency ("
            + ROUND_SPREAD_NOTE + "); over none+extras = the same over `none+extras` (our engine's CPU speed-ups "
            "without speculation: what speculation itself adds; '–' where the run has no such row); "
            "τ = 1 + accepted / drafts from vLLM's spec-decode counters (delta over the run); tokens / forward = "
            "generated tokens / request-steps, steps without drafts included (counted by adaptive drafting only; "
            "with a fixed block every decode step verifies drafts, so τ is it there); tokens / chunk = completion "
            "tokens / streamed chunks with text, measured by the client for every configuration (vLLM streams one "
            "chunk per engine step of a request, so this is tokens per target forward for n-gram too; an upper "
            "estimate, since a step whose tokens decode to no text joins the next chunk: `none` shows the size of "
            "that effect); limit = the hardware bound of the run's shape (bench/limit.py: max(weights / measured "
            "read bandwidth, query tokens × 2 × parameters / measured GEMM rate) per step, c × tokens per forward "
            "per step; attention and host work left out, so it is optimistic)"
            + _limit_inputs(result["meta"].get("limit")), "",
            render_table(result["runs"]), "", "## Acceptance rate by draft position (all concurrency levels)", "",
            render_acceptance(result["runs"]), ""]
    cats = render_categories(result["runs"])
    if cats:
        out += ["## Open chat per category", "", CAPTION + ".", "", cats, ""]
    ts = render_time_split(result["runs"])
    if ts:
        out += ["## Where the wall time goes (share of wall time; per target forward)", "", ts, ""]
    ad = render_adaptive(result["runs"])
    if ad:
        out += ["## Adaptive drafting choices (share of request-steps by source)", "", ad, ""]
    out += ["## Losslessness (greedy outputs vs `none`, stock vLLM)", ""]
    ll = result["losslessness"]
    dtype = result["meta"]["engine"]["dtype"]
    out.append(f"Model dtype {dtype}: " + ("greedy outputs must be identical token for token." if dtype == "float32"
               else "a difference passes only at a numerical near-tie of the target (the two outputs took its two most "
                    "likely tokens, at most vllm_dflash.exactness.NEAR_TIE_NATS apart); bf16 CPU GEMMs are not "
                    "batch-invariant, so the target alone flips such tokens too. `--dtype float32` is token-exact."))
    out.append("")
    for name, v in ll["per_config"].items():
        out.append(f"- {name}: {v['identical']}/{v['compared']} identical"
                   + (f", {v['near_ties']} near-ties (margins {', '.join(f'{m:.3f}' for m in v['margins'])} nats)"
                      if v.get("near_ties") else "") + (f", **{v['real']} real differences**" if v.get("real") else "")
                   + (f", {v['unjudged']} not judged (the texts did not re-encode to the generated tokens)"
                      if v.get("unjudged") else ""))
    for r in result["runs"]:
        divs = (r.get("exactness") or {}).get("divergences", [])
        for mm in (r.get("vs_baseline") or {}).get("mismatches", []):
            out.append(f"  - differs: {r['config']} / {r['prompt_set']} / c{r['concurrency']} / {mm['id']} at char "
                       f"{mm['first_diff_char']}: none `{mm['base'][:40]!r}` vs `{mm['other'][:40]!r}`")
        for d in divs:
            kind = {"near_tie": "near-tie", "real": "REAL", "unjudged": "NOT JUDGED"}[exactness.kind(d)]
            m = "n/a" if d["margin"] is None else f"{d['margin']:.3f}"
            out.append(f"    - first differing token {d['index']}: {d['base_token']!r} vs {d['other_token']!r}; the "
                       f"target's top 2 {list(d['top2'])!r}, margin {m} nats ({kind})")
    return "\n".join(out) + "\n"


def plot(result: dict[str, Any], out_prefix: Path) -> list[Path]:
    """PNG plots next to the JSON: <prefix>-speedup.png and <prefix>-acceptance.png. Returns the written paths (none,
    with a note, where matplotlib is not installed: it comes with the `train` extra)."""
    try:
        import matplotlib
    except ImportError:
        print("plots skipped: matplotlib is not installed. Fix: pip install matplotlib (or 'vllm-dflash[train]')")
        return []

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in result["runs"] if r.get("ok")]
    sets = list(dict.fromkeys(r["prompt_set"] for r in runs))
    if not sets:
        return []
    written = []
    color = {name: f"C{i}" for i, name in enumerate(result["configs"])}  # one colour per configuration in both plots
    note = "" if result["meta"].get("draft_trained", True) else " (UNTRAINED draft)"
    fig, axes = plt.subplots(1, len(sets), figsize=(5.5 * len(sets), 4), squeeze=False)
    for ax, ps in zip(axes[0], sets, strict=True):
        for cfg in dict.fromkeys(r["config"] for r in runs if r["config"] != "none"):
            pts = sorted(((r["concurrency"], r["speedup"], r.get("speedup_rounds")) for r in runs
                          if r["prompt_set"] == ps and r["config"] == cfg and r.get("speedup") is not None),
                         key=lambda p: p[0])
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=cfg, color=color.get(cfg))
                for c, _, rounds in pts:  # the per-round spread (interleaved runs): a vertical bar at the point
                    if rounds:
                        ax.vlines(c, min(rounds), max(rounds), color=color.get(cfg), linewidth=1, alpha=0.6)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="none (stock vLLM)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(result["meta"]["concurrency"], [str(c) for c in result["meta"]["concurrency"]])
        ax.set(title=f"{ps}: speedup over stock vLLM{note}", xlabel="concurrency", ylabel="output tok/s ÷ none")
        ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(out_prefix.with_name(out_prefix.name + "-speedup.png"))
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    agg = aggregate_acceptance(runs)
    fig, axes = plt.subplots(1, len(sets), figsize=(5.5 * len(sets), 4), squeeze=False)
    for ax, ps in zip(axes[0], sets, strict=True):
        for cfg in result["configs"]:
            rates = agg.get((ps, cfg))
            if rates:
                ax.plot(range(1, len(rates) + 1), rates, marker="o", label=cfg, color=color[cfg])
        ax.set(title=f"{ps}: acceptance by draft position{note}", xlabel="draft position", ylabel="accepted / drafts",
               ylim=(0, 1.02))
        ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(out_prefix.with_name(out_prefix.name + "-acceptance.png"))
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


def workload_text(temperature: float) -> str:
    return "greedy (temperature 0)" if not temperature else f"sampled, temperature {temperature} (outputs not compared)"


def prompts_per_run_text(m: dict[str, Any]) -> str:
    """How a benchmark chose its prompts per run (results before `--waves` used disjoint slices per level)."""
    if "prompts_per_run" not in m:
        return (f"prompts per run = max({m['num_prompts']}, concurrency), a different slice of each set per "
                "concurrency level (no prompt repeats, so no prefix-cache hits between runs)")
    per = ", ".join(f"c{c}: {n}" for c, n in m["prompts_per_run"].items())
    return (f"prompts per run {per} (at least {m['waves']} x concurrency, so the batch stays full for most of a "
            "run), the set's first prompts at every level, the server's prefix cache emptied before each wave")
