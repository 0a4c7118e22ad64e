# SPDX-License-Identifier: Apache-2.0
"""The adaptive planner's step-cost model against the machine it ran on (issue 62.3): predicted against measured
step time, per step of DFLASH_TRACE step traces (adaptive/trace.py), grouped by batch size and by query rows.

    python benchmarks/cost_model.py /tmp/tr/RUN [more traces or folders] --out-dir DIR --name NAME [--label TEXT]

Per cost sample of the trace (a decode step the controller timed: `dt` set; prefill-carrying steps and idle gaps
have none), the predictions are those the controller planned that step with:
  step     T(n, B, m) = alpha + beta n + delta B + gamma m from the `cost` the record before published (the fit
           after the previous step), against `dt`, the step's wall time less the draft forward;
  forward  the target forward F(n) = a + b n of `SplitStepCost`, refitted online over the same samples in the
           recorded order (the trace publishes F's slope only, not its intercept), against `fwd`.
The refit's step prediction is compared with the published one: they agree when the trace holds the process's
whole life (`replay_max_rel_diff`). The first `--warmup` samples of each trace (the fit near its prior) are left out.
F's shape is checked in hindsight: the best line over the run and the best piecewise-linear F (knots at powers of
two), both least squares in relative error, by row bin: how far a line is off by row count whatever its fitting.
A draft row's price, per batch-size bucket: the beta the planner used against the forward's slope in n with the
batch size held fixed (where nothing is drafted n moves only with B, and F(n) then charges a request's own cost to
its rows).

Writes DIR/NAME.json (per group: steps, mean measured and predicted ms, median relative error, p90 absolute
relative error), DIR/NAME.md and DIR/NAME.png (predicted against measured, coloured by batch-size bucket)."""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from vllm_dflash.adaptive.step_cost import SplitStepCost, StepCostModel, refresh_young
from vllm_dflash.adaptive.trace import read_trace
from vllm_dflash.utils import cpu_class, cpu_kind

B_TOP, N_TOP = 32, 256  # the last batch-size bucket (32+) and row bin (256+)
KNOTS = (8, 16, 32, 64, 128)  # the piecewise-linear F's knots (query rows)


def pow2_bin(x: int, top: int) -> str:
    """1, 2-3, 4-7, ... up to `top`+ (batch sizes: the guard's buckets)."""
    if x >= top:
        return f"{top}+"
    lo = 1 << (max(int(x), 1).bit_length() - 1)
    return "1" if lo == 1 else f"{lo}-{2 * lo - 1}"


def _bin_key(label: str) -> int:
    return int(label.split("-")[0].rstrip("+"))


def trace_files(paths: list[str]) -> list[list[Path]]:
    """The traces named: files, or folders of `trace-<pid>.jsonl`. -> per process its files, oldest first (a
    rotated `<name>.1` before its successor)."""
    out = []
    for p in map(Path, paths):
        for f in sorted(p.glob("trace-*.jsonl")) if p.is_dir() else [p]:
            rotated = f.with_name(f.name + ".1")
            out.append(([rotated] if rotated.exists() else []) + [f])
    return out


def replay(records: list[dict], warmup: int = 8) -> tuple[list[dict], float]:
    """The cost samples of one process's trace with their predictions. -> (steps, the refit's largest relative
    difference from the published step prediction). Each step: B, n (query rows), out (tokens produced), dt and fwd
    (measured seconds), pred (published fit), beta (its slope a query row), pred_fwd (refit F; None without `fwd`),
    idx (its sample number)."""
    split = any(r.get("fwd") is not None for r in records if r.get("dt") is not None)
    model = SplitStepCost() if split else StepCostModel(per_output=True)  # the controller's class (split on CPU)
    steps, prev, diff, idx = [], None, 0.0, 0
    for r in records:
        if r.get("dt") is not None and r.get("decode", True) and r["q"] > 0 and prev is not None:
            B, n, out, dt, fwd = r["B"], r["q"], r["out"], r["dt"], r.get("fwd")
            a, b, d, g = prev
            pred = a + b * n + d * B + g * out
            refit = model(n, B, out)
            diff = max(diff, abs(refit - pred) / max(pred, 1e-12))
            if idx >= warmup:
                steps.append({"B": B, "n": n, "out": out, "dt": dt, "fwd": fwd, "pred": pred, "beta": b, "idx": idx,
                              "pred_fwd": model.forward(n) if split and fwd is not None else None})
            # as the controller: each sample enters unsolved (solved every 16th); a plan that weighs drafts (trace
            # field `planned`) solves a young fit (`refresh_young`)
            if split:
                model.observe(n, dt, B, out, fwd, solve=False)
            else:
                model.observe(n, dt, B, out, solve=False)
            idx += 1
        planned = r.get("planned")
        if planned is None:  # a trace from before the field: only a measured 'off' skipped the plan then
            planned = not (r.get("arm") == "off" and r.get("off_rate") is not None)
        if planned:
            refresh_young(model)
        prev = r.get("cost", prev)
    return steps, diff


