# SPDX-License-Identifier: Apache-2.0
"""The calibration check of sampled output (vllm_dflash/bench/soak/calibrate.py, `vllm-dflash soak --calibration`)
on a live `vllm serve` with the tiny pair and our default config, float32, at CI size (64 requests x 64 tokens at
c8, temperature 1.0, top-20 logprobs; marked vllm, ~2-3 min on 2 cores): |z| of the top-1 and top-5 sets stays below
3.5. Negative control: the same server with a fault injected (a sitecustomize on the server's PYTHONPATH makes our
drafter tell the verifier every draft had probability 1e-6, so nearly every draft is accepted) must fail the same
check at the same size (issue 61: z top-1 / top-5 -13.8 / -18.5 from the exact tail, -17.0 / -28.9 plain; the sound
server +1.2 / 0.0). The tiny target is peaked, so the check reads the exact tail (bench/calibration.py:
Tally.exact_z). The statistic itself is unit-tested in tests/unit/test_calibration.py."""
import os

import pytest

# Injected into every process of the broken server (PYTHONPATH): once vllm_dflash.integration.proposer is imported,
# DFlashDrafter.propose hands vLLM a q of 1e-6 for every draft slot.
FAULT = '''
import importlib.abc
import importlib.machinery
import sys

_NAME = "vllm_dflash.integration.proposer"


def _patch(P):
    import torch

    orig = P.DFlashDrafter.propose

    def lying(self, *a, **k):
        d = orig(self, *a, **k)
        V = self.vllm_config.model_config.get_vocab_size()
        self._last_draft_probs = torch.full((len(d), self.num_speculative_tokens, V), 1e-6)
        return d

    P.DFlashDrafter.propose = lying


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _NAME:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Hook())
'''


@pytest.mark.vllm
def test_calibration_served_and_negative_control(pair, tmp_path):
    from vllm_dflash.bench.calibration import Z_LIMIT
    from vllm_dflash.bench.soak.calibrate import run_calibration_check

    fault = tmp_path / "fault"
    fault.mkdir()
    (fault / "sitecustomize.py").write_text(FAULT)
    common = dict(target=pair / "target", draft=pair / "draft-b8", configs=["ours"], dtype="float32", n=64,
                  max_tokens=64, concurrency=8, max_model_len=1024)
    good = run_calibration_check(**common, log_dir=tmp_path / "good")
    path = os.pathsep.join(p for p in (str(fault), os.environ.get("PYTHONPATH")) if p)
    bad = run_calibration_check(**common, log_dir=tmp_path / "bad", env={"PYTHONPATH": path})
    ours, broken = good["configs"]["ours"], bad["configs"]["ours"]
    assert good["passed"], good["checks"]
    assert ours["tokens"] == 64 * 64 and ours["impossible"] == 0
    assert ours["accepted_tokens"] > 0, "no scored token came through the verifier: the check would test nothing"
    assert {"open-chat", "copy"} <= set(ours["by_source"])
    # the broken build: same size, same check, fails it (z from the exact tail where the run has one: the tiny
    # target is peaked, so its information is small)
    assert "error" not in broken, broken.get("error")
    assert broken["accepted_share"] > ours["accepted_share"]
    zs = [broken.get(f"z_top{k}_exact", broken[f"z_top{k}"]) for k in (1, 5)]
    assert max(abs(z) for z in zs) > Z_LIMIT, broken
    assert {c["name"] for c in bad["checks"] if not c["ok"]} == {"calibrated:ours"}, bad["checks"]
