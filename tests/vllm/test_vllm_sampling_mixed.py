# SPDX-License-Identifier: Apache-2.0
"""Sampling keeps the target's distribution under adaptive drafting (the default), in a step that mixes every kind of
proposal: a forced plan gives each request, by order of arrival, one source -- a DFlash block, a merged proposal
(prompt lookup, then DFlash slots), its own prompt lookup, a cross-request lookup, no proposal -- all sampled, beside
greedy requests, so sampled DFlash rows (whose q is handed to the verifier) share steps with sampled lookup rows.

Per source, the first MAX_TOKENS tokens of its seeded requests are compared with the target's own distribution (no
speculation, other seeds) by a two-sample chi-square, at temperatures 0.7 and 1.0. The same test flags a hand-off
whose q is not the one each token was drawn from (negative control: the q of lookup slots uniform instead of one-hot,
the q of DFlash slots sharpened), and the greedy requests equal the target's greedy output (float32).

The bug this guards (issue 61): lookup rows were verified against an earlier step's DFlash q left in the persistent
buffer (tests/vllm/test_draft_probs_handoff.py replays it without an engine)."""
import collections

import pytest
import torch
from support.stats import chi2_two_sample_pvalue
from support.vllm_helpers import run_vllm

from vllm_dflash.bench.soak.mixed_plan import MISMATCHED_Q as MIXED_CHECK_CONTROL

pytestmark = pytest.mark.vllm
GROUPS = ("dflash", "merged", "own", "cross", "none", "greedy")  # by order of arrival % 6
PER_GROUP = 700
MAX_TOKENS = 4
# a prompt whose continuation the tiny target keeps uncertain at temperature 0.7 (7 two-token outcomes of 1000 seen
# at least 10 times), and whose continuations repeat tokens, so own lookups find proposals
PROMPT = torch.randint(4, 384, (12,), generator=torch.Generator().manual_seed(21)).tolist()
# the cross group's prompt: PROMPT's last 3 tokens after another start, so its cross lookups find the continuations of
# PROMPT's requests (a context whose distribution differs: a proposal not drawn from this request's own target
# distribution, as in real traffic; were it drawn from it, accepting it always would go unseen)
CROSS_PROMPT = torch.randint(4, 384, (9,), generator=torch.Generator().manual_seed(2001)).tolist() + PROMPT[9:]

# The forced plan: sources by order of arrival; own lookups only from the request's history, cross lookups only from
# other requests' (the cross group's own tokens are not indexed: its lookups come from PROMPT's requests). Records,
# per group, the proposals verified in steps whose q went to the verifier (a sampled DFlash token in the batch) and
# the cross lookups planned.
PLAN = """
from vllm_dflash.adaptive import controller as C
from vllm_dflash.integration.drafting import adaptive as A
G = {groups!r}
C._test = {{"order": {{}}, "with_q": {{g: 0 for g in G}}, "cross": 0}}
if not getattr(C, "_test_patched", False):  # the runs share a process: patch once
    C._test_patched = True
    def _group(rid):
        order = C._test["order"]
        return G[order.setdefault(rid, len(order)) % len(G)]
    _lookup, _prompt_lookup = C.AdaptiveController._lookup, C.prompt_lookup
    def _forced_lookup(self, req_id, *a, **k):
        g = _group(req_id)
        cross = self.cross
        try:
            if g == "own":
                self.cross = None  # the request's own history only
            elif g == "cross":
                C.prompt_lookup = lambda h, *x, **y: h[:0]  # no own match: the cross index answers
                cross.observe = lambda *x, **y: None  # not indexed
            out = _lookup(self, req_id, *a, **k)
        finally:
            self.cross, C.prompt_lookup = cross, _prompt_lookup
            if cross is not None and "observe" in vars(cross):
                del cross.observe
        if g == "own" and cross is not None:  # the index still sees this request's tokens
            _lookup(self, req_id, *a, **k)
            self._from_cross.discard(req_id)
        C._test["cross"] += g == "cross" and req_id in self._from_cross and len(out) > 0
        return out
    C.AdaptiveController._lookup = _forced_lookup
    _plan = C.AdaptiveController.plan
    def _fixed(self, req_ids, *a, **k):
        p = _plan(self, req_ids, *a, **k)
        src = {{"dflash": "dflash", "merged": "merged", "own": "ngram", "cross": "ngram", "none": "none",
               "greedy": "dflash"}}
        p.sources = [src[_group(r)] for r in req_ids]
        p.ks = [0 if s == "none" else (min(len(t), self.k_max) if s == "ngram" else self.k_max)
                for s, t in zip(p.sources, p.lookups)]
        p.drop_context = False
        return p
    C.AdaptiveController.plan = _fixed
    _propose = A.AdaptiveDrafting._propose
    def _counted(self, step):
        out = _propose(self, step)
        if self.drafter._last_draft_probs is not None:
            ids = self.drafter._runner.input_batch.req_ids
            for i, toks in enumerate(out):
                if toks:
                    C._test["with_q"][_group(ids[i])] += 1
        return out
    A.AdaptiveDrafting._propose = _counted
"""
# Fault injection (negative control): the soak's mismatched q (vllm_dflash/bench/soak/mixed_plan.py) -- the verifier
# is told uniform over the draft vocabulary at lookup / padding slots (a deterministic token: its q is one-hot; told
# uniform, the verifier accepts the proposal almost always), q^16 renormalised at sampled DFlash slots. Run once per
# process (the runs share one).
MISMATCHED_Q = f"""
from vllm_dflash.integration import draft_probs as D
if not getattr(D, "_test_mismatched", False):
    D._test_mismatched = True
    exec(compile({MIXED_CHECK_CONTROL!r}, "<mismatched q>", "exec"), {{"__name__": "_test_mismatched"}})
"""
PROBE = "from vllm_dflash.adaptive import controller as C; probe.update(C._test)"


