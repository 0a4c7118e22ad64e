# SPDX-License-Identifier: Apache-2.0
"""The engine side of the served mixed-source check (mixed.py): a sitecustomize.py, put on a server's PYTHONPATH,
whose import hook runs a patch in every server process once the patched module is imported there.

FORCED_PLAN (in the module of adaptive drafting under synchronous scheduling, our default): each request gets the
proposal source its id names -- the client sends `X-Request-Id: dflashmix-<group>-<i>`, which vLLM 0.32 makes the
base of the engine's request id (`vllm/entrypoints/serve/engine/serving.py::_base_request_id`, then `cmpl-<id>-0`
and maybe a suffix: the group is read with a regex). Groups: DFlash block, merged (prompt lookup, then DFlash
slots), own prompt lookup (the request's history only), cross-request lookup (other requests' tokens only; the
cross group's tokens are not indexed, so its lookups come from the main prompt's requests), none, and greedy (DFlash
block). Its counters (per group: proposals verified in steps whose q went to the verifier; the cross lookups
planned) go to a JSON file after every drafting step. The forcing is that of tests/vllm/test_vllm_sampling_mixed.py,
keyed by request id instead of order of arrival.

MISMATCHED_Q (the negative control, in the q hand-off's module): the verifier is told a q other than the one each
token was drawn from: uniform over the draft vocabulary at lookup / padding slots (a deterministic token: its q is
one-hot; told uniform, the verifier accepts it almost always), sharpened (q^16, renormalised) at DFlash slots.
The in-process test runs this same control."""
from __future__ import annotations

from pathlib import Path

GROUPS = ("dflash", "merged", "own", "cross", "none", "greedy")  # by request index % 6: every step mixes them
DRAFTING = ("dflash", "merged", "own", "cross")  # the groups whose proposals are verified
ID_PREFIX = "dflashmix"

HOOK = '''# written by vllm_dflash/bench/soak/mixed_plan.py: once a module below is imported, its patch runs
import importlib.abc
import importlib.machinery
import sys

_PATCHES = __PATCHES__


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _PATCHES:
            return None
        code = _PATCHES.pop(name)
        if not _PATCHES:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            exec(compile(code, "<mixed-check patch of " + name + ">", "exec"), {"__name__": "_dflash_mixed"})

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Hook())
'''

FORCED_PLAN = '''
import json
import os
import re
import sys

from vllm_dflash.adaptive import controller as C

A = sys.modules["vllm_dflash.integration.drafting.adaptive"]  # being imported: its module is complete
OUT = __OUT__
SRC = {"dflash": "dflash", "merged": "merged", "own": "ngram", "cross": "ngram", "none": "none", "greedy": "dflash"}
_ID = re.compile(__PREFIX__ + r"-([a-z]+)-[0-9]+")
T = {"with_q": {g: 0 for g in SRC}, "cross": 0, "steps": 0, "pid": os.getpid()}


def _group(rid):
    m = _ID.search(rid)
    return m.group(1) if m and m.group(1) in SRC else None


_lookup, _prompt_lookup = C.AdaptiveController._lookup, C.prompt_lookup


def _forced_lookup(self, req_id, *a, **k):
    g = _group(req_id)
    cross = self.cross
    try:
        if g == "own":
            self.cross = None  # the request's own history only
        elif g == "cross":
            C.prompt_lookup = lambda h, *x, **y: h[:0]  # no own match: the cross index answers
            if cross is not None:
                cross.observe = lambda *x, **y: None  # not indexed
        out = _lookup(self, req_id, *a, **k)
    finally:
        self.cross, C.prompt_lookup = cross, _prompt_lookup
        if cross is not None and "observe" in vars(cross):
            del cross.observe
    if g == "own" and cross is not None:  # the index still sees this request's tokens
        _lookup(self, req_id, *a, **k)
        self._from_cross.discard(req_id)
    T["cross"] += g == "cross" and req_id in self._from_cross and len(out) > 0
    return out


_plan = C.AdaptiveController.plan


def _fixed(self, req_ids, *a, **k):
    self.skip_when_off = False  # a measured 'off' arm would skip the lookups the forced plan verifies
    p = _plan(self, req_ids, *a, **k)
    gs = [_group(r) for r in req_ids]
    p.sources = [SRC.get(g, s) for g, s in zip(gs, p.sources)]
    p.ks = [k0 if g is None else 0 if s == "none" else min(len(t), self.k_max) if s == "ngram" else self.k_max
            for g, s, t, k0 in zip(gs, p.sources, p.lookups, p.ks)]
    p.drop_context = False
    return p


_propose = A.AdaptiveDrafting._propose


def _counted(self, step):
    out = _propose(self, step)
    T["steps"] += 1
    if self.drafter._last_draft_probs is not None:
        ids = self.drafter._runner.input_batch.req_ids
        for i, toks in enumerate(out):
            g = _group(ids[i]) if toks else None
            if g is not None:
                T["with_q"][g] += 1
    tmp = OUT + "." + str(os.getpid())
    with open(tmp, "w") as f:
        json.dump(T, f)
    os.replace(tmp, OUT)
    return out


C.AdaptiveController._lookup = _forced_lookup
C.AdaptiveController.plan = _fixed
A.AdaptiveDrafting._propose = _counted
'''

MISMATCHED_Q = '''
import sys

import torch

D = sys.modules["vllm_dflash.integration.draft_probs"]
build = D.DraftProbs.build


def mismatched(self, B, q_cells, q, hot_cells=None, hot_tokens=None):
    if q is not None:
        q = q ** 16
        q = q / q.sum(-1, keepdim=True)
    if hot_cells is not None and hot_cells.numel():
        flat = torch.full((hot_cells.numel(), self.draft_ids.numel()), 1.0 / self.draft_ids.numel())
        q_cells = hot_cells if q_cells is None else torch.cat([q_cells, hot_cells])
        q = flat if q is None else torch.cat([q, flat.to(q)])
    return build(self, B, q_cells, q)


D.DraftProbs.build = mismatched
'''


def write_sitecustomize(folder: Path, probe: Path, control: bool) -> Path:
    """folder/sitecustomize.py forcing the plan (its counters to `probe`), with the mismatched q when `control`."""
    plan = FORCED_PLAN.replace("__OUT__", repr(str(probe))).replace("__PREFIX__", repr(ID_PREFIX))
    patches = {"vllm_dflash.integration.drafting.adaptive": plan}
    if control:
        patches["vllm_dflash.integration.draft_probs"] = MISMATCHED_Q
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sitecustomize.py"
    path.write_text(HOOK.replace("__PATCHES__", repr(patches)))
    return path
