# SPDX-License-Identifier: Apache-2.0
"""`AdaptiveDrafting`: the drafting strategy of adaptive drafting under synchronous scheduling (setting `adaptive`;
see vllm_dflash/adaptive/). Per request the DFlash block, a prompt-lookup proposal or the two merged, and how many
tokens to verify, from measured acceptance and an online step-cost model. The prompt lookup comes first: the
controller plans from the committed histories on the host, and the draft forward runs only when this step's plan
verifies DFlash tokens (over those requests alone where it can, block_rows.py). Returns per-request lists (variable
length). overlap.py subclasses it for overlap scheduling.

Tensor parallelism: the plan is made on each rank with the rank's own clock and the draft forward holds collectives,
so TP rank 0's plan is broadcast and adopted by every rank before the forward is decided (integration/tp_plan.py
`sync_plan_across_tp`; nothing at TP = 1)."""
from __future__ import annotations

import time

import numpy as np
from vllm.logger import init_logger

from vllm_dflash.adaptive.controller import AdaptiveController
from vllm_dflash.adaptive.cross_lookup import SALT_ATTR
from vllm_dflash.integration.draft_cache_record import DraftCacheRecord
from vllm_dflash.integration.drafting.block_sampling import hand_off_probs
from vllm_dflash.integration.drafting.hints import hint_tokens, write_hints
from vllm_dflash.integration.drafting.plan import DraftPlan, decode_rows
from vllm_dflash.integration.tp_plan import sync_plan_across_tp

logger = init_logger(__name__)
_MISSING = object()  # a request whose cache_salt the scheduler did not hand over


def cross_lookup_tokens(vllm_config, tokens: int) -> int:
    """Setting cross_lookup where it can be honoured: its index is emptied with the prefix cache, whose reset runs in
    the engine-core process (patches/prefix_cache_reset.py), so it is used only where the drafter runs there too
    (vLLM's `uni` executor: one worker, synchronous scheduling). Elsewhere off, logged once."""
    if tokens <= 0:
        return 0
    backend = vllm_config.parallel_config.distributed_executor_backend
    if backend == "uni":
        return tokens
    logger.info("vllm-dflash: cross-request lookup (setting cross_lookup) is off: the drafter runs in a worker "
                "process (executor %r), where vLLM's prefix-cache resets, which empty its index, are not seen",
                backend)
    return 0