def _groups(res) -> dict[str, collections.Counter]:
    out = {g: collections.Counter() for g in GROUPS}
    for i, toks in enumerate(res["tokens"]):
        out[GROUPS[i % len(GROUPS)]][tuple(toks)] += 1
    return out


@pytest.fixture(scope="module", params=[0.7, 1.0], ids=lambda t: f"T{t}")
def runs(request, pair):
    T = request.param
    n = PER_GROUP * len(GROUPS)
    spec = {"method": "dflash", "model": str(pair / "draft-b8"), "num_speculative_tokens": 7}
    sampling = [{"temperature": 0.0 if GROUPS[i % len(GROUPS)] == "greedy" else T} for i in range(n)]
    prompts = [CROSS_PROMPT if GROUPS[i % len(GROUPS)] == "cross" else PROMPT for i in range(n)]
    common = {"model": str(pair / "target"), "prompts": prompts, "max_tokens": MAX_TOKENS,
              "sampling_list": sampling, "max_num_seqs": 48}
    patch = PLAN.format(groups=GROUPS)
    base, ours, lossy = run_vllm([
        {**common, "per_prompt_seed": 0},
        {**common, "per_prompt_seed": 1_000_000, "speculative_config": spec, "patch": patch, "after": PROBE},
        {**common, "per_prompt_seed": 1_000_000, "speculative_config": spec, "patch": patch + MISMATCHED_Q,
         "after": PROBE},
    ])
    return T, base, ours, lossy


def test_every_source_keeps_the_distribution(runs):
    """Per source, sampled: our output's distribution equals the target's (p > 1e-3) and each source's proposals were
    verified with a q hand-off in their step; a mismatched q is caught for every source that verifies drafts."""
    T, base, ours, lossy = runs
    b, o, bad = _groups(base), _groups(ours), _groups(lossy)
    # the target's distribution per prompt: PROMPT's pooled over its sampled groups, CROSS_PROMPT's from its group
    pooled = sum((b[g] for g in GROUPS if g not in ("greedy", "cross")), collections.Counter())
    target = {g: b["cross"] if g == "cross" else pooled for g in GROUPS}
    for g in ("dflash", "cross"):
        assert sum(v >= 10 for v in target[g].values()) >= 4, f"too peaked to test: {target[g].most_common(5)}"
    probe = ours["probe"]
    assert probe["cross"] > 0, probe  # cross-request lookups were planned for the cross group
    caught = []
    for g in GROUPS:
        if g == "greedy":
            continue
        if g != "none":
            assert probe["with_q"][g] > 0, (g, probe)  # verified beside a sampled DFlash row's q
        p = chi2_two_sample_pvalue(target[g], o[g])
        assert p > 1e-3, f"source {g} at T={T}: our output is not the target's distribution (p={p:.2e})"
        caught.append((g, chi2_two_sample_pvalue(target[g], bad[g])))
    missed = [(g, p) for g, p in caught if g != "none" and p >= 1e-3]
    assert not missed, f"negative control at T={T}: a mismatched q was not detected for {missed}"


def test_greedy_rows_are_the_targets(runs):
    """Greedy requests batched with the sampled mix give the target's greedy output, token for token (float32)."""
    _, base, ours, _ = runs
    greedy = [i for i in range(len(base["tokens"])) if GROUPS[i % len(GROUPS)] == "greedy"]
    assert [ours["tokens"][i] for i in greedy] == [base["tokens"][i] for i in greedy]
