# SPDX-License-Identifier: Apache-2.0
"""The end of a served check run on its own (`soak --calibration`, `soak --mixed-check`): its JSON written, its
table, each check and one verdict line printed, and the exit code."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def report_check(res: dict[str, Any], out: str, name: str, table: str) -> int:
    """res: the check's result ('checks': [{name, ok, detail}], 'passed', 'meta': {'wall_s'}); out: the JSON's path;
    name: the check's name in the verdict line; table: its markdown. -> 0 if it passed, else 1."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(res, indent=1))
    print(table)
    for c in res["checks"]:
        print(f"  [{'ok' if c['ok'] else 'FAIL'}] {c['name']}: {c['detail']}")
    print(f"{name}: {'PASSED' if res['passed'] else 'FAILED'} in {res['meta']['wall_s']} s; JSON: {out}")
    return 0 if res["passed"] else 1
