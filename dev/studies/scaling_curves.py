# SPDX-License-Identifier: Apache-2.0
"""Scaling curves of DFlash drafts from their training logs: held-out τ against training tokens, and against
draft-training compute for drafts of several depths (issue #15's curves; runs from scripts/depth_study.sh).

    python dev/studies/scaling_curves.py [--runs runs/depth-l1,runs/depth-l2,runs/depth-l3] [--cost 1:1,2:1.5,3:2]
        [--out dev/results/scaling_cpu]

Reads each run's log.jsonl (held-out evaluations: τ of the block alone and tokens per target forward, teacher-forced
replay of the greedy loop on the run's held-out sequences) and its console log (the training split's size). Training
tokens = response tokens of the sequences trained on so far (steps x batch x the split's mean response length; one
epoch, so no sequence is seen twice); compute = steps x the depth's relative step cost (in 1-layer steps). Writes
<out>/scaling.json, scaling.md and scaling.png; also the last points' slope per doubling of training tokens, the
rate at which τ still rises (an extrapolation beyond the measured range, labelled as such)."""
from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_run(run: Path) -> dict:
    cfg = json.loads((run / "checkpoint" / "config.json").read_text())
    layers = cfg.get("num_hidden_layers", 1)
    rows = [json.loads(ln) for ln in (run / "log.jsonl").read_text().splitlines() if ln.strip()]
    evals = [r for r in rows if "eval_acceptance_length" in r]
    train = [r for r in rows if "loss" in r]
    console = Path(str(run) + ".log")
    m = re.search(r"data: (\d+) train sequences \((\d+) response tokens\)", console.read_text(errors="replace")) \
        if console.exists() else None
    if not m:
        raise SystemExit(f"{console}: no 'data: N train sequences (T response tokens)' line; pass the run's console log")
    seqs, tokens = int(m.group(1)), int(m.group(2))
    return {"run": str(run), "layers": layers, "train_sequences": seqs, "train_response_tokens": tokens,
            "mean_response_tokens": tokens / seqs, "evals": evals,
            "blocks_per_s": [r["blocks_per_s"] for r in train if "blocks_per_s" in r]}


