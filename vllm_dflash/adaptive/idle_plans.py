# SPDX-License-Identifier: Apache-2.0
"""`IdlePlanBackoff`: plan less often where planning finds nothing to draft.

A planned step costs host time in proportion to the batch (per request: its prompt lookup, the cross-request index,
its row of the gain table). Served on the bf16 EPYC at temperature 1.0 (open chat), the plans of 30-55 % of the
steps at c8 and c32 verified no draft (sampled acceptance too low for any draft to pay), and each still cost 0.8-1.2
ms at c8 and 1.2-2.3 ms at c32, where a step without planning costs 0.1 ms.

After `idle` planned steps in a row of a batch-size bucket drafted nothing, that bucket plans only every `every`-th
step, until a plan drafts again: a step in between proposes nothing, as the plans before it did, at the cost of a
step without speculation. A draft that would pay and shows up meanwhile waits at most `every - 1` steps."""
from __future__ import annotations


class IdlePlanBackoff:
    def __init__(self, idle: int = 8, every: int = 4):
        if idle < 1 or every < 1:
            raise ValueError(f"IdlePlanBackoff: idle {idle}, every {every} must be >= 1")
        self.idle, self.every = idle, every
        self._run: dict[int, int] = {}  # bucket -> planned steps in a row that drafted nothing
        self._since: dict[int, int] = {}  # bucket -> steps since its last plan, while it backs off

    def skip(self, bucket: int) -> bool:
        """Does this step of `bucket` go without planning (proposing nothing)? Counts the step."""
        if self._run.get(bucket, 0) < self.idle:
            return False
        n = self._since[bucket] = self._since.get(bucket, 0) + 1
        if n < self.every:
            return True
        self._since[bucket] = 0
        return False

    def planned(self, bucket: int, drafted: bool) -> None:
        """A step of `bucket` was planned; did its plan draft any token?"""
        self._run[bucket] = 0 if drafted else self._run.get(bucket, 0) + 1
        if drafted:
            self._since.pop(bucket, None)
