# SPDX-License-Identifier: Apache-2.0
"""Generate docs/BENCHMARKS.md (the latest run of each kind, short) and dev/BENCHMARKS-history.md (every run, in
full) from the result files in benchmarks/results/ (the latest) and dev/results/ (the older ones, JSON gzipped).

    python dev/make_bench_docs.py            # write both files
    python dev/make_bench_docs.py --check    # exit 1 if either file is not what the result files give

Every table states the machine, the command and the date of its measurement. What a JSON file does not record
itself (older files have no machine or command field) comes from dev/results_registry.py (with each section's
place and title, and which results are the latest of their kind) and is marked as such in the output. Hand-written
readings of the tables live in dev/benchmark_notes.md (one `## <result stem>` section per result file, plus
`## intro` and `## unbacked`); the history copies them in verbatim, marked as hand-written.

Standard library only, plus the serving benchmark's own renderers and result upgrade (vllm_dflash.bench.report,
vllm_dflash.bench.meta: no torch, no vLLM).
"""
from __future__ import annotations

import argparse
import gzip
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vllm_dflash.bench.categories import CAPTION, render_categories  # noqa: E402
from vllm_dflash.bench.levels import DEFAULT_WAVES  # noqa: E402
from vllm_dflash.bench.meta import upgrade  # noqa: E402
from vllm_dflash.bench.stats import EXTRAS_BASELINE, attach_over  # noqa: E402
from vllm_dflash.bench.report import (  # noqa: E402
    ROUND_SPREAD_NOTE,
    idle_servers_worst,
    prompts_per_run_text,
    render_acceptance,
    render_adaptive,
    render_time_split,
    over_cell,
    round_spread,
    run_kind,
)

sys.path.insert(0, str(REPO / "dev"))
from results_registry import CATEGORY_TABLES, LATEST, MACHINES, MD_SECTIONS, ORDER, PROVENANCE, SERVING_TITLES  # noqa: E402

LATEST_DIR = REPO / "benchmarks" / "results"  # the latest result of each kind, as the entry scripts write it
OLDER_DIR = REPO / "dev" / "results"  # every older result (JSON gzipped)
NOTES = REPO / "dev" / "benchmark_notes.md"
OUT = REPO / "docs" / "BENCHMARKS.md"
HISTORY = REPO / "dev" / "BENCHMARKS-history.md"
# Both outputs sit one folder below the repository, so a link to a repository path is "../" + that path.

BENCH_DEFAULTS = {"prompt_sets": ["humaneval", "chat"], "threads": 1, "kv_cache_gib": 2, "max_model_len": 2048,
                  "num_speculative_tokens": 7}


def result_file(stem: str, ext: str) -> Path | None:
    """benchmarks/results/<stem><ext> or dev/results/<stem><ext> (for .json also .json.gz), whichever exists."""
    for d in (LATEST_DIR, OLDER_DIR):
        for name in (stem + ext, stem + ext + ".gz") if ext == ".json" else (stem + ext,):
            if (d / name).is_file():
                return d / name
    return None


def load(path: Path) -> Any:
    """A result file; a serving result in today's format (bench/meta.py: upgrade renames the configurations of one
    written before schema 2)."""
    d = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())
    return upgrade(d) if isinstance(d, dict) and "runs" in d and "meta" in d else d


def link(path: Path) -> str:
    """A repository path as a link target from docs/ or dev/."""
    return "../" + path.relative_to(REPO).as_posix()


def result_date(stem: str) -> str:
    """Commit date of a result file that records no date of its own: from PROVENANCE (the file may have moved since),
    else from git (YYYY-MM-DD), else 'uncommitted'."""
    if PROVENANCE.get(stem, {}).get("date"):
        return PROVENANCE[stem]["date"] + " (commit date of the JSON)"
    path = result_file(stem, ".json")
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%cs", "--", str(path.relative_to(REPO))], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError, AttributeError):
        out = ""
    return (out or "uncommitted") + " (commit date of the JSON)"


def machine(stem: str, recorded_cpu: str | None = None) -> str:
    """The machine kind of a result, checked against the CPU name the JSON records (when it records one)."""
    key = PROVENANCE.get(stem, {}).get("machine")
    if key is None:
        return recorded_cpu or "not recorded"
    m = MACHINES[key]
    if recorded_cpu is not None and m["cpu"] not in recorded_cpu:
        raise SystemExit(f"make_docs: {stem}: PROVENANCE says {key!r} but the JSON records CPU {recorded_cpu!r}. "
                         "Fix: correct PROVENANCE")
    return m["kind"] if recorded_cpu else f"{m['kind']} (not recorded in the JSON)"


def read_notes() -> dict[str, str]:
    """benchmark_notes.md split at its `## name` headings."""
    if not NOTES.is_file():
        return {}
    notes: dict[str, str] = {}
    name = None
    for line in NOTES.read_text().splitlines():
        if line.startswith("## "):
            name = line[3:].strip()
            notes[name] = ""
        elif name is not None:
            notes[name] += line + "\n"
    return {k: v.strip() for k, v in notes.items()}


def split_note(command: str) -> tuple[str, str]:
    """A recorded command line and the note some results append to it in brackets ("CMD (OMP_NUM_THREADS=2)"),
    apart, so that the quoted command is one a shell (and `vllm-dflash`'s parser) accepts."""
    m = re.fullmatch(r"(.*?\S)\s+\(([^()]*)\)", command)
    return (m.group(1), m.group(2)) if m else (command, "")


