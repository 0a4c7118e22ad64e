# SPDX-License-Identifier: Apache-2.0
"""Which KV blocks hold a complete draft context, so that adaptive drafting can drop context rows with vLLM's prefix
caching on.

The draft's paged KV cache shares the target's block table: a context row (one verified token's fused target
features) is written at the token's slot, `block_id * block_size + offset`. A step whose plan drafts nothing may drop
its rows instead of holding and injecting them (`StepPlan.drop_context`, and the rows of requests that released their
context); the requests of those rows then draft without DFlash until they finish (`AdaptiveController.stale`). With
prefix caching, a block outlives its request: a later request whose prefix hits a cached block reads that block's
draft K/V without writing it. A block some of whose rows were dropped holds another request's stale K/V at those
slots, so a request whose prefix hit covers such a block must not draft DFlash tokens either.

`DraftCacheRecord` keeps that set of blocks:
- a dropped row marks its block incomplete;
- a written row (held for injection, or injected) at offset 0 marks its block complete again: a block is filled from
  offset 0 each time it is allocated (prefix-cache hits are whole blocks), so a block reallocated since its rows were
  dropped is rewritten in full;
- `admit`: a request that shows up in a step after not being in the one before (a new request, a resumed one) and
  whose first context row is past position 0 (its prefix came from the cache) is reported when a block of that
  prefix is incomplete.

No block is kept while no row was ever dropped: `written` returns at once on an empty set, and `admit` only keeps
the batch's request ids (to tell new requests), so an engine whose plans never drop rows pays a set of B ids a
step. Losslessness does not depend on the record (the target verifies every draft); acceptance does: a draft
attending to another request's K/V proposes noise.
"""
from __future__ import annotations

import numpy as np
import torch


class DraftCacheRecord:
    def __init__(self, block_size: int):
        self.block_size = int(block_size)
        self.incomplete: set[int] = set()  # block ids with a dropped row since their offset-0 row was last written
        self._last_batch: set[str] = set()  # the request ids of the step before

    def dropped(self, slots: torch.Tensor) -> None:
        """Rows at these slots [N] (-1 = padding) were not written to the draft cache."""
        s = _host(slots)
        s = s[s >= 0]
        if s.size:
            self.incomplete.update(np.unique(s // self.block_size).tolist())

    def written(self, slots: torch.Tensor) -> None:
        """Rows at these slots [N] are (or will be, before the next draft forward) in the draft cache."""
        if not self.incomplete:
            return
        s = _host(slots)
        starts = s[(s >= 0) & (s % self.block_size == 0)] // self.block_size
        self.incomplete.difference_update(starts.tolist())

    def admit(self, req_ids: list[str], positions: torch.Tensor, query_start_loc, block_table: torch.Tensor
              ) -> list[str]:
        """-> the requests of this step (batch order) new since the step before whose cached prefix holds an
        incomplete block. positions [num_tokens]: the step's query (context) token positions; query_start_loc
        [>= B + 1] (host): each request's first row in them (its tokens before that position are in the KV cache);
        block_table [>= B, max_blocks]: the batch's block table (block ids)."""
        batch = set(req_ids)
        new = [i for i, r in enumerate(req_ids) if r not in self._last_batch]
        self._last_batch = batch
        if not self.incomplete or not new:
            return []
        pos = _host(positions)[_host(query_start_loc)[: len(req_ids)]]  # [B] first context position per request
        out = []
        for i in new:
            n_blocks = -(-int(pos[i]) // self.block_size)  # the blocks of positions [0, first position)
            if n_blocks == 0:
                continue
            blocks = _host(block_table[i, :n_blocks])
            if not self.incomplete.isdisjoint(blocks.tolist()):
                out.append(req_ids[i])
        return out


def _host(t) -> np.ndarray:
    """A tensor (any device) or array -> int64 numpy on the host."""
    if isinstance(t, torch.Tensor):
        return t.detach().to("cpu", torch.int64).numpy()
    return np.asarray(t, dtype=np.int64)
