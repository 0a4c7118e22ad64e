# SPDX-License-Identifier: Apache-2.0
"""Sampling with our drafter keeps the target's distribution (vLLM rejection sampler, one-hot greedy
drafts), shown by a two-sample chi-square test over many seeded requests; the same test flags vLLM's
deliberately lossy 'synthetic' acceptance, so it can fail."""
import collections

import pytest
import torch

from support.stats import chi2_two_sample_pvalue
from support.vllm_helpers import counter, run_vllm

pytestmark = pytest.mark.vllm
N = 800
PROMPT = torch.randint(4, 384, (12,), generator=torch.Generator().manual_seed(7)).tolist()
SAMPLING = {"temperature": 1.5, "top_p": 0.95}


# Fault injection: the drafter claims its (greedy) drafts had probability 1e-6, so vLLM's rejection
# sampler accepts them almost always -- a wrong verification the statistical test must catch.
LYING_DRAFTER = """
import torch
from vllm_dflash.integration import proposer as P
orig = P.DFlashDrafter.propose
def lying(self, *a, **k):
    d = orig(self, *a, **k)
    self._last_draft_probs = torch.full((d.shape[0], d.shape[1], 384), 1e-6)
    return d
P.DFlashDrafter.propose = lying
"""


def _dist(res):
    return collections.Counter(tuple(t) for t in res["tokens"])


def test_sampling_distribution(pair):
    t = str(pair / "target")
    spec = {"method": "dflash", "model": str(pair / "draft-b8"), "num_speculative_tokens": 7, "adaptive": False}
    common = {"model": t, "prompts": [PROMPT] * N, "max_tokens": 3, "sampling": SAMPLING, "max_num_seqs": 64}
    base, ours, lossy = run_vllm([
        {**common, "per_prompt_seed": 0},
        {**common, "per_prompt_seed": 100_000, "speculative_config": spec},
        {**common, "per_prompt_seed": 100_000, "speculative_config": spec, "patch": LYING_DRAFTER},
    ])
    b, o, l = _dist(base), _dist(ours), _dist(lossy)
    assert sum(v >= 10 for v in b.values()) >= 3, f"distribution too peaked to test: {b.most_common(5)}"
    assert counter(ours, "vllm:spec_decode_num_accepted_tokens") > 0
    p = chi2_two_sample_pvalue(b, o)
    assert p > 1e-3, f"our drafter changed the sampling distribution (p={p:.2e})"
    assert chi2_two_sample_pvalue(b, l) < 1e-3, "negative control: lossy acceptance was not detected"
