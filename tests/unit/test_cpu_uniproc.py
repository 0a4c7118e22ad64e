# SPDX-License-Identifier: Apache-2.0
"""When the CPU platform-hook wrapper (integration/patches/cpu_uniproc.py) puts vLLM's `uni` executor back: only where
vLLM had chosen it, the hook replaced it with `mp`, one worker, the engine core in its own process and synchronous
scheduling. The engine-level behaviour is tests/vllm/test_vllm_patches.py::test_cpu_engine_core_runs_the_model."""
from types import SimpleNamespace as NS

import pytest

from vllm_dflash.integration.patches.cpu_uniproc import keep_uniproc


def _config(after: str, world_size: int = 1, async_scheduling: bool = False):
    return NS(parallel_config=NS(distributed_executor_backend=after, world_size=world_size),
              scheduler_config=NS(async_scheduling=async_scheduling))


@pytest.mark.parametrize("chose, after, world_size, async_scheduling, mp_env, kept", [
    ("uni", "mp", 1, False, "1", True),      # vLLM's default for one worker, replaced by the CPU hook: put back
    ("uni", "mp", 1, False, None, True),     # multiprocessing is on unless VLLM_ENABLE_V1_MULTIPROCESSING=0
    ("mp", "mp", 1, False, "1", False),      # the user's explicit mp: vLLM's worker process stays
    ("uni", "mp", 1, True, "1", False),      # overlap needs the worker in another process
    ("uni", "mp", 2, False, "1", False),     # tensor parallel: several workers
    ("uni", "uni", 1, False, "0", False),    # in-process engine: vLLM kept uni itself
    ("ray", "ray", 1, False, "1", False),
])
def test_keep_uniproc(monkeypatch, chose, after, world_size, async_scheduling, mp_env, kept):
    if mp_env is None:
        monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    else:
        monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", mp_env)
    assert keep_uniproc(_config(after, world_size, async_scheduling), chose) is kept
