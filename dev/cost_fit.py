# SPDX-License-Identifier: Apache-2.0
"""Offline check of the adaptive planner's step-cost model on recorded steps (dev/step_profile.py --json).

    python dev/cost_fit.py runs/prof.none.json runs/prof.ngram.json runs/prof.ours.json [--key step]

Fits, by ordinary least squares over every decode step of the given records, the one-slope model
T = a + b * n and the two-slope model T = a + b * n + d * B (n query tokens, B requests), on the step's wall time
(`step`) or the target forward alone (`fwd`), and prints both fits, their residual spread, and b by batch-size bucket
(a fit of T = a_B + b * n within each bucket: the draft-token slope with the batch size held fixed). The online model
(`StepCostModel`) is then replayed over the steps in their recorded order, with and without B, to show what the
planner would have read at the end."""
from __future__ import annotations

import argparse
import json

import numpy as np


def ols(X: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, float]:
    th, *_ = np.linalg.lstsq(X, t, rcond=None)
    return th, float(np.std(t - X @ th))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", nargs="+")
    ap.add_argument("--key", default="step", choices=["step", "fwd"])
    ap.add_argument("--block", type=int, default=8, help="at most this many query tokens per request: a step with "
                    "more held a prefill chunk (not a decode cost; the planner skips those too)")
    a = ap.parse_args()
    from vllm_dflash.adaptive.policy import StepCostModel

    steps = []
    for path in a.records:
        rec = json.load(open(path))
        steps += [(r["query_tokens"], r["reqs"], r[a.key], rec["config"]) for r in rec["steps"]
                  if r.get("reqs") and r.get(a.key) and r["query_tokens"] <= a.block * r["reqs"]]
    n, B, t = (np.array([s[i] for s in steps], dtype=float) for i in range(3))
    one, r1 = ols(np.stack([np.ones_like(n), n], 1), t)
    two, r2 = ols(np.stack([np.ones_like(n), n, B], 1), t)
    print(f"{len(t)} steps ({a.key}); n {n.min():.0f}-{n.max():.0f}, B {B.min():.0f}-{B.max():.0f}")
    print(f"one slope: a {1e3 * one[0]:.2f} ms, b {1e3 * one[1]:.3f} ms/token; residual sd {1e3 * r1:.2f} ms")
    print(f"two slopes: a {1e3 * two[0]:.2f} ms, b {1e3 * two[1]:.3f} ms/token, d {1e3 * two[2]:.3f} ms/request; "
          f"residual sd {1e3 * r2:.2f} ms")
    for lo, hi in ((1, 2), (2, 4), (4, 8), (8, 16), (16, 33)):
        m = (B >= lo) & (B < hi)
        if m.sum() < 8 or np.ptp(n[m]) == 0:
            continue
        Bs = np.unique(B[m])
        X = np.concatenate([np.stack([n[m]], 1), (B[m][:, None] == Bs[None, :]).astype(float)], 1)
        th, _ = ols(X, t[m])
        print(f"  B {lo}-{hi - 1}: {m.sum()} steps, b {1e3 * th[0]:.3f} ms/token (a per batch size)")
    for name, with_b in (("online one-slope", False), ("online two-slope", True)):
        cm = StepCostModel()
        for nn, bb, tt, _ in steps:
            cm.observe(int(nn), float(tt), int(bb) if with_b else 0)
        print(f"{name}: alpha {1e3 * cm.alpha:.2f} ms, beta {1e3 * cm.beta:.3f} ms/token, "
              f"delta {1e3 * cm.delta:.3f} ms/request")


if __name__ == "__main__":
    main()