def error_stats(measured, predicted) -> dict:
    """Steps, mean measured and predicted ms, median relative error (signed: + = the model over-predicts) and the
    90th percentile of its absolute value."""
    m, p = np.asarray(measured, float), np.asarray(predicted, float)
    rel = (p - m) / m
    return {"steps": int(m.size), "measured_ms": round(1e3 * float(m.mean()), 3),
            "predicted_ms": round(1e3 * float(p.mean()), 3), "median_rel_err": round(float(np.median(rel)), 4),
            "p90_abs_rel_err": round(float(np.percentile(np.abs(rel), 90)), 4)}


def grouped(steps: list[dict], key: str, pred_key: str, by: str, top: int) -> list[dict]:
    """error_stats of `key` against `pred_key` per bin of `by` (pow2_bin), in bin order, then 'all'."""
    rows = [s for s in steps if s[key] is not None and s[pred_key] is not None and s[key] > 0]
    bins: dict[str, list[dict]] = {}
    for s in rows:
        bins.setdefault(pow2_bin(s[by], top), []).append(s)
    out = [{by: b, **error_stats([s[key] for s in g], [s[pred_key] for s in g])}
           for b, g in sorted(bins.items(), key=lambda kv: _bin_key(kv[0]))]
    if rows:
        out.append({by: "all", **error_stats([s[key] for s in rows], [s[pred_key] for s in rows])})
    return out


def hindsight_forward(steps: list[dict]) -> dict | None:
    """F(n) fitted once over the whole run (least squares in relative error) as a line and as a piecewise line with
    knots at KNOTS (those inside the rows seen), each step's `fwd` predicted by both. -> {'linear': [a, b] (s),
    'piecewise': coefficients, 'knots', 'by_n': per row bin the median relative errors (online, line, piecewise)}."""
    rows = [s for s in steps if s["fwd"] is not None and s["fwd"] > 0]
    if len(rows) < 8:
        return None
    n = np.array([s["n"] for s in rows], float)
    t = np.array([s["fwd"] for s in rows], float)
    knots = [k for k in KNOTS if k < n.max()]
    basis = {"linear": np.stack([np.ones_like(n), n], 1),
             "piecewise": np.stack([np.ones_like(n), n] + [np.maximum(n - k, 0.0) for k in knots], 1)}
    fits, preds = {}, {}
    for name, X in basis.items():
        th, *_ = np.linalg.lstsq(X / t[:, None], np.ones_like(t), rcond=None)  # min sum ((X th - t) / t)^2
        fits[name], preds[name] = th.tolist(), X @ th
    online = np.array([s["pred_fwd"] if s["pred_fwd"] is not None else np.nan for s in rows])
    labels = np.array([pow2_bin(int(x), N_TOP) for x in n])
    by_n = []
    for b in sorted(set(labels.tolist()), key=_bin_key):
        m = labels == b
        med = {k: round(float(np.nanmedian((v[m] - t[m]) / t[m])), 4) for k, v in
               (("online", online), ("linear", preds["linear"]), ("piecewise", preds["piecewise"]))}
        by_n.append({"n": b, "steps": int(m.sum()), **med})
    return {"linear": fits["linear"], "piecewise": fits["piecewise"], "knots": knots, "by_n": by_n}


def row_slopes(steps: list[dict]) -> list[dict]:
    """The slope the planner priced a draft row at against the one the steps show, per batch-size bucket: the
    published beta (median, 10th-90th percentile over the bucket's steps) and the least-squares slope of the forward
    (of the step, without `fwd`) in n with a level per batch size (batch size held fixed, so a request's own cost
    stays out of it) and its standard error (None where n never moved at a fixed batch size)."""
    out = []
    key = "fwd" if all(s["fwd"] is not None for s in steps) else "dt"
    for b in sorted({pow2_bin(s["B"], B_TOP) for s in steps}, key=_bin_key):
        g = [s for s in steps if pow2_bin(s["B"], B_TOP) == b]
        beta = np.array([s["beta"] for s in g])
        n, B, t = (np.array([s[k] for s in g], float) for k in ("n", "B", key))
        sizes = np.unique(B)
        X = np.concatenate([n[:, None], (B[:, None] == sizes[None, :]).astype(float)], 1)
        within = se = None
        if len(t) > X.shape[1] and np.linalg.matrix_rank(X) == X.shape[1]:
            th = np.linalg.lstsq(X, t, rcond=None)[0]
            var = float(np.sum((t - X @ th) ** 2)) / (len(t) - X.shape[1])  # residual variance
            within = round(1e3 * float(th[0]), 3)
            se = round(1e3 * float(np.sqrt(var * np.linalg.inv(X.T @ X)[0, 0])), 3)
        out.append({"B": b, "steps": len(g), "n_range": [int(n.min()), int(n.max())],
                    "beta_ms": [round(1e3 * float(v), 3) for v in np.percentile(beta, [50, 10, 90])],
                    "within_batch_ms": within, "within_batch_se_ms": se})
    return out