def slope_per_doubling(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of y against log2(x)."""
    pts = [(math.log2(x), y) for x, y in zip(xs, ys) if x > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default="runs/depth-l1,runs/depth-l2,runs/depth-l3")
    ap.add_argument("--cost", default="1:1,2:1.5,3:2", help="layers:relative training-step cost (1-layer = 1)")
    ap.add_argument("--batch-size", type=int, default=4, help="sequences per step of these runs")
    ap.add_argument("--anchors", type=int, default=32, help="anchor blocks per sequence of these runs")
    ap.add_argument("--machine", default=None, help="the machine the runs trained on, for the report")
    ap.add_argument("--out", default=str(ROOT / "dev" / "results" / "scaling_cpu"))
    a = ap.parse_args(argv)
    cost = {int(k): float(v) for k, v in (x.split(":") for x in a.cost.split(","))}
    runs = [load_run(Path(r)) for r in a.runs.split(",") if (Path(r) / "log.jsonl").exists()]
    if not runs:
        raise SystemExit(f"no run with a log.jsonl among {a.runs}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"machine": a.machine, "batch_size": a.batch_size, "anchors": a.anchors, "cost": cost, "runs": []}
    for r in runs:
        pts = []
        for e in r["evals"]:
            step = e["step"]
            tpf = e.get("eval_tokens_per_forward") or {}
            pts.append({"step": step, "training_tokens": step * a.batch_size * r["mean_response_tokens"],
                        "anchor_blocks": step * a.batch_size * a.anchors, "compute_1layer_steps": step * cost[r["layers"]],
                        "tau": e["eval_acceptance_length"], "first_position": e["eval_per_position_acceptance"][0],
                        "tokens_per_forward_block": tpf.get("dflash"), "tokens_per_forward_merged": tpf.get("merged"),
                        "tokens_per_forward_lookup": tpf.get("lookup")})
        tail = [p for p in pts if p["step"] > 0][-4:]
        s = slope_per_doubling([p["training_tokens"] for p in tail], [p["tau"] for p in tail])
        bps = sorted(r["blocks_per_s"])
        res["runs"].append({k: r[k] for k in ("run", "layers", "train_sequences", "train_response_tokens")}
                           | {"blocks_per_s_median": bps[len(bps) // 2] if bps else None,
                              "last_step": max((row["step"] for row in r["evals"]), default=0)}
                           | {"points": pts, "tau_slope_per_doubling_last4": s,
                              "tau_after_10x_more_extrapolated": (tail[-1]["tau"] + s * math.log2(10)) if s and tail else None})
    (out / "scaling.json").write_text(json.dumps(res, indent=1))
    lines = [f"# Scaling curves ({a.machine or 'machine not stated'})", "",
             f"Held-out τ (block 8, teacher-forced greedy replay on the run's held-out sequences) of drafts trained "
             f"from scratch, batch {a.batch_size} x {a.anchors} anchors; training tokens = response tokens of the "
             f"sequences trained on; compute in 1-layer steps (relative step cost {cost}).", "",
             "| layers | step | training tokens | compute (1-layer steps) | τ | first position | tokens / forward: lookup, then block |",
             "|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        for p in r["points"]:
            merged = p["tokens_per_forward_merged"]
            lines.append(f"| {r['layers']} | {p['step']} | {p['training_tokens'] / 1e3:.0f} k | "
                         f"{p['compute_1layer_steps']:.0f} | {p['tau']:.3f} | {p['first_position']:.3f} | "
                         + (f"{merged:.3f}" if merged else "–") + " |")
    lines += ["", "Training throughput (median of the logged rows, on a machine shared by the runs and other work; the "
              "first run computed the target features, the others read them from the cache): " + ", ".join(
                  f"{r['layers']} layer(s) {r['blocks_per_s_median']:.0f} anchor-blocks/s" for r in res["runs"]
                  if r["blocks_per_s_median"]) + "."]
    lines += ["", "Slope of τ per doubling of training tokens over each run's last four points, and what it gives "
              "if it held for 10x more (an extrapolation):", ""]
    for r in res["runs"]:
        s = r["tau_slope_per_doubling_last4"]
        lines.append(f"- {r['layers']} layer(s): " + (f"+{s:.3f} τ per doubling; 10x more: τ ≈ "
                                                      f"{r['tau_after_10x_more_extrapolated']:.2f}" if s else "–"))
    (out / "scaling.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in res["runs"]:
        pts = [p for p in r["points"] if p["step"] > 0]
        lab = f"{r['layers']} layer{'s' if r['layers'] > 1 else ''}"
        ax[0].plot([p["training_tokens"] for p in pts], [p["tau"] for p in pts], "o-", label=lab)
        ax[1].plot([p["compute_1layer_steps"] for p in pts], [p["tau"] for p in pts], "o-", label=lab)
    ax[0].set_xscale("log")
    ax[0].set_xlabel("training tokens (response tokens of the sequences seen)")
    ax[1].set_xlabel("draft-training compute (1-layer steps)")
    for x in ax:
        x.set_ylabel("held-out τ (block 8)")
        x.grid(alpha=0.3)
        x.legend()
    ax[0].set_title("τ against training tokens")
    ax[1].set_title("τ against compute, by depth")
    fig.suptitle(f"DFlash drafts for SmolLM2-135M-Instruct trained from scratch ({a.machine or 'CPU'})", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "scaling.png", dpi=110)
    print("\n".join(lines))
    print(f"wrote {out / 'scaling.json'}, {out / 'scaling.md'}, {out / 'scaling.png'}")


if __name__ == "__main__":
    main()
