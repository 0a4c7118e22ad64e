#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""Plain draft, hinted draft and prompt lookup through vLLM, side by side on the same prompts (issue: n-gram-hinted
blocks): τ and tokens per target forward, fixed block (each draft alone), code and chat.

    python dev/studies/hinted_vllm.py --hinted DRAFT_DIR                  # runs the four evals, then writes the tables
    python dev/studies/hinted_vllm.py --hinted DRAFT_DIR --from-dir DIR   # assemble from saved `eval --json` outputs
                                                                         # named <prompts>-<draft folder name>.json

Each eval is `vllm-dflash eval --engine vllm --draft D --prompts P --limit N --max-new-tokens 256 --concurrency 32
--no-baseline --ngram 7 --json` (the plain draft's run also measures vLLM's prompt lookup, 7 tokens, on the same
prompts). Results: dev/results/hinted_vllm.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLAIN = ROOT / "models" / "SmolLM2-135M-Instruct-DFlash-b8"


def eval_args(draft: Path, prompts: str, limit: int) -> list[str]:
    return ["eval", "--engine", "vllm", "--draft", str(draft), "--prompts", prompts, "--limit", str(limit),
            "--max-new-tokens", "256", "--concurrency", "32", "--no-baseline", "--ngram", "7", "--json"]


def last_json(text: str) -> dict:
    line = next(ln for ln in reversed(text.splitlines()) if ln.startswith("{"))
    return json.loads(line)


def main() -> int:
    from vllm_dflash.utils import cpu_kind

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hinted", required=True, help="the hinted draft folder (dflash_config.hint_ngram set)")
    p.add_argument("--plain", default=str(PLAIN))
    p.add_argument("--prompts", default="humaneval,chat")
    p.add_argument("--limit", type=int, default=64)
    p.add_argument("--from-dir", default=None)
    p.add_argument("--out", default=str(ROOT / "dev" / "results" / "hinted_vllm"))
    a = p.parse_args()
    cli = str(Path(sys.executable).with_name("vllm-dflash"))
    reports: dict[str, dict[str, dict]] = {}
    for ps in a.prompts.split(","):
        for role, draft in (("plain", Path(a.plain)), ("hinted", Path(a.hinted))):
            if a.from_dir:
                text = (Path(a.from_dir) / f"{ps}-{draft.name}.json").read_text()
            else:
                text = subprocess.run([cli, *eval_args(draft, ps, a.limit)], capture_output=True, text=True,
                                      check=True).stdout
            reports.setdefault(ps, {})[role] = last_json(text)
    cpu = cpu_kind()
    meta = {"written": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cpu": cpu, "hinted": a.hinted, "plain": a.plain,
            "eval_command": "vllm-dflash " + " ".join(eval_args(Path("DRAFT"), "PROMPTS", a.limit))}
    Path(a.out + ".json").write_text(json.dumps({"hinted_vllm": meta, "reports": reports}, indent=1) + "\n")
    rows = ["| prompts | source | τ (per verify step) | tokens per target forward | first-position acceptance |",
            "|---|---|---:|---:|---:|"]
    for ps, r in reports.items():
        ng = r["plain"].get("ngram") or {}
        for name, rep in (("DFlash block, plain draft", r["plain"]), ("DFlash block, hinted draft", r["hinted"])):
            rows.append(f"| {ps} | {name} | {rep['acceptance_length']:.2f} | {rep['tokens_per_forward']:.2f} | "
                        f"{rep['per_position_acceptance'][0]:.3f} |")
        tpf = ng.get("tokens_per_forward")
        rows.append(f"| {ps} | vLLM prompt lookup, {ng.get('num_speculative_tokens')} tokens | "
                    f"{ng.get('acceptance_length', 0):.2f} | {'–' if tpf is None else f'{tpf:.2f}'} | "
                    f"{ng['per_position_acceptance'][0]:.3f} |")
    n = next(iter(reports.values()))["plain"]["num_prompts"]
    md = [f"# Plain, hinted and prompt lookup through vLLM ({meta['written']})", "",
          f"{cpu}; {n} prompts per set, greedy, up to 256 new tokens, concurrency 32, fixed block of 8 (each source "
          f"alone); plain draft `{Path(a.plain).name}`, hinted draft `{a.hinted}`; each eval: `{meta['eval_command']}`",
          "", *rows, ""]
    Path(a.out + ".md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
