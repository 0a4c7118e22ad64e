# SPDX-License-Identifier: Apache-2.0
"""`OverlapDrafting`: adaptive drafting under overlap (async) scheduling. The lengths are the scheduler's
(integration/async_scheduler.py); the drafter picks per request only the source (DFlash block, prompt lookup or the
two merged) of a full K-token proposal, and the draft forward runs only if some chosen proposal holds DFlash tokens.

The host copy of the tokens lags under async scheduling, so each request's history is mirrored from this step's
verified query tokens (adaptive/history.py `TokenHistory`). Its query is [previous sampled token, k drafts]: k drafts
were verified (0 after a prefill chunk, when no proposal was pending) and k - rejected accepted."""
from __future__ import annotations

import numpy as np
import torch

from vllm_dflash.adaptive.history import TokenHistory
from vllm_dflash.integration.drafting.adaptive import AdaptiveDrafting
from vllm_dflash.integration.drafting.block_sampling import hand_off_probs
from vllm_dflash.integration.drafting.hints import hint_tokens, write_hints
from vllm_dflash.integration.drafting.plan import DraftPlan


class OverlapDrafting(AdaptiveDrafting):
    def __init__(self, drafter, mode, device):
        super().__init__(drafter, mode, device)
        self.history = TokenHistory()
        self._seen: dict[str, int] = {}  # request id -> the call that last saw it
        self._calls = 0

    def propose(self, step) -> torch.Tensor:
        """-> [B, K] int64 full-length proposals. Rows of partial prefills hold filler (the runner discards their
        drafts). K = 0: no proposals, but this step's tokens and outcomes are still mirrored and scored."""
        if step.K == 0:
            self._propose(step)
            return step.empty()
        self.drafter.metrics.inc("draft_steps")
        return self._propose(step)

    def _propose(self, step) -> torch.Tensor:
        d, ctl, K = self.drafter, self.controller, step.K
        batch, cad, num_rejected = d._runner.input_batch, step.target_cad, step.num_rejected
        B = cad.num_reqs
        self._calls += 1
        qsl = cad.query_start_loc_cpu[: B + 1].tolist()
        rej = num_rejected.tolist() if num_rejected is not None else [0] * B
        target_positions = step.target_positions
        pos = (target_positions if target_positions.dim() == 1 else target_positions[0]).cpu().numpy()
        toks = step.target_token_ids.cpu().numpy()
        bonus = step.next_token_ids.tolist()
        out = np.empty((B, K), dtype=np.int64)
        out[:] = np.asarray(bonus, dtype=np.int64)[:, None]
        rows, req_ids, hists, verified = [], [], [], []
        for i in range(B):
            rid = batch.req_ids[i]
            s, e = qsl[i], qsl[i + 1]
            end = e - int(rej[i])
            if e <= s or end <= s:
                continue
            self._seen[rid] = self._calls
            n_prompt = int(batch.num_prompt_tokens[i])
            if rid not in self.history:
                self.history.start(rid, batch.token_ids_cpu[i, :n_prompt])
            if int(pos[end - 1]) + 1 < n_prompt:
                continue  # partial prefill: its drafts are discarded
            hists.append(self.history.commit(rid, int(pos[s]), toks[s:end], int(bonus[i])))
            k = min(e - s - 1, ctl.k_max) if rid in ctl._pending else 0
            verified.append((k, k - int(rej[i])))
            rows.append(i)
            req_ids.append(rid)
        if rows and K:
            plan = ctl.plan_overlap(req_ids, hists, verified, sampled=self._sampled(rows))
            # no clock here (the lengths are the scheduler's, one process), but the same insurance as synchronous
            plan = self._sync(plan)
            block = None
            if plan.needs_block:
                write_hints(step.query_ids(), K, rows, hint_tokens(d.hint_ngram, ctl, K, plan.lookups, hists))
                block = self._block(step, rows)
            out[rows] = ctl.propose_overlap(plan, block, out[rows, 0])
            if block is not None:  # every batch row has K drafts here (rows left out: the bonus as padding)
                span_of = dict(zip(rows, DraftPlan.of(plan, rows, k_max=K).spans))
                hand_off_probs(step, range(B), out, [span_of.get(i) for i in range(B)])
        elif rows:
            ctl.score_overlap(req_ids, verified)
        if self._calls % 64 == 0:  # requests not seen for 64 steps: finished or long preempted
            gone = [r for r, t in self._seen.items() if t < self._calls - 64]
            self.history.drop(gone)
            for r in gone:
                del self._seen[r]
        d.metrics.flush()
        return torch.from_numpy(out).to(step.next_token_ids.device)