def check(paths: list[str], warmup: int = 8) -> tuple[dict, list[dict]]:
    """The whole check over the traces. -> (result without meta, every step kept)."""
    steps, diffs, sources = [], [], []
    for files in trace_files(paths):
        recs = [r for f in files for r in read_trace(f)]
        s, d = replay(recs, warmup)
        sources.append({"files": [str(f) for f in files], "records": len(recs), "steps": len(s),
                        "replay_max_rel_diff": d})
        steps += s
        diffs.append(d)
    result = {
        "traces": sources,
        "replay_max_rel_diff": max(diffs, default=0.0),
        "step": {"by_B": grouped(steps, "dt", "pred", "B", B_TOP), "by_n": grouped(steps, "dt", "pred", "n", N_TOP)},
        "forward": {"by_B": grouped(steps, "fwd", "pred_fwd", "B", B_TOP),
                    "by_n": grouped(steps, "fwd", "pred_fwd", "n", N_TOP)},
        "forward_hindsight": hindsight_forward(steps),
        "row_slope": row_slopes(steps) if steps else [],
    }
    return result, steps


def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def _table(rows: list[dict], by: str, title: str) -> list[str]:
    if not rows:
        return []
    out = [f"| {title} | steps | measured ms | predicted ms | median rel. error | p90 abs. rel. error |",
           "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r[by]} | {r['steps']} | {r['measured_ms']:.1f} | {r['predicted_ms']:.1f} | "
                   f"{_pct(r['median_rel_err'])} | {100 * r['p90_abs_rel_err']:.1f} % |")
    return out + [""]


def render_markdown(result: dict) -> str:
    m = result["meta"]
    where = m["cpu_class"] + (f", {m['label']}" if m["label"] else "")
    lines = [f"# Step-cost model: predicted against measured ({where})",
             "", f"{m['started']}; CPU {m['cpu_class']} ({m['cpu_kind']}); {m['steps']} cost samples from "
             f"{len(result['traces'])} trace(s), the first {m['warmup']} of each left out; the refit online agrees "
             f"with the published fit to {result['replay_max_rel_diff']:.1e} (relative).",
             "", "Relative error = (predicted - measured) / measured. Step: the fit the controller planned the step "
             "with (wall time less the draft forward); forward: the online F(n) of `SplitStepCost`.", "",
             "## Step time by batch size", ""]
    lines += _table(result["step"]["by_B"], "B", "B")
    lines += ["## Step time by query rows", ""] + _table(result["step"]["by_n"], "n", "rows n")
    if any(r["n"] != "all" for r in result["forward"]["by_n"]):
        lines += ["## Target forward by query rows", ""] + _table(result["forward"]["by_n"], "n", "rows n")
        lines += ["## Target forward by batch size", ""] + _table(result["forward"]["by_B"], "B", "B")
    h = result.get("forward_hindsight")
    if h:
        a, b = h["linear"]
        lines += ["## Shape of F(n): median relative error by row bin", "",
                  f"online: the controller's fit; line: the best F = {1e3 * a:.2f} ms + {1e3 * b:.3f} ms n over the "
                  f"run; piecewise: the best piecewise-linear F with knots at {h['knots']} over the run.", "",
                  "| rows n | steps | online | line (hindsight) | piecewise (hindsight) |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {r['n']} | {r['steps']} | {_pct(r['online'])} | {_pct(r['linear'])} | {_pct(r['piecewise'])} |"
                  for r in h["by_n"]] + [""]
    if result["row_slope"]:
        lines += ["## A draft row's price by batch size", "",
                  "beta: the fit's slope a query row the planner used (median, 10th-90th percentile); within batch: "
                  "the slope in n of the measured forward with a level per batch size (a request's own cost, its "
                  "attention over its context, left out).", "",
                  "| B | steps | rows n | beta ms (p10-p90) | within batch ms (± s.e.) |", "|---|---:|---:|---:|---:|"]
        for r in result["row_slope"]:
            w = "–" if r["within_batch_ms"] is None else f"{r['within_batch_ms']:.2f} ± {r['within_batch_se_ms']:.2f}"
            lines.append(f"| {r['B']} | {r['steps']} | {r['n_range'][0]}-{r['n_range'][1]} | {r['beta_ms'][0]:.2f} "
                         f"({r['beta_ms'][1]:.2f}-{r['beta_ms'][2]:.2f}) | {w} |")
        lines.append("")
    lines += [f"Command: `{m['command']}`", ""]
    return "\n".join(lines)


