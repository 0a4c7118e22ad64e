# SPDX-License-Identifier: Apache-2.0
"""Acceptance estimates of adaptive drafting, free of vLLM: per source and draft position, the conditional rate at
which the target accepts a draft, globally and per request (`AcceptanceModel`), and the cumulative P(i) the planner
weighs (`cumulative_acceptance`)."""
from __future__ import annotations

import numpy as np

SOURCES = ("dflash", "ngram", "merged")  # merged: prompt-lookup tokens first, the DFlash block after them
# A merged proposal's lookup slots are scored as prompt lookup (they are its tokens); its "merged" rates are those of
# the block's slots after a lookup, by slot (the block drafts slot j from the anchor whatever the lookup put before).


class AcceptanceModel:
    """Conditional acceptance per source and draft position, global and per request (shrunk to the global).

    c[s][j] = P(draft j+1 accepted | drafts 1..j accepted). Global rates are exponential moving counts
    (`decay` per observation); a request's own counts decay faster and are blended with `prior_weight` pseudo
    counts of the global rate, so a new request starts at the global estimate and drifts to its own.

    Two pools of global counts: greedy requests (`acc` / `att`) and sampled ones (`acc_sampled` / `att_sampled`,
    requests marked with `mark_sampled`). Under sampling a draft is accepted with sum min(p, q) (one-hot q: p(x)),
    far from the greedy rate either way, so a sampled request starts from (and is shrunk to) the rates measured on
    sampled requests, never the greedy ones.

    Re-exploration (`idle_decay` < 1): a request's own counts of a source also fade by `idle_decay` per step
    (`tick`) in which it did not verify that source, so a request whose drafts stopped paying drifts back to the
    global rate and is tried again, instead of being judged forever by its last few attempts (the planner never
    picks a source that does not pay, so without this its evidence never changes). 1: never."""

    def __init__(self, k_max: int, prior: dict[str, float] | None = None, decay: float = 0.995,
                 request_decay: float = 0.8, prior_weight: float = 2.0, idle_decay: float = 1.0):
        self.k_max = k_max
        self.decay, self.request_decay, self.prior_weight = decay, request_decay, prior_weight
        self.idle_decay = idle_decay
        self.step = 0  # planning steps so far (`tick`)
        self.seen_at: dict[str, dict[str, int]] = {}  # request -> source -> step of its last observation
        prior = prior or {"dflash": 0.5, "ngram": 0.7, "merged": 0.7, "cross": 0.5}  # optimistic start: every source gets tried
        self.acc = {s: np.full(k_max, p * 8.0) for s, p in prior.items()}  # 8 pseudo observations each
        self.att = {s: np.full(k_max, 8.0) for s in prior}
        self.acc_sampled = {s: a.copy() for s, a in self.acc.items()}  # the sampled requests' pool
        self.att_sampled = {s: a.copy() for s, a in self.att.items()}
        self.sampled: set[str] = set()  # requests with temperature > 0 (`mark_sampled`)
        self.req: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}

    def mark_sampled(self, req_ids, sampled) -> None:
        """Which of these requests sample (temperature > 0): their global pool is the sampled one."""
        for rid, s in zip(req_ids, sampled):
            if s:
                self.sampled.add(rid)
            else:
                self.sampled.discard(rid)

    def _pool(self, sampled: bool) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        return (self.acc_sampled, self.att_sampled) if sampled else (self.acc, self.att)

    def tick(self) -> None:
        """One planning step has passed (the clock of re-exploration)."""
        self.step += 1

    def _own(self, req_id: str, source: str) -> tuple[np.ndarray, np.ndarray] | None:
        """A request's own (accepted, attempts) counts of a source [k_max] each, faded by the steps it has not
        verified the source since (`idle_decay`); None: never observed."""
        mine = self.req.get(req_id, {}).get(source)
        if mine is None or self.idle_decay >= 1.0:
            return mine
        idle = self.step - self.seen_at[req_id][source]
        if idle <= 1:  # verified in the step just scored (or this one): no fading
            return mine
        f = self.idle_decay ** (idle - 1)
        return mine[0] * f, mine[1] * f

    def global_rates(self, source: str, sampled: bool = False) -> np.ndarray:  # [k_max]
        acc, att = self._pool(sampled)
        return acc[source] / np.maximum(att[source], 1e-9)

    def rates(self, req_id: str, source: str) -> np.ndarray:  # [k_max]
        g = self.global_rates(source, req_id in self.sampled)
        mine = self._own(req_id, source)
        if mine is None:
            return g
        return self._blend(*mine, g)

    def _blend(self, accepted: np.ndarray, attempts: np.ndarray, g: np.ndarray) -> np.ndarray:
        """A request's own counts shrunk to the global rates g by `prior_weight` pseudo counts (any leading shape)."""
        return (accepted + self.prior_weight * g) / (attempts + self.prior_weight)

    def rates_batch(self, req_ids: list[str], source: str) -> np.ndarray:  # [B, k_max]
        """`rates` of many requests at once (the planner's hot path: one array op instead of one per request)."""
        g = self.global_rates(source)[None, :]  # [1, k_max]
        if self.sampled:
            is_s = np.fromiter((r in self.sampled for r in req_ids), dtype=bool, count=len(req_ids))
            if is_s.any():
                g = np.where(is_s[:, None], self.global_rates(source, True)[None, :], g)  # [B, k_max]
        own = np.zeros((len(req_ids), 2, self.k_max))  # [B, (accepted, attempts), k_max]
        has = np.zeros(len(req_ids), dtype=bool)
        for i, rid in enumerate(req_ids):
            mine = self._own(rid, source)
            if mine is not None:
                own[i, 0], own[i, 1] = mine
                has[i] = True
        g = np.broadcast_to(g, (len(req_ids), self.k_max))
        return np.where(has[:, None], self._blend(own[:, 0], own[:, 1], g), g)

    def observe(self, req_id: str, source: str, num_drafted: int, num_accepted: int, start: int = 0) -> None:
        """One verified proposal: positions 1..accepted were accepted; position accepted+1 (if drafted) rejected.
        start: only positions start+1.. are this source's (the tail of a merged proposal after its lookup tokens);
        nothing is recorded when the target rejected a token before them."""
        if num_drafted <= start or num_accepted < start:
            return
        tried = min(num_accepted + 1, num_drafted)  # positions whose conditional outcome we saw
        hit = np.zeros(self.k_max)
        hit[start:num_accepted] = 1.0
        seen = np.zeros(self.k_max)
        seen[start:tried] = 1.0
        acc, att = self._pool(req_id in self.sampled)
        acc[source] = acc[source] * self.decay + hit
        att[source] = att[source] * self.decay + seen
        a, n = self._own(req_id, source) or (np.zeros(self.k_max), np.zeros(self.k_max))
        self.req.setdefault(req_id, {})[source] = (a * self.request_decay + hit, n * self.request_decay + seen)
        self.seen_at.setdefault(req_id, {})[source] = self.step

    def forget(self, req_id: str) -> None:
        self.req.pop(req_id, None)
        self.seen_at.pop(req_id, None)
        self.sampled.discard(req_id)


def cumulative_acceptance(cond: np.ndarray, length: int) -> np.ndarray:
    """P(i) = prod_{j<=i} cond[j] for i = 1..length -> [length]."""
    return np.cumprod(np.clip(cond[:length], 0.0, 1.0))