class AdaptiveDrafting:
    def __init__(self, drafter, mode, device):
        d = self.drafter = drafter
        self.forward_timer = None  # CPU, synchronous: times the target forward for the cost fit
        # CPU, synchronous: the step cost is fitted as the target forward (timed here) plus the rest of the step
        if device.type == "cpu" and not mode.overlap:
            from vllm_dflash.integration.forward_timer import ForwardTimer

            self.forward_timer = ForwardTimer()
        ngram = d.hint_ngram or (2, 4)  # a hinted draft: the controller's lookups are its hints
        s = d.settings
        self.controller = AdaptiveController(d.num_speculative_tokens, mode=mode.sources, metrics=d.metrics,
                                             ngram_min=ngram[0], ngram_max=ngram[1],
                                             split_cost=self.forward_timer is not None,
                                             guard_threshold=s.guard_threshold, guard_margin=s.guard_margin,
                                             guard_confirm=s.guard_confirm, reexplore_steps=s.reexplore_steps,
                                             cross_lookup=cross_lookup_tokens(d.vllm_config, s.cross_lookup))
        self.controller.tenant_of = self._tenant  # cross-request lookup never crosses tenants
        # TP > 1: a rank may adopt rank 0's plan where its own guard was off, so it keeps its lookups every step
        self.controller.skip_when_off = d._tp is None
        # the draft forward runs over the requests that use its tokens only (block_rows.py): it costs per such row
        self.controller.block_rows_only = d._deferred is not None and d.diffusion_steps == 1
        if d._deferred is not None:  # where a plan can drop a step's context rows
            d.metrics.declare("context_dropped_steps")
        self._plan_diverged = False  # logged once per process

    def load_model(self, target_model) -> None:
        if self.forward_timer is not None:
            self.forward_timer.wrap(target_model)

    def propose(self, step) -> list[list[int]]:
        """-> per batch row its proposal (variable length; [] for rows without one)."""
        if step.K == 0:
            return step.empty()
        self.drafter.metrics.inc("draft_steps")
        return self._propose(step)

    def _propose(self, step) -> list[list[int]]:
        """The controller plans from the histories (`decode_rows`) first; the draft forward runs only if the plan
        verifies DFlash tokens; a hinted draft is fed this step's lookups first."""
        d, ctl, K = self.drafter, self.controller, step.K
        batch, cad = d._runner.input_batch, step.target_cad
        # the bonus tokens are read only if a history is built (vLLM's padded preparation deferred until then)
        rows = decode_rows(batch, K, step.target_positions, lambda: step.next_token_ids, cad, step.num_rejected)
        B, qsl = cad.num_reqs, cad.query_start_loc_cpu
        fwd = self.forward_timer.take() if self.forward_timer is not None else None
        if d._prefix_caching and d._deferred is not None:  # a new request whose cached prefix lacks draft K/V
            if d.cache_record is None:
                d.cache_record = DraftCacheRecord(d.block_size)
            hit = d.cache_record.admit(batch.req_ids[:B], step.target_positions, qsl, cad.block_table_tensor)
            if hit:
                ctl.context_dropped(hit)
        # a sampled request's verification row, measured by the rejection sampler (patch cpu_sampled_verify)
        sampler = getattr(d._runner, "rejection_sampler", None)
        ctl.sampled_row_s = sampler.__dict__.get("_vllm_dflash_sampled_row_s", 0.0) if sampler else 0.0
        plan = ctl.plan(list(rows.req_ids), rows.histories, query_tokens=int(qsl[B]),
                        decode_only=rows.decode_only, extra_tokens=rows.prefill_tokens, forward_s=fwd,
                        sampled=self._sampled(rows.rows))
        plan = self._sync(plan)  # TP > 1: rank 0's decisions on every rank (its wall clock decided them)
        if plan.drop_context and d._deferred is not None:
            # no speculation won at this batch size: holding this step's rows (copy, fc, K/V write) would be the only
            # drafter work of the step. Drop them; the batch's requests are planned without DFlash tokens from now on
            # (with prefix caching, so are later requests whose prefix hits one of these blocks: cache_record)
            step.drop_context = True
            ctl.context_dropped(batch.req_ids[:B])
            d.metrics.inc("context_dropped_steps")
        drafts = DraftPlan.of(plan, rows.rows)
        block = None
        if drafts.needs_block:
            t0, d._injection_s = time.perf_counter(), 0.0
            write_hints(step.query_ids(), K, rows.rows, hint_tokens(d.hint_ngram, ctl, K, plan.lookups, rows.histories))
            # on GPU, the copy to the host waits: wall time ok
            block = self._block(step, rows.rows, drafts.block_rows, drafts.block_spans)
            ctl.observe_block(step.block_rows, time.perf_counter() - t0, d._injection_s)
        planned = ctl.propose(plan, block)
        out: list[list[int]] = [[] for _ in range(len(batch.req_ids))]
        for i, toks in zip(rows.rows, planned):
            out[i] = toks
        if block is not None:
            hand_off_probs(step, rows.rows, planned, drafts.spans)
        d.metrics.flush()
        return out

    def _block(self, step, rows, select: list[int] | None = None,
               spans: dict[int, tuple[int, int]] | None = None) -> np.ndarray:
        """Run the draft forward (over the batch rows `select` alone where it can: those whose plan verifies DFlash
        tokens; its tokens at the slots `spans` they verify). -> [len(rows), K] the DFlash drafts of those batch rows
        on the host (a row outside `select`, or a slot outside its span, holds filler). Greedy requests' drafts are
        argmaxes (one-hot q); sampled requests' q is handed over by `hand_off_probs` once the proposals are built."""
        drafts = step.draft(select, spans)
        return drafts.cpu().numpy()[list(rows)]

    def _tenant(self, req_id: str) -> tuple | None:
        """The request's tenant for cross-request lookup: (cache_salt, LoRA adapter), what vLLM's prefix cache keeps
        apart (its block hashes include both; the model is the engine's: one index per engine). cache_salt is not
        sent to the worker: the scheduler's patch (patches/cross_lookup_salt.py) copies it onto the request's
        SamplingParams, which the runner's request state shares in this process (the `uni` executor). None where it
        is missing (no cross lookup for the request)."""
        state = self.drafter._runner.requests.get(req_id)
        salt = getattr(state.sampling_params, SALT_ATTR, _MISSING) if state is not None else _MISSING
        if salt is _MISSING:
            return None
        lora = state.lora_request
        return salt, (None if lora is None else (lora.lora_name, lora.lora_path))

    def _sampled(self, rows) -> list[bool]:
        """Per batch row: does its request sample (temperature > 0; the runner stores 0 for greedy requests)?"""
        temperature = self.drafter._runner.input_batch.temperature_cpu
        return [bool(temperature[i] > 0) for i in rows]

    def _sync(self, plan):
        """TP rank 0's plan on every rank (`sync_plan_across_tp`); at TP = 1 the plan unchanged, no communication."""
        tp = self.drafter._tp
        if tp is None:
            return plan
        if tp.rank_in_group == 0:
            return sync_plan_across_tp(plan, tp)
        own = DraftPlan.of(plan).decisions()
        plan = sync_plan_across_tp(plan, tp)
        if not self._plan_diverged and own != DraftPlan.of(plan).decisions():
            self._plan_diverged = True
            logger.info("vllm_dflash: TP rank %d's adaptive plan differed from TP rank 0's (each rank times steps "
                        "with its own clock); every rank follows rank 0's plan (logged once)", tp.rank_in_group)
        return plan