def plot(result: dict, steps: list[dict], path: Path) -> Path | None:
    """Predicted against measured ms (step, forward), coloured by batch-size bucket, y = x dashed; and F's median
    relative error by row bin (online, hindsight line and piecewise). None where matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        print("plot skipped: matplotlib is not installed. Fix: pip install matplotlib (or 'vllm-dflash[train]')")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    buckets = sorted({pow2_bin(s["B"], B_TOP) for s in steps}, key=_bin_key)
    color = {b: f"C{i}" for i, b in enumerate(buckets)}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    for ax, (meas, pred, what) in zip(axes[:2], (("dt", "pred", "step (less the draft forward)"),
                                                 ("fwd", "pred_fwd", "target forward F(n)")), strict=True):
        pts = [s for s in steps if s[meas] is not None and s[pred] is not None]
        for b in buckets:
            sel = [s for s in pts if pow2_bin(s["B"], B_TOP) == b]
            ax.scatter([1e3 * s[meas] for s in sel], [1e3 * s[pred] for s in sel], s=6, alpha=0.5, color=color[b],
                       label=f"B {b}")
        if pts:
            lo = min(1e3 * min(s[meas], s[pred]) for s in pts)
            hi = max(1e3 * max(s[meas], s[pred]) for s in pts)
            ax.plot([lo, hi], [lo, hi], "k--", linewidth=1)
            ax.set(xscale="log", yscale="log")
            for axis in (ax.xaxis, ax.yaxis):  # ticks at 1, 2, 5 x 10^k, written plainly
                axis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
                axis.set_major_formatter(ticker.FormatStrFormatter("%g"))
                axis.set_minor_formatter(ticker.NullFormatter())
        ax.set(title=what, xlabel="measured ms", ylabel="predicted ms")
        ax.legend(fontsize=7, markerscale=2)
    h = result.get("forward_hindsight")
    ax = axes[2]
    if h:
        x = np.arange(len(h["by_n"]))
        for i, (k, name) in enumerate((("online", "online fit"), ("linear", "line, hindsight"),
                                       ("piecewise", "piecewise, hindsight"))):
            ax.bar(x + (i - 1) * 0.27, [100 * r[k] for r in h["by_n"]], 0.27, label=name)
        ax.set_xticks(x, [f"{r['n']}\n({r['steps']})" for r in h["by_n"]])
        ax.axhline(0, color="k", linewidth=0.8)
    ax.set(title="F(n): median relative error by rows", xlabel="query rows n (steps)", ylabel="%")
    ax.legend(fontsize=7)
    m = result["meta"]
    fig.suptitle(f"step-cost model, {m['cpu_class']}{', ' + m['label'] if m['label'] else ''}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", help="trace files (trace-<pid>.jsonl) or folders of them (DFLASH_TRACE)")
    ap.add_argument("--out-dir", default="bench-results")
    ap.add_argument("--name", default="cost_model")
    ap.add_argument("--label", default="", help="where the traces come from (run name, dtype, concurrency)")
    ap.add_argument("--cpu", default=None, help="the CPU kind the traces ran on (default: this machine's)")
    ap.add_argument("--warmup", type=int, default=8, help="cost samples left out at the start of each trace")
    a = ap.parse_args(argv)
    result, steps = check(a.traces, a.warmup)
    if not steps:
        print(f"no cost samples in {a.traces} (a DFLASH_TRACE folder of an adaptive run, synchronous scheduling?)")
        return 1
    result["meta"] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "label": a.label,
        "cpu_class": a.cpu or cpu_class(), "cpu_kind": "given" if a.cpu else cpu_kind(), "steps": len(steps),
        "warmup": a.warmup,
        "command": shlex.join(["python", "benchmarks/cost_model.py", *(sys.argv[1:] if argv is None else argv)])}
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{a.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    text = render_markdown(result)
    (out / f"{a.name}.md").write_text(text)
    plot(result, steps, out / f"{a.name}.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