def quoted(command: str) -> str:
    """`command` in backticks, a note recorded with it after them in brackets."""
    cmd, note = split_note(command)
    return f"`{cmd}`" + (f" ({note})" if note else "")


def provenance_block(date: str, mach: str, command: str, extra: str = "", command_note: str = "") -> list[str]:
    cmd, note = split_note(command)
    note = "; ".join(n for n in (note, command_note) if n)
    cmd = f"- command: `{cmd}`" + (f" ({note})" if note else "")
    return [f"- date: {date}", f"- machine: {mach}", cmd] + ([f"- {extra}"] if extra else [])


NOT_RECORDED = "not recorded in the JSON; from dev/results_registry.py"


def hand(notes: dict[str, str], key: str) -> list[str]:
    text = notes.get(key)
    return ["", "**Reading (hand-written, dev/benchmark_notes.md):**", "", text] if text else []


# ---- serving benchmark (vllm-dflash bench) ----------------------------------------------------------------------

def bench_command(m: dict[str, Any], configs: list[str]) -> str:
    """The `vllm-dflash bench` command line that reproduces a run's recorded settings with today's CLI."""
    if m.get("quick"):
        cmd = ["vllm-dflash bench --quick"]
    else:
        cmd = [f"vllm-dflash bench --configs {','.join(configs)}"]
        if m["prompt_sets"] != BENCH_DEFAULTS["prompt_sets"]:
            cmd.append(f"--prompt-sets {','.join(m['prompt_sets'])}")
        cmd += [f"--concurrency {','.join(map(str, m['concurrency']))}", f"--num-prompts {m['num_prompts']}",
                *([f"--waves {m.get('waves', 1)}"] if m.get("waves", 1) != DEFAULT_WAVES else []),
                f"--max-tokens {m['max_tokens']}"] + ([f"--temperature {m['temperature']}"]
                                                      if m.get("temperature") else [])
    eng, lay = m["engine"], m["layout"]
    cmd.append(f"--dtype {eng['dtype']}")
    if eng.get("enforce_eager", True):
        cmd.append("--enforce-eager")
    if m.get("ignore_eos"):
        cmd.append("--ignore-eos")
    if m.get("num_speculative_tokens") not in (None, BENCH_DEFAULTS["num_speculative_tokens"]):
        cmd.append(f"--num-spec-tokens {m['num_speculative_tokens']}")
    if not m.get("quick"):  # the layout, always explicit (the full run's default changed in 0.2.0)
        bind = str(lay.get("cpu_bind", "auto"))
        bind = "auto" if bind.startswith("auto") else bind
        cmd.append(f"--threads {lay.get('omp_num_threads', 1)} --cpu-bind {bind}")
    if eng.get("kv_cache_gib") != BENCH_DEFAULTS["kv_cache_gib"]:
        cmd.append(f"--kv-cache-gib {eng['kv_cache_gib']}")
    if eng.get("max_model_len") != BENCH_DEFAULTS["max_model_len"]:
        cmd.append(f"--max-model-len {eng['max_model_len']}")
    if eng.get("cpu_gemv"):
        cmd.append(f"--cpu-gemv {eng['cpu_gemv']}")
    if m.get("interleave"):
        cmd.append(f"--interleave {m['interleave']}")
        if m.get("min_rounds", 1) > 1:
            cmd.append(f"--min-rounds {m['min_rounds']}")
    cmd += [f"--spec-extra {x}" for x in m.get("spec_extra", [])] + [f"--env {x}" for x in m.get("env_extra", [])]
    if m.get("hinted_draft") and "ours-hinted" in configs:
        cmd.append(f"--hinted-draft {Path(m['hinted_draft']).name}")
    if not m.get("quick"):
        cmd.append(f"--name {m['name']}")
    return " ".join(cmd)


def _cell(r: dict[str, Any] | None, best: bool) -> str:
    if r is None:
        return "–"
    if not r.get("ok"):
        return "failed"
    if r["config"] == "none":
        return f"{r['output_tok_s']:.1f} tok/s"
    sd = r.get("spec_decode") or {}
    sp = r.get("speedup")
    head = "–" if sp is None else (f"**{sp:.2f}×**" if best else f"{sp:.2f}×")
    if sp is not None:
        head += round_spread(r)  # interleaved rounds: the lowest and highest round's speed-up
    tau = f"τ {sd['tau']:.2f}" if sd.get("tau") is not None else "no drafts"
    tpf = sd.get("tokens_per_forward")
    if tpf is not None:
        return f"{head} · {tpf:.2f} ({tau})"
    g, acc = sd.get("generated_tokens") or r.get("server_generation_tokens"), sd.get("accepted")
    if g and acc is not None and g > acc:  # every request-step yields 1 + its accepted drafts
        return f"{head} · ≈{g / (g - acc):.2f} ({tau})"
    return f"{head} ({tau})"


