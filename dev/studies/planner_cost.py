# SPDX-License-Identifier: Apache-2.0
"""Host cost of the adaptive planner per engine step against batch size (no vLLM, no model).

    python dev/studies/planner_cost.py --out dev/results/planner_cost        # JSON + markdown + PNG
    PYTHONPATH=<checkout of another commit> python dev/studies/planner_cost.py ...  # the same for that code

Times what `AdaptiveController` does on every step of synchronous serving, the draft forward left out: `plan`
(score the last proposals, time the step, prompt lookup for every request, source choice, lengths, guard) and
`propose` (build the proposals). Histories are synthetic but shaped like served ones: `--context` tokens per request
from a 2,000-id range with one repeated 70-token span, so prompt lookup matches on part of the steps, and each step
appends the request's accepted tokens. The clock the controller reads is a fake one advancing 80 ms per step, so the
cost model sees a steady machine; the wall time measured is the real one (median of --repeats runs of --steps
steps after --warmup)."""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np


def _histories(B: int, context: int, rng: np.random.Generator) -> list[np.ndarray]:
    out = []
    for _ in range(B):
        base = rng.integers(0, 2000, context)
        start = int(rng.integers(0, context - 140))
        base[-70:] = base[start: start + 70]  # the newest tokens repeat an earlier span: lookups match
        out.append(base)
    return out


def run(B: int, steps: int, warmup: int, context: int, mode: str, k: int, seed: int = 0) -> float:
    """-> seconds per step (plan + propose) at batch B."""
    from vllm_dflash.adaptive.controller import AdaptiveController

    rng = np.random.default_rng(seed)
    hists = _histories(B, context, rng)
    ids = [f"req-{i}" for i in range(B)]
    t = [0.0]

    def clock() -> float:
        return t[0]

    c = AdaptiveController(k, mode=mode, clock=clock)
    block = rng.integers(0, 2000, (B, k))
    total = 0.0
    for s in range(warmup + steps):
        t[0] += 0.08
        t0 = time.perf_counter()
        plan = c.plan(ids, hists, query_tokens=B * 3, decode_only=True)
        drafts = c.propose(plan, block if plan.needs_block else None)
        dt = time.perf_counter() - t0
        if s >= warmup:
            total += dt
        for i, d in enumerate(drafts):  # accept the first half of each proposal, then the target's own token
            keep = d[: len(d) // 2]
            hists[i] = np.concatenate([hists[i], np.asarray(keep, dtype=np.int64), rng.integers(0, 2000, 1)])
    return total / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="1,2,4,8,16,32,64,128")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--context", type=int, default=400)
    ap.add_argument("--mode", default="both")
    ap.add_argument("--k", type=int, default=7)
    ap.add_argument("--label", default=None, help="name of this run in the JSON (default: the package version)")
    ap.add_argument("--out", default="dev/results/planner_cost")
    a = ap.parse_args()

    import vllm_dflash
    from tqdm import tqdm

    label = a.label or f"vllm_dflash {vllm_dflash.__version__} ({Path(vllm_dflash.__file__).parent.parent})"
    rows = []
    for B in tqdm([int(x) for x in a.batch.split(",")], desc="batch sizes"):
        per = [run(B, a.steps, a.warmup, a.context, a.mode, a.k, seed=r) for r in range(a.repeats)]
        rows.append({"batch": B, "ms_per_step": 1e3 * statistics.median(per),
                     "us_per_request": 1e6 * statistics.median(per) / B})
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.with_suffix(".json")
    prev = json.loads(path.read_text()) if path.is_file() else {"runs": []}
    run_rec = {"label": label, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
               "cpu": platform.processor() or platform.machine(), "mode": a.mode, "k": a.k, "context": a.context,
               "steps": a.steps, "repeats": a.repeats, "rows": rows}
    runs = [r for r in prev["runs"] if r["label"] != label] + [run_rec]
    path.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    md = ["# Adaptive planner: host time per engine step", "",
          f"`plan` + `propose` of `AdaptiveController` (mode {a.mode}, k {a.k}, {a.context}-token histories), "
          f"median of {a.repeats} runs of {a.steps} steps; one thread, no model.", "",
          "| code | " + " | ".join(f"batch {r['batch']}" for r in rows) + " |",
          "|---|" + "---:|" * len(rows)]
    for r in runs:
        cells = {x["batch"]: x for x in r["rows"]}
        md.append(f"| {r['label']} | " + " | ".join(
            f"{cells[x['batch']]['ms_per_step']:.2f} ms ({cells[x['batch']]['us_per_request']:.0f} µs/req)"
            if x["batch"] in cells else "–" for x in rows) + " |")
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        for r in runs:
            ax.plot([x["batch"] for x in r["rows"]], [x["ms_per_step"] for x in r["rows"]], marker="o",
                    label=r["label"])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch (requests per step)")
        ax.set_ylabel("ms per step (plan + propose)")
        ax.set_title("Adaptive planner host time per step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out.with_suffix(".png"), dpi=110)
    except ImportError:
        pass
    print("\n".join(md))


if __name__ == "__main__":
    main()