def pivot(result: dict[str, Any]) -> str:
    """Configurations x (prompt set, concurrency): tok/s for `none`, speedup · tokens per forward (τ) for the rest;
    the best speedup of each column in bold."""
    runs = result["runs"]
    cols = [(ps, c) for ps in result["meta"]["prompt_sets"] for c in result["meta"]["concurrency"]]
    by = {(r["config"], r["prompt_set"], r["concurrency"]): r for r in runs}
    best: dict[tuple[str, int], set[str]] = {}
    for col in cols:  # the best speedup as shown (2 decimals); ties all in bold
        sps = [(round(r.get("speedup") or 0.0, 2), r["config"]) for r in runs
               if (r["prompt_set"], r["concurrency"]) == col and r["config"] != "none" and r.get("ok")]
        top = max((x for x, _ in sps), default=None)
        best[col] = {name for x, name in sps if x == top}
    lines = ["| configuration | " + " | ".join(f"{ps} c{c}" for ps, c in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for name in result["configs"]:
        cells = [_cell(by.get((name, ps, c)), name in best[(ps, c)]) for ps, c in cols]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if EXTRAS_BASELINE in result["configs"]:  # what speculation adds over our engine without it
        attach_over(runs, EXTRAS_BASELINE)
        for name in result["configs"]:
            if name not in ("none", EXTRAS_BASELINE) and "+extras" not in name:
                cells = [over_cell(by[(name, ps, c)]) if (name, ps, c) in by else "–" for ps, c in cols]
                lines.append(f"| {name} / {EXTRAS_BASELINE} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def greedy_summary(result: dict[str, Any]) -> str:
    ll = result["losslessness"]["per_config"]
    parts = []
    for name, v in ll.items():
        s = f"{name} {v['identical']}/{v['compared']}"
        if v.get("near_ties"):
            s += f" (+{v['near_ties']} near-ties, max margin {max(v['margins']):.2f} nats)"
        if v.get("real"):
            s += f" (**{v['real']} recorded as real**)"
        parts.append(s)
    return "; ".join(parts)


def serving_section(stem: str, result: dict[str, Any], notes: dict[str, str]) -> list[str]:
    m = result["meta"]
    eng = m["engine"]
    title = SERVING_TITLES.get(stem, f"Serving benchmark {stem}")
    mode = "eager" if eng.get("enforce_eager", True) else "compiled (torch.compile, vLLM's default)"
    out = [f"## {title}", ""]
    out += provenance_block(
        m["started"], machine(stem, m["machine"]["cpu"]), bench_command(m, list(result["configs"])),
        f"engine: `vllm serve --dtype {eng['dtype']}`, {mode}, OMP_NUM_THREADS={m['layout']['omp_num_threads']}, "
        f"max_model_len {eng['max_model_len']}, max_num_seqs {eng['max_num_seqs']}; vllm_dflash "
        f"{m['versions']['vllm_dflash']}, vLLM {m['versions']['vllm']}, torch {m['versions']['torch']}; "
        f"load average {m['machine']['loadavg_start'][0]:.1f} at start, {m['machine']['loadavg_end'][0]:.1f} at end; "
        f"{m['elapsed_s'] / 60:.0f} min")
    draft = ("no DFlash draft" if not m["draft"] else f"draft `{Path(m['draft']).name}`"
             + ("" if m["draft_trained"] else " (**UNTRAINED** draft: τ ≈ 1 expected)"))
    spec_k = f"{m['num_speculative_tokens']} drafts per step at most" if m["num_speculative_tokens"] else \
        "draft lengths as configured"
    out += [f"- workload: {draft}, {spec_k}, {workload(m)}, up to "
            f"{m['max_tokens']} tokens, {prompts_per_run_text(m)}; streaming OpenAI chat clients",
            f"- per-run details (TTFT, TPOT, every output difference): "
            f"[{result_file(stem, '.md').relative_to(REPO)}]({link(result_file(stem, '.md'))})"]
    if m.get("interleave"):
        worst = idle_servers_worst(result)
        out.append(f"- interleaved (`--interleave {m['interleave']}`): every server up at once; per prompt set and "
                   "concurrency the configurations ran back to back, the prompts split into rounds (each of at least "
                   "`concurrency` prompts; rounds per level: " + ", ".join(
                       f"c{c} {n}" for c, n in sorted({r["concurrency"]: r.get("rounds", 1) for r in result["runs"]
                                                        if r.get("ok")}.items()))
                   + ") in an order rotated per round; a run's wall time is the sum of its rounds"
                   + (f"; a level whose prompts could not be split into {m['min_rounds']} rounds sent all of them in "
                      f"each of {m['min_rounds']} rounds (`--min-rounds`)" if m.get("min_rounds", 1) > 1 else "")
                   + (f"; idle servers used at most {worst[2]:.1f} % of the machine during a run" if worst else ""))
    out += [""]
    out += ["Cells: output tok/s for `none`; for the others speedup over `none` at the same prompt set and "
            "concurrency · tokens per target forward, every request-step counted (vLLM's τ, per step that "
            "verified drafts). Tokens per forward is counted by adaptive drafting; marked ≈ it is derived from "
            "vLLM's counters as generated / (generated − accepted), since each request-step yields one token plus "
            "its accepted drafts. Best speedup per column in bold." + (
                f" {ROUND_SPREAD_NOTE[0].upper()}{ROUND_SPREAD_NOTE[1:]}."
                if any(r.get("speedup_rounds") for r in result["runs"]) else ""),
            "", pivot(result), "",
            *([] if m.get("temperature") else
              [f"Greedy outputs identical to `none` ({eng['dtype']}): {greedy_summary(result)}."]), ""]
    out += categories_section(result)
    lim = limit_table(result)
    if lim:
        out += lim
    ts = render_time_split(result["runs"])
    if ts:
        note = ("" if any((r.get("time_split_s") or {}).get("target_forward") for r in result["runs"])
                else " The target forward was not timed in this run (`DFLASH_PROFILE=1` times it; runs before it "
                     "existed, and compiled runs before 0.2.0, have no such figure), so \"host + other\" includes "
                     "verification.")
        out += ["Where the wall time goes (measured in the worker)." + note, "", ts, ""]
    ad = render_adaptive(result["runs"])
    if ad:
        out += ["Adaptive drafting choices (share of request-steps by source; acceptance = accepted / drafted "
                "tokens):", "", ad, ""]
    out += ["Acceptance rate by draft position (all concurrency levels):", "", render_acceptance(result["runs"])]
    return out + hand(notes, stem)


def limit_table(result: dict[str, Any]) -> list[str]:
    """Output tok/s as a fraction of each run's hardware bound (vllm_dflash/bench/limit.py), when the JSON has it."""
    rec = result["meta"].get("limit")
    runs = [r for r in result["runs"] if r.get("ok") and r.get("limit")]
    if not rec or not runs:
        return []
    hw, m = rec["hardware"], rec["model"]
    sets = list(dict.fromkeys(r["prompt_set"] for r in runs))
    levels = sorted({r["concurrency"] for r in runs})
    configs = list(dict.fromkeys(r["config"] for r in runs))
    cell = {(r["config"], r["prompt_set"], r["concurrency"]): r for r in runs}
    head = [f"{ps} c{c}" for ps in sets for c in levels]
    out = [f"Fraction of the hardware limit: output tok/s over the bound of each run's own shape (`bench/limit.py`: "
           f"per step max(weights / read bandwidth, query tokens × 2 × parameters / GEMM rate), c × tokens per "
           f"forward per step; attention and host work left out, so the bound is optimistic). Measured before the "
           f"servers started, on {hw['threads']} thread(s) (the worker's): read {hw['read_gb_s']:.1f} GB/s, "
           f"{hw['dtype']} GEMM {hw['gemm_tflops'] * 1e3:.0f} GFLOP/s; target {m['params'] / 1e6:.1f} M "
           f"parameters ({m['weight_bytes'] / 1e6:.0f} MB). Cells: fraction (limit tok/s, m = memory-bound, "
           "c = compute-bound).", "", "| configuration | " + " | ".join(head) + " |",
           "|---|" + "---:|" * len(head)]
    for cfg in configs:
        cells = []
        for ps in sets:
            for c in levels:
                r = cell.get((cfg, ps, c))
                if r is None:
                    cells.append("–")
                    continue
                lim = r["limit"]
                cells.append(f"{100 * lim['fraction']:.0f} % ({lim['limit_tok_s']:.0f} {lim['bound'][0]})")
        out.append(f"| {cfg} | " + " | ".join(cells) + " |")
    return out + [""]


# ---- the other result files ---------------------------------------------------------------------------------------

def eval_section(stem: str, d: dict[str, Any], notes: dict[str, str]) -> list[str]:
    pos = ", ".join(f"{x:.3f}" for x in d["per_position_acceptance"])
    ng = d.get("ngram") or {}
    version = f" (bundled draft version {d.get('draft_version') or 1})"
    what = "HumanEval, all 164 prompts" if d["prompts"] == "humaneval" and d["num_prompts"] == 164 else \
        f"the {d['prompts']} set, {d['num_prompts']} prompts"
    key = PROVENANCE.get(stem, {}).get("machine")
    out = [f"## Acceptance through vLLM: {what}{version}{f', {key}' if key else ''}", ""]
    recorded = next((m["cpu"] for m in MACHINES.values() if m["cpu"] in d.get("machine", "")), None)
    out += provenance_block(result_date(stem),
                            machine(stem, recorded)
                            + (f"; recorded: {d['machine']}" if d.get("machine") else ""), d["command"])
    out += [f"- workload: {d['num_prompts']} {d['prompts']} prompts, block {d['block_size']}, diffusion steps "
            f"{d['diffusion_steps']}, up to {d['max_new_tokens']} new tokens, concurrency {d['concurrency']}, "
            f"engine {d['engine']}, draft `{Path(d['draft']).name}`", "",
            "| drafter | τ | per-position acceptance | output tok/s |", "|---|---:|---|---:|",
            f"| DFlash draft (ours) | {d['acceptance_length']:.2f} | {pos} | {d['tokens_per_s']:.1f} |"]
    if ng:
        out.append(f"| vLLM prompt lookup, {ng['num_speculative_tokens']} tokens | {ng['acceptance_length']:.2f} | "
                   + ", ".join(f"{x:.3f}" for x in ng["per_position_acceptance"]) + f" | {ng['tokens_per_s']:.1f} |")
    tpf = (f" Tokens per target forward (every step counted): {d['tokens_per_forward']:.2f}."
           if d.get("tokens_per_forward") else "")
    out += ["", f"Draft forward: {d['draft_time_share']:.1%} of the draft run's wall time; {d['num_steps']} verify "
            f"steps, {d['output_tokens']} output tokens.{tpf}"]
    return out + hand(notes, stem)


def kv_section(stem: str, d: dict[str, Any], notes: dict[str, str]) -> list[str]:
    m = d["meta"]
    out = ["## Fused KV injection (csrc/ CPU kernel)", ""]
    out += provenance_block(result_date(stem),
                            machine(stem, m.get("cpu_model")), PROVENANCE[stem]["command"],
                            f"{m['dtype']}, {m['threads']} thread(s), {m['clock']} clock, torch {m['torch']}, "
                            f"vLLM {m['vllm']}", NOT_RECORDED)
    out += ["", "Per shape and number of context tokens T: the fused op (one K/V GEMM for all draft layers, then "
            "k-norm + RoPE + paged-cache write in one pass) against the unfused PyTorch path and vLLM 0.32's own "
            "context-K/V precompute; all three end with K/V in the paged caches.", "",
            "| shape | T | fused ms | unfused PyTorch ms | vLLM 0.32 ms | GEMM alone ms | fused vs unfused "
            "| fused vs vLLM | GEMM share of fused |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in d["rows"]:
        out.append(f"| {r['shape']} | {r['T']} | {r['fused_ms']:.3f} | {r['unfused_ms']:.3f} | {r['vllm_ms']:.3f} "
                   f"| {r['gemm_only_ms']:.3f} | {r['speedup_vs_unfused']:.2f}× | {r['speedup_vs_vllm']:.2f}× "
                   f"| {r['gemm_share_of_fused']:.0%} |")
    s = d.get("serving")
    if s:
        out += ["", f"In the serving path (vLLM with our drafter, draft `{Path(m['serving_draft']).name}`): KV "
                f"injection per draft step {s['reference']['injection_ms_per_step']:.2f} ms with the PyTorch path "
                f"({s['reference']['injection_share_of_draft_step']:.0%} of injection + draft forward), "
                f"{s['fused']['injection_ms_per_step']:.2f} ms fused "
                f"({s['fused']['injection_share_of_draft_step']:.0%})."]
    return out + hand(notes, stem)


def depth_section(stem: str, d: dict[str, Any], notes: dict[str, str]) -> list[str]:
    batches = sorted({r["batch"] for r in d["rows"]})
    layers = sorted({r["layers"] for r in d["rows"]})
    ms = {(r["layers"], r["batch"]): r["ms"] for r in d["rows"]}
    cmd = (f"python dev/studies/draft_depth.py --layers {','.join(map(str, layers))} "
           f"--batches {','.join(map(str, batches))} --context {d['context']} --block {d['block']} "
           f"--draft-vocab {d['draft_vocab']} --threads {d['threads']} --clock {d['clock']}")
    out = ["## Draft step cost vs depth", ""]
    out += provenance_block(result_date(stem), machine(stem), cmd,
                            f"SmolLM2 draft shapes, reference (PyTorch) path, {d['dtype']}, context {d['context']} "
                            "tokens")
    out += ["", "| layers | " + " | ".join(f"batch {b}" for b in batches) + " |", "|---|" + "---:|" * len(batches)]
    for L in layers:
        out.append(f"| {L} | " + " | ".join(f"{ms[(L, b)]:.2f} ms ({ms[(L, b)] / ms[(layers[0], b)]:.2f}×)"
                                             for b in batches) + " |")
    return out + hand(notes, stem)


def train_section(stem: str, d: dict[str, Any], notes: dict[str, str]) -> list[str]:
    ph = d["phases"]
    out = ["## Training step cost", ""]
    out += provenance_block(result_date(stem), machine(stem),
                            PROVENANCE[stem]["command"],
                            f"SmolLM2 target, 1-layer draft, block {d['block_size']}, batch of {d['batch_size']} "
                            f"sequences = {d['tokens_in_batch']:,} tokens, {d['anchors']} anchors each, "
                            f"{d['threads']} thread(s)", NOT_RECORDED)
    names = {"full": "full output layer (49,152 tokens)", "reduced-8192": "reduced draft vocabulary (8,192 tokens)"}
    out += ["", "| phase | " + " | ".join(names.get(k, k) for k in ph) + " |", "|---|" + "---:|" * len(ph),
            "| target features (one forward, layers captured) | "
            + " | ".join(f"{v['target_features_s']:.1f} s" for v in ph.values()) + " |",
            "| draft forward + backward (features cached) | "
            + " | ".join(f"{v['draft_step_s']:.1f} s" for v in ph.values()) + " |",
            "", f"Feature cache: {d['feature_cache_bytes_per_token'] / 1000:.2f} KB per token (bf16)."]
    return out + hand(notes, stem)


def throughput_section(stem: str, d: dict[str, Any], notes: dict[str, str]) -> list[str]:
    """Training throughput: the draft step alone (profile) and the trainer end to end, in anchor-blocks/s."""
    out = ["## Training throughput on both cores (anchor-blocks/s)", ""]
    out += provenance_block(d["date"], machine(stem), d["profile"]["command"], d["note"])
    out += [f"- trainer: {quoted(d['trainer']['command'])}"]
    out += ["", "| measurement | threads | anchors per sequence | blocks per step | target features s "
                "| draft fwd+bwd s | anchor-blocks/s |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in d["profile"]["runs"]:
        out.append(f"| draft step alone (profile) | {r['threads']} | {r['anchors']} | {r['blocks_per_step']} | "
                   f"{r['target_features_s']:.2f} | {r['draft_step_s']:.3f} | {r['draft_blocks_per_s']:.0f} |")
    for key, what in (("trainer", "trainer, cached features"), ("trainer_first_pass", "trainer, features computed")):
        t = d.get(key, {})
        for r in t.get("log", []):
            out.append(f"| {what}, steps to {r['step']} | {t['threads']} | {t['anchors']} | "
                       f"{t['batch_size'] * t['anchors']} | – | – | {r['blocks_per_s']:.0f} |")
    return out + hand(notes, stem)


def soak_section(files: list[Path], notes: dict[str, str]) -> list[str]:
    out = ["## Soak test (serving under load, faults and bad input)", "",
           "Full figures and method: [docs/RELIABILITY.md](../docs/RELIABILITY.md) (generated from the same JSON by "
           "`python benchmarks/soak.py --render ...`).", "",
           f"- machine: {machine('soak')}, unless the file names its CPU: "
           + "; ".join(f"{f.stem}: {load(f)['meta']['cpu']}" for f in files if load(f)["meta"].get("cpu")), "",
           "| file | date | command | draft | clients × rounds | requests | checks passed | greedy identical "
           "under load | RSS growth, last round |", "|---|---|---|---|---|---:|---|---|---:|"]
    checks = []  # served feature checks (`--features-check`): their own section in RELIABILITY.md
    calibrations = []  # calibration checks of sampled output (`--calibration`): their own table in RELIABILITY.md
    mixed = []  # mixed-source checks of sampled output (`--mixed-check`): their own table in RELIABILITY.md
    for f in files:
        d = load(f)
        m = d["meta"]
        if m.get("mode") == "features":
            checks.append(f"{f.stem} ({m['started']}, {m['dtype']}): "
                          f"{sum(c['ok'] for c in d['checks'])}/{len(d['checks'])} checks passed")
            continue
        if m.get("mode") == "calibration":
            calibrations.append(f"{f.stem} ({m['started']}, {m['dtype']}, {m['requests'] * m['max_tokens']:,} tokens "
                                f"per configuration at c{m['concurrency']}): " + ", ".join(
                f"{n} z {c['z_top1']:+.2f} / {c['z_top5']:+.2f}" for n, c in d["configs"].items() if "error" not in c)
                + f"; {sum(c['ok'] for c in d['checks'])}/{len(d['checks'])} checks passed")
            continue
        if m.get("mode") == "mixed":
            ps = [e["p"] for r in d["temperatures"].values() for e in r["groups"].values() if e["p"] is not None]
            mixed.append(f"{f.stem} ({m['started']}, {m['dtype']}, {m['per_group']} requests per source at T "
                         f"{' / '.join(d['temperatures'])}): lowest p {min(ps):.2g}; "
                         f"{sum(c['ok'] for c in d['checks'])}/{len(d['checks'])} checks passed"
                         + (" (mismatched q caught)" if m["control"] and d["passed"] else ""))
            continue
        cmd = ["python benchmarks/soak.py"] + (["--quick"] if m["mode"] == "quick" else [])
        if m["mode"] == "full" and m["rounds"] != 3:
            cmd.append(f"--rounds {m['rounds']}")
        if m["mode"] == "full" and m["duration_limit_s"] != 1200.0:
            cmd.append(f"--duration {m['duration_limit_s']:.0f}")
        cmd += [f"--server-env {e}" for e in m.get("server_env", [])] + (["--preempt"] if m.get("preempt") else [])
        greedy = next((c["detail"] for c in d["checks"] if c["name"] == "greedy_identical_under_load"), "–")
        ok = sum(c["ok"] for c in d["checks"])
        growth = d["memory"].get("growth_per_round") or []
        sent = sum(r["sent"] for r in d["rounds"])
        draft = Path(m["draft"]).name + (" (untrained)" if m.get("draft_untrained") else "")
        out.append(f"| {f.stem} | {m['started']} | `{' '.join(cmd)}` | {draft} | {m['concurrency']} × {m['rounds']} "
                   f"| {sent} | {ok}/{len(d['checks'])} | {greedy.split(' greedy')[0]} "
                   + (f"| {growth[-1]:.2%} |" if growth else "| – |"))
    parts = []  # one paragraph: docs/BENCHMARKS.md is at its line limit
    if checks:
        parts.append("Served feature checks against stock vLLM (`python benchmarks/soak.py --features-check`): "
                     + "; ".join(checks) + ".")
    if calibrations:
        parts.append("Calibration of sampled output, z top-1 / top-5 at temperature 1.0 (`python benchmarks/soak.py "
                     "--calibration`; |z| < 3.5 passes): " + "; ".join(calibrations) + ".")
    if mixed:
        parts.append("Each proposal source's sampled output vs stock vLLM by chi-square (`python benchmarks/soak.py "
                     "--mixed-check --mixed-control`; p > 1e-3 passes): " + "; ".join(mixed) + ".")
    if parts:
        out += ["", " ".join(parts)]
    return out + hand(notes, "soak")


def step_cost_section(stem: str, d: dict[str, Any], notes: dict[str, str]) -> list[str]:
    m = d["meta"]
    hw, size = m["hardware"], m["model"]
    out = ["## Target step cost against query tokens (where verification turns compute-bound)", ""]
    out += provenance_block(m["started"], machine(stem, m["cpu"]), m["command"],
                            f"{m['dtype']}, compiled, {m['threads']} thread(s) (the serving worker's), vLLM "
                            f"{m['versions']['vllm']}, torch {m['versions']['torch']}; measured read bandwidth "
                            f"{hw['read_gb_s']:.1f} GB/s, GEMM {hw['gemm_tflops'] * 1e3:.0f} GFLOP/s; target "
                            f"{size['params'] / 1e6:.1f} M parameters")
    out += ["", f"The compiled target forward (`_dummy_run(n)`) plus the logits of all n rows, median of 9. Knee "
            f"(the verify step 20 % above one token): **{d['knee_tokens']} tokens**. Bound: bench/limit.py for n "
            "tokens at tokens per forward 1.", "",
            "| query tokens | forward ms | forward + logits ms | ms per token | bound ms (side) | of bound |",
            "|---:|---:|---:|---:|---:|---:|"]
    for r in d["rows"]:
        out.append(f"| {r['tokens']} | {r['forward_ms']:.1f} | {r['verify_ms']:.1f} "
                   f"| {r['verify_ms'] / r['tokens']:.2f} | {r['bound_ms']:.1f} ({r['bound']}) "
                   f"| {100 * r['bound_ms'] / r['verify_ms']:.0f} % |")
    out += ["", f"![step cost]({link(result_file(stem, '.png'))})"]
    return out + hand(notes, stem)


def cross_lookup_section(stem: str, d: dict[str, Any], notes: dict[str, str]) -> list[str]:
    """benchmarks/cross_lookup_cost.py: the cross-request lookup index's host cost per engine step."""
    m = d["meta"]
    out = ["## Cross-request lookup: host cost per engine step at 128k live tokens", ""]
    out += provenance_block(m.get("started", "?"), m["cpu"], m["command"],
                            f"{m['requests']} live requests × {m['tokens']} tokens, one new token each per step, "
                            f"lookup + indexing timed ({m['clock']} time of the thread), {m['steps']} steps; load "
                            f"average at the start {m['loadavg_start'][0]}")
    out += ["", "| capacity | live tokens | mean µs / step | p50 | p90 | p99 | max | µs per request-step |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in d["rows"]:
        out.append(f"| {r['capacity']:,} | {r['live_tokens']:,} | {r['mean_us']:.0f} | {r['p50_us']:.0f} "
                   f"| {r['p90_us']:.0f} | {r['p99_us']:.0f} | {r['max_us']:.0f} | {r['us_per_request_step']:.1f} |")
    return out + hand(notes, stem)


def md_section(stem: str, notes: dict[str, str]) -> list[str]:
    """A result whose script writes its own markdown table: that file's body (its first heading dropped, the others
    one level down, below the section's), then the hand-written reading."""
    body = result_file(stem, ".md").read_text().splitlines()
    if body and body[0].startswith("#"):
        body = body[1:]
    body = ["#" + line if line.startswith("#") else line for line in body]
    png = result_file(stem, ".png")
    plot = [f"![{stem}]({link(png)})", ""] if png else []
    data = load(result_file(stem, ".json")) if result_file(stem, ".json") else {}
    mach = data.get("machine") if isinstance(data, dict) else None
    cpu = mach.get("cpu") if isinstance(mach, dict) else (data.get("meta") or {}).get("cpu_kind")
    return [f"## {MD_SECTIONS[stem]}", "", f"- machine: {machine(stem, cpu)}", *body, "", *plot, *hand(notes, stem)]


def section(stem: str, d: dict[str, Any], notes: dict[str, str]) -> list[str]:
    """The full section of one result file (everything the history shows)."""
    if "runs" in d and "meta" in d:
        return serving_section(stem, d, notes)
    if stem == "eval_humaneval164" or d.get("engine") in ("vllm", "reference"):
        return eval_section(stem, d, notes)
    renderers = {"kv_injection": kv_section, "draft_depth": depth_section, "profile_train_step": train_section,
                 "train_throughput_xeon": throughput_section, "step_cost": step_cost_section,
                 "cross_lookup_cost": cross_lookup_section}
    if stem in renderers:
        return renderers[stem](stem, d, notes)
    if stem in MD_SECTIONS:
        return md_section(stem, notes)
    raise SystemExit(f"make_bench_docs: no renderer for {stem}.json. Fix: add one to dev/make_bench_docs.py")


def brief_serving_section(stem: str, result: dict[str, Any]) -> list[str]:
    """A serving run in short: provenance, the speed-up table and the greedy check (the rest is in the history)."""
    m, eng = result["meta"], result["meta"]["engine"]
    mode = "eager" if eng.get("enforce_eager", True) else "compiled"
    full = SERVING_TITLES.get(stem, f"Serving benchmark {stem}")
    per_run = result_file(stem, ".md")
    return [f"## {LATEST[stem]}", "",
            f"- `{stem}`, {m['started'][:10]}, {machine(stem, m['machine']['cpu'])}, kind **{run_kind(m)}**; "
            f"`vllm serve --dtype "
            f"{eng['dtype']}`, {mode}, OMP_NUM_THREADS={m['layout']['omp_num_threads']}; vllm_dflash "
            f"{m['versions']['vllm_dflash']}, vLLM {m['versions']['vllm']}",
            f"- command: `{bench_command(m, list(result['configs']))}`",
            f"- workload: {workload(m)}, up to {m['max_tokens']} tokens, {prompts_per_run_text(m)}",
            f"- baselines: {baselines(result)}",
            f"- every table of this run (time split, adaptive choices, acceptance by position, limits): "
            f"[dev/BENCHMARKS-history.md]({link(HISTORY)}#{anchor(full)}); per-run details: "
            f"[{per_run.relative_to(REPO)}]({link(per_run)})", "",
            pivot(result)] + ([] if m.get("temperature") else
                              ["", f"Greedy outputs identical to `none` ({eng['dtype']}): {greedy_summary(result)}."]
                              ) + (["", *categories_section(result)[:-1]] if stem in CATEGORY_TABLES else [])


def categories_section(result: dict[str, Any]) -> list[str]:
    """Open chat per category at concurrency 1 (bench/categories.py), where the run has it."""
    cats = render_categories(result["runs"])
    return [CAPTION + ":", "", cats, ""] if cats else []


def workload(m: dict[str, Any]) -> str:
    t = m.get("temperature") or 0.0
    return "greedy" if not t else f"sampled at temperature {t} (outputs not compared)"


def baselines(result: dict[str, Any]) -> str:
    """Whether `none` / `ngram` ran stock vLLM (the plugin not loaded) or vLLM with the plugin installed."""
    env = (result["configs"].get("none") or {}).get("env") or {}
    if "vllm_dflash" not in str(env.get("VLLM_PLUGINS", "vllm_dflash")).split(","):
        return "**stock vLLM** (`none` and `ngram` with vllm_dflash not loaded)"
    return ("vLLM with vllm_dflash installed (`none` and `ngram` carry its CPU changes: the model in the engine core, "
            "vLLM's n-gram thread fix, one-pass greedy verification)")


def anchor(title: str) -> str:
    return "".join(ch for ch in title.lower().replace(" ", "-") if ch.isalnum() or ch in "-_")


LATEST_INTRO = """The latest run of each kind on 2-core CPUs, no GPU; older: [the history](../dev/BENCHMARKS-history.md).

How to read the serving tables:
- Cells: output tok/s for `none` (no speculation); for the others the speed-up over `none` at the same prompt set
  and concurrency · tokens per target forward, every request-step counted (vLLM's τ, counted on steps that verified
  drafts). Marked ≈: derived from vLLM's counters. Best speed-up per column in bold; in brackets the lowest and
  highest speed-up of one interleaved round. Rows `X / none+extras`: X over our engine without speculation.
- `ours` is our default (adaptive drafting), `ours-fixed` the paper's fixed block (per-run files written before these
  names: `ours-adaptive` and `ours`). Baselines: each table says whether `none` and `ngram` ran stock vLLM (the plugin
  not loaded; `bench_v38_xeon_stock` on) or vLLM with vllm_dflash installed (older runs).
- The machines drift by 10-30 % within an hour: compare configurations within one table only. Above concurrency 1
  a lead of a few percent can flip between runs."""


def render(stems: list[str], full: bool) -> str:
    """docs/BENCHMARKS.md (`full` False: the LATEST results, serving runs in short) or the history (every result)."""
    notes = read_notes() if full else {}
    soak_files = sorted([p for d in (LATEST_DIR, OLDER_DIR) for g in ("soak*.json*", "calibration*.json*", "mixed-check*.json*")
                         for p in d.glob(g)],
                        key=lambda p: p.name.split(".")[0])
    if full:
        out = ["# Benchmarks: every run", "",
               "Generated by `python dev/make_bench_docs.py` from the result files in "
               "[benchmarks/results/](../benchmarks/results/) (the latest) and [dev/results/](results/) (the older "
               "ones); do not edit by hand. Hand-written readings come from "
               "[dev/benchmark_notes.md](benchmark_notes.md) and are marked as such. The latest run of each kind, "
               "in short: [docs/BENCHMARKS.md](../docs/BENCHMARKS.md). The tables use today's configuration names "
               "(`ours` our default, adaptive drafting; `ours-fixed` the paper's fixed block); readings and per-run "
               "files written before these names use the old ones (`ours-adaptive` for `ours`, `ours` for "
               "`ours-fixed`).", ""]
        out += [notes["intro"], ""] if notes.get("intro") else []
    else:
        out = ["# Benchmarks", "", "Generated by `python dev/make_bench_docs.py` from "
               "[benchmarks/results/](../benchmarks/results/); do not edit by hand.", "", LATEST_INTRO, "",
               "<!-- results: stock -->", ""]
    out += ["Contents:", ""]
    body: list[str] = []
    for stem in stems:
        if stem == "soak":
            sec = soak_section(soak_files, notes) if soak_files else []
        else:
            d = load(result_file(stem, ".json"))
            if full:
                sec = section(stem, d, notes)
            elif "runs" in d and "meta" in d:
                sec = brief_serving_section(stem, d)
            else:
                sec = section(stem, d, notes)
                sec[0] = f"## {LATEST[stem]}"
        if sec:
            out.append(f"- [{sec[0][3:]}](#{anchor(sec[0][3:])})")
            body += sec + [""]
    if full and notes.get("unbacked"):
        title = "Measurements without a result file (hand-written)"
        out.append(f"- [{title}](#measurements-without-a-result-file-hand-written)")
        body += [f"## {title}", "", notes["unbacked"], ""]
    return "\n".join(out + [""] + body).rstrip() + "\n"


def outputs() -> dict[Path, str]:
    """Each generated file and its text."""
    stems = {p.name.split(".")[0] for d in (LATEST_DIR, OLDER_DIR) for p in d.glob("*.json*")
             if not p.name.startswith(("soak", "calibration", "mixed-check"))}
    order = [s for s in ORDER if s in stems or s == "soak"] + sorted(stems - set(ORDER))
    missing = [s for s in LATEST if s != "soak" and s not in stems]
    if missing:
        raise SystemExit(f"make_bench_docs: LATEST names {missing}, which have no result file. Fix: LATEST in "
                         "dev/results_registry.py")
    return {OUT: render(list(LATEST), full=False), HISTORY: render(order, full=True)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if a file on disk differs from the generated one")
    a = p.parse_args(argv)
    stale = []
    for path, text in outputs().items():
        if a.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(path)
            continue
        path.write_text(text)
        print(f"wrote {path.relative_to(REPO)} ({len(text.splitlines()):,} lines)")
    for path in stale:
        print(f"{path.relative_to(REPO)} is out of date. Fix: python dev/make_bench_docs.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
