# SPDX-License-Identifier: Apache-2.0
"""`DFlashDrafter`: our drafter for `method: "dflash"` in vLLM's V1 model runner (CPU and GPU).

It subclasses vLLM's `DFlashProposer`, reusing its input kernel (query ids / positions / slots for
[bonus, MASK x K] per request), attention metadata and draft KV cache, and the runner's rejection
sampler for verification (greedy, or lossless rejection sampling of our one-hot greedy drafts). What
is ours on the hot path: KV injection through our op (DFlashDraftForVllm), multi-step denoising
(`diffusion_steps`: keep the confident prefix, re-mask the rest, run the draft again over the same
slots), reduced-vocabulary argmax, start-up validation, metrics, and adaptive drafting (`adaptive`: per request
the DFlash block, a prompt-lookup proposal or the two merged, and how many tokens to verify, from measured
acceptance and an online step-cost model; see vllm_dflash/adaptive/). Under adaptive drafting the prompt lookup
comes first and the draft forward runs only when this step's plan verifies DFlash tokens.

Adaptive drafting under synchronous scheduling reads the committed token history on the host and returns
per-request lists (variable length). Under overlap (async) scheduling the lengths are the scheduler's
(integration/async_scheduler.py); the drafter mirrors each request's history from the verified query tokens
(adaptive/history.py) and picks only the source, returning a full [B, K] proposal.

Async-scheduling rule (vLLM MRv2's invariant): inputs keep the target's token count, rejected
positions are padding, `num_rejected_tokens` stays a device tensor; `propose` does no host sync
(no .item() / .tolist(); timings use CUDA events resolved a step later on GPU).

Tensor parallelism (docs/TP.md, dev/TP_DESIGN.md): every TP rank runs this drafter on the same inputs; the draft's
layers are vLLM's parallel layers in the target's TP group (per-rank KV heads, all-reduced / all-gathered outputs),
so the fixed-block path is rank-consistent by construction. Adaptive drafting plans on each rank with the rank's own
clock, and the draft forward holds collectives, so TP rank 0's plan is broadcast and adopted by every rank before
the forward is decided (integration/tp_plan.py `sync_plan_across_tp`; nothing at TP = 1). Only TP rank 0 (vLLM's
output rank) publishes our metrics: merged snapshots are summed.
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch
from typing_extensions import override
from vllm.forward_context import set_forward_context
from vllm.logger import init_logger
from vllm.v1.spec_decode.dflash import DFlashProposer

from vllm_dflash import settings
from vllm_dflash.adaptive.ngram import prompt_lookup
from vllm_dflash.config import DFlashConfig
from vllm_dflash.integration.async_scheduler import QUALNAME as ADAPTIVE_SCHEDULER
from vllm_dflash.integration.block_rows import block_subset, subset_sample_idx, verified_positions
from vllm_dflash.integration.deferred_context import kept_rows
from vllm_dflash.integration.forward_timer import StepTimer
from vllm_dflash.integration.tp_plan import sync_plan_across_tp, tp_group
from vllm_dflash.serve.metrics import MetricsSink, is_output_rank

logger = init_logger(__name__)


class DFlashDrafter(DFlashProposer):
    # rows of the draft's RoPE cache where vLLM's own guard does not keep positions inside it (set at load time by
    # `_check_position_range`; None: it does)
    _query_rows: int | None = None

    def __init__(self, vllm_config, device: torch.device, runner=None):
        super().__init__(vllm_config, device, runner)
        spec = vllm_config.speculative_config
        self.dflash = DFlashConfig.from_hf_config(spec.draft_model_config.hf_config.to_dict())
        self.dflash.check_target(vllm_config.model_config.hf_config)
        self.dflash.check_num_speculative_tokens(self.num_speculative_tokens)
        from vllm_dflash.integration.validation import check_tensor_parallel

        self.tp_size = int(vllm_config.parallel_config.tensor_parallel_size)
        check_tensor_parallel(self.dflash, self.tp_size, getattr(spec, "draft_tensor_parallel_size", None))
        self._tp = tp_group()  # None at TP = 1: no plan broadcast
        # per-deployment settings: resolved by the front end into vllm_config.additional_config["dflash"]
        self.settings = settings.from_vllm_config(vllm_config)
        self.diffusion_steps = self.settings.diffusion_steps or self.dflash.diffusion_steps
        self.hint_ngram = self.dflash.hint_ngram  # a hinted draft: its block is fed the prompt-lookup continuation
        if self.hint_ngram is not None and self.diffusion_steps > 1:
            raise ValueError(f"vllm_dflash: the draft {spec.draft_model_config.model} is a hinted draft "
                             "(dflash_config.hint_ngram), which drafts in one pass; diffusion_steps is "
                             f"{self.diffusion_steps}. Fix: set speculative_config.diffusion_steps to 1")
        self.confidence_threshold = self.settings.confidence_threshold
        # sampled requests draft from the draft's marginals (setting draft_sampling); vLLM's own probabilistic path
        # (draft_sample_method) stays off: q is ours, over the target vocabulary (integration/draft_probs.py)
        self.sample_drafts = self._resolve_draft_sampling(spec)
        # slots drawn from q: auto the first (its marginal is the distribution the target verifies there; a later
        # slot's marginal ignores the sampled tokens before it, and drawing those lowered acceptance on the tiny
        # pair: tests/vllm/test_vllm_sampling.py), probabilistic every slot; the rest take the argmax (one-hot q)
        self.sampled_slots = 1 if self.settings.draft_sampling == "auto" else self.num_speculative_tokens
        self._enable_probabilistic_draft_probs = False
        self._q_buffer = None  # DraftProbs, built in load_model when sample_drafts
        self._block_q = None  # the last draft forward's q: (flat cells [m] over [B, K], q [m, V_draft], sampled [m])
        # only the output rank publishes (merged() sums snapshots: TP = 2 would count every event twice)
        self.metrics = MetricsSink.get() if is_output_rank() else MetricsSink.disabled()
        self._plan_diverged = False  # logged once per process
        self.timer = StepTimer(torch.device(device))
        self.metrics.set("diffusion_steps", self.diffusion_steps)
        self.metrics.set("block_size", self.num_speculative_tokens + 1)
        self._runner = runner
        self.adaptive = self.settings.adaptive_mode
        self.controller = None
        self.overlap = False
        self._forward_timer = None  # adaptive drafting on CPU, synchronous: times the target forward for the cost fit
        self._injection_s = 0.0  # host seconds in `_inject` since the draft forward's timer started
        self._deferred = None  # adaptive drafting with defer_injection: context rows held until a draft forward
        self._context_unused = False  # adaptive "ngram": no draft forward ever runs, so context rows are dropped
        self._drop_step = False  # this step's plan says 'off' won here: its context rows are dropped, not held
        # prefix caching: a later request that hits a cached block drafts against that block's draft K/V, so every
        # context row is held for the next draft forward, never dropped (no drop_context, no lease release)
        self._keep_context = bool(getattr(vllm_config.cache_config, "enable_prefix_caching", False))
        self._block_rows = 0  # requests the last draft forward ran over (block_rows.py: those that use its tokens)
        if self.adaptive is not None:
            from vllm_dflash.adaptive.controller import AdaptiveController

            self.overlap = adaptive_overlap(vllm_config)
            ngram = self.hint_ngram or (2, 4)  # a hinted draft: the controller's lookups are its hints
            # CPU, synchronous: the step cost is fitted as the target forward (timed here) plus the rest of the step
            if device.type == "cpu" and not self.overlap:
                from vllm_dflash.integration.forward_timer import ForwardTimer

                self._forward_timer = ForwardTimer()
            self.controller = AdaptiveController(self.num_speculative_tokens, mode=self.adaptive, metrics=self.metrics,
                                                 ngram_min=ngram[0], ngram_max=ngram[1],
                                                 split_cost=self._forward_timer is not None,
                                                 guard_threshold=self.settings.guard_threshold,
                                                 guard_margin=self.settings.guard_margin,
                                                 guard_confirm=self.settings.guard_confirm)
            # TP > 1: a rank may adopt rank 0's plan where its own guard was off, so it keeps its lookups every step
            self.controller.skip_when_off = self._tp is None
            # adaptive "ngram" drafts from prompt lookup only: no draft forward ever reads the draft's cache, so no
            # context row is kept, combined (fc) or injected (measured at concurrency 32 on chat prompts: 1.3-2.3 ms
            # of a 50-90 ms step went to rows nothing read)
            self._context_unused = self.adaptive == "ngram"
            if self.settings.defer_injection or self._context_unused:
                from vllm_dflash.integration.deferred_context import DeferredContext

                self._deferred = DeferredContext()
            # the draft forward runs over the requests that use its tokens only (block_rows.py): it costs per such row
            self.controller.block_rows_only = self._deferred is not None and self.diffusion_steps == 1
            if self.overlap:
                from vllm_dflash.adaptive.history import TokenHistory

                self.history = TokenHistory()
                self._seen: dict[str, int] = {}
                self._calls = 0
        logger.info("vllm_dflash: our DFlash drafter is active (draft %s; block size %d, %d draft tokens/step, "
                    "diffusion steps %d, confidence threshold %.2f, target layers %s, mask id %d)",
                    spec.draft_model_config.model, self.dflash.block_size, self.num_speculative_tokens,
                    self.diffusion_steps, self.confidence_threshold, list(self.dflash.target_layer_ids),
                    self.dflash.mask_token_id)
        if self.hint_ngram is not None:
            if self.controller is None and vllm_config.scheduler_config.async_scheduling:
                logger.warning("vllm_dflash: the hinted draft runs as a plain draft here (fixed block under overlap "
                               "scheduling has no host history for the lookup). Fix: adaptive drafting (the default) "
                               "or --no-async-scheduling")
            else:
                logger.info("vllm_dflash: hinted draft: each block is fed its prompt-lookup continuation (n-grams "
                            "%d..%d)", *self.hint_ngram)
        if self.controller is not None:
            logger.info("vllm_dflash: adaptive drafting ON (sources: %s; per-request length 0..%d from acceptance and "
                        "an online step-cost model; lengths planned in the %s)", self.adaptive,
                        self.num_speculative_tokens, "scheduler (overlap)" if self.overlap else "drafter (synchronous)")

    def _resolve_draft_sampling(self, spec) -> bool:
        """Setting draft_sampling: do sampled requests draft from the draft's marginals (q handed to the verifier)?
        auto falls back to the argmax (one-hot q, logged) where q cannot be used; probabilistic raises there."""
        mode = self.settings.draft_sampling
        if mode == "greedy":
            return False
        why = None
        if self.diffusion_steps > 1:
            why = (f"diffusion_steps is {self.diffusion_steps} (denoising keeps argmax tokens)",
                   "set speculative_config.diffusion_steps to 1")
        elif getattr(spec, "rejection_sample_method", "standard") != "standard":
            why = (f"rejection_sample_method is {spec.rejection_sample_method!r} (it does not read q)",
                   "drop speculative_config.rejection_sample_method")
        if why is None:
            return True
        if mode == "probabilistic":
            raise ValueError("vllm_dflash: draft_sampling 'probabilistic' needs one denoising pass and vLLM's "
                             f"standard rejection sampler; {why[0]}. Fix: {why[1]}, or set "
                             "speculative_config.draft_sampling to 'auto' or 'greedy'")
        logger.info("vllm_dflash: sampled requests draft the argmax (one-hot q): %s", why[0])
        return False

    def _inner(self):
        m = self.model
        return m.unwrap() if hasattr(m, "unwrap") else m

    @override
    def load_model(self, target_model) -> None:
        super().load_model(target_model)
        self._unwrap_lora_embedding()
        if self._forward_timer is not None:
            self._forward_timer.wrap(target_model)
        from vllm_dflash.integration.vllm_model import DFlashDraftForVllm

        if self.sample_drafts and isinstance(self._inner(), DFlashDraftForVllm):
            from vllm_dflash.integration.draft_probs import DraftProbs

            self._q_buffer = DraftProbs(self.num_speculative_tokens, self.vllm_config.model_config.get_vocab_size(),
                                           self._inner().draft_target_ids())

        if not isinstance(self._inner(), DFlashDraftForVllm):
            raise RuntimeError("vllm_dflash: the draft model was not built as DFlashDraftForVllm; is the plugin's "
                               "model registration overridden? (check VLLM_PLUGINS)")
        self._check_tp_shards()
        self._check_position_range()

    def _unwrap_lora_embedding(self) -> None:
        """With --enable-lora the target's token embedding is a LoRA wrapper (vLLM's VocabParallelEmbeddingWithLoRA)
        whose token-to-adapter mapping is set for the target's scheduled tokens; the draft shares that module, and its
        forward over a different token count failed inside the wrapper and ended the engine (issue 51: the soak's
        LoRA finding). The draft was trained on the base embedding, so it embeds through the wrapped base layer;
        the target still verifies with its adapter, so outputs are the adapter's own."""
        model = self._inner().model
        embed = getattr(model, "embed_tokens", None)
        base = getattr(embed, "base_layer", None)
        if base is not None and "LoRA" in type(embed).__name__:
            model.embed_tokens = base
            logger.info("vllm_dflash: LoRA is enabled: the draft embeds tokens with the target's base embedding "
                        "(requests with an adapter draft without it; the target verifies with it)")

    def _check_tp_shards(self) -> None:
        """Load-time invariants of the sharded draft (dev/TP_DESIGN.md 1a): each rank holds its own KV heads
        (total // TP, or one replica when TP exceeds them), and our fused injection weights are this rank's
        shard ([layers * 2 * local KV heads * head_dim] rows, checked by KVInjectionWeights)."""
        model = self._inner().model
        attn = model.layers[0].self_attn
        expected = max(1, self.dflash.num_key_value_heads // self.tp_size)
        if attn.num_kv_heads != expected or attn.total_num_kv_heads != self.dflash.num_key_value_heads:
            raise RuntimeError(
                f"vllm_dflash: the draft's attention holds {attn.num_kv_heads} of {attn.total_num_kv_heads} KV heads "
                f"on this rank; expected {expected} of {self.dflash.num_key_value_heads} at tensor_parallel_size="
                f"{self.tp_size}. Is speculative_config.draft_tensor_parallel_size different from "
                "tensor_parallel_size? (omit it)")
        w = self._inner().injection_weights()
        if w is not None and w.num_kv_heads != expected:
            raise RuntimeError(f"vllm_dflash: KV injection weights for {w.num_kv_heads} KV heads on this rank; the "
                               f"draft's attention has {expected} (tensor_parallel_size={self.tp_size})")

    def _check_position_range(self) -> None:
        """Start-up: compare max_model_len with the draft's RoPE range (rows of its cos/sin cache; vLLM widens it for
        EAGLE drafts only) and say what happens past it. vLLM's runner skips the draft for any step whose longest
        request plus the block (K + 1) passes the draft's max_model_len (`_input_fits_in_drafter`, which verifies K
        filler tokens per request instead), so no position past the range reaches us while the draft's
        max_model_len is inside its RoPE cache. Where it is not (a config whose derived length outgrows the cache),
        positions are clamped: the query block's in `propose`, and context rows past the cache are not injected
        (`DFlashDraftForVllm.position_limit`)."""
        model = self._inner()
        rows = model.rope_rows()
        max_len = int(self.vllm_config.model_config.max_model_len)
        draft_len = int(self.draft_model_config.max_model_len or max_len)
        if max_len > rows:
            logger.info("vllm_dflash: max_model_len %d is past the draft's RoPE range (max_position_embeddings %d): a "
                        "step whose longest request passes position %d runs no draft forward (vLLM verifies filler "
                        "drafts there), so output past it is the target's alone. Fix: serve with --max-model-len %d, "
                        "or use a draft with max_position_embeddings >= %d", max_len, rows,
                        min(draft_len, rows) - self.num_speculative_tokens - 1, rows, max_len)
        if draft_len > rows:
            self._query_rows = model.position_limit = rows
            logger.warning("vllm_dflash: the draft's max_model_len %d is past its RoPE cache (%d rows): positions past "
                           "the cache are clamped and their context rows not injected", draft_len, rows)

    @override
    def propose(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                mm_embed_inputs=None, num_rejected_tokens_gpu=None, slot_mappings=None) -> torch.Tensor:
        K = self.num_speculative_tokens = num_speculative_tokens
        self._last_draft_probs = None
        self._block_q = None
        batch_size = common_attn_metadata.batch_size()
        model = self._inner()
        self.timer.drain(self.metrics)
        defer = self._deferred is not None  # adaptive: this step's context rows wait until a draft forward needs them
        if not defer:  # [num_tokens, n_feat * H] -> [num_tokens, H] (fc); hidden_norm happens inside the injection
            target_hidden_states = model.combine_hidden_states(target_hidden_states)
        num_tokens, sample_idx, cad = self.set_inputs_first_pass(
            target_token_ids=target_token_ids, next_token_ids=next_token_ids, target_positions=target_positions,
            target_hidden_states=target_hidden_states, token_indices_to_sample=token_indices_to_sample,
            cad=common_attn_metadata, num_rejected_tokens_gpu=num_rejected_tokens_gpu)
        num_context = self._dflash_num_context
        if self._query_rows is not None:  # the query block (last position + 1 + offset) inside the RoPE cache
            self.positions.clamp_(max=self._query_rows - 1)  # [max_padded_query_tokens], in place: no host sync
        # [(per-layer metadata, mode, padded tokens, tokens across DP, model kwargs, slots size, its metadata, rows run)]
        inputs: list = []

        def prepare(select: list[int] | None = None) -> None:  # metadata + KV injection, once, before the first forward
            # select: batch rows the forward runs over (block_rows.py; deferred path only), None: every request
            sub = block_subset(cad, select, K + 1) if select is not None and defer else None
            md_cad, n = (cad, num_tokens) if sub is None else (sub[0], sub[0].num_actual_tokens)
            mode, num_input_tokens, across_dp = self._determine_batch_execution_and_padding(n)
            if sub is not None and num_input_tokens != n:  # padded (graph sizes): the subset would not fill it
                sub, md_cad, n = None, cad, num_tokens
                mode, num_input_tokens, across_dp = self._determine_batch_execution_and_padding(n)
            _, per_layer_md = self.build_per_group_and_layer_attn_metadata(md_cad)
            if defer:  # the rows held since the last draft forward, then this step's, in one injection
                self._inject(self._deferred.take(target_hidden_states[:num_context],
                                                 self._context_positions_buffer[:num_context],
                                                 self._context_slot_mapping_buffer[:num_context]))
                ids, pos = self.input_ids[:num_input_tokens], self._get_positions(num_input_tokens)
                if sub is not None:  # [len(select) * (K + 1)]: the selected requests' slots (hints already written)
                    ids, pos = self.input_ids[:num_tokens][sub[1]], self._get_positions(num_tokens)[sub[1]]
                model_kwargs = dict(input_ids=ids, positions=pos, inputs_embeds=None)
                slot_mapping_size = num_input_tokens
            else:
                t_inj = self.timer.start()
                # KV injection of this step's context rows into every draft layer's paged cache
                model_kwargs, slot_mapping_size = self.build_model_inputs_first_pass(num_tokens, num_input_tokens,
                                                                                     mm_embed_inputs)
                self.timer.stop("kv_injection_seconds", t_inj, self.metrics)
            inputs.append((per_layer_md, mode, num_input_tokens, across_dp, model_kwargs, slot_mapping_size, md_cad,
                           None if sub is None else select))

        if not defer:
            prepare()  # today's order: injection every step (the fixed block drafts every step anyway)

        def run_model() -> torch.Tensor:  # one pass of the draft model over this step's query slots
            if not inputs:
                prepare()
            per_layer_md, mode, num_input_tokens, across_dp, model_kwargs, slot_mapping_size, md_cad, _ = inputs[0]
            with set_forward_context(per_layer_md, self.vllm_config, num_tokens=num_input_tokens,
                                     num_tokens_across_dp=across_dp, cudagraph_runtime_mode=mode,
                                     slot_mapping=self._get_slot_mapping(slot_mapping_size, md_cad.slot_mapping)):
                return self.model(**model_kwargs)

        def draft(select: list[int] | None = None,
                  spans: dict[int, tuple[int, int]] | None = None) -> torch.Tensor:  # [B, K]
            """select: the batch rows whose drafts are used; with one greedy pass the forward runs over those alone
            (the other rows hold the mask id, never read). spans: batch row -> (lo, hi), the block slots it verifies;
            with one greedy pass the draft-vocabulary argmax runs at those alone (the other slots hold the mask id)."""
            one_pass = self.diffusion_steps == 1
            if not inputs and select is not None and one_pass:
                prepare(select)
            sel = inputs[0][-1] if inputs else None
            self._block_rows = batch_size if sel is None else len(sel)
            layout = list(range(batch_size)) if sel is None else sel
            keep = verified_positions(layout, spans, K, sample_idx.device) if spans is not None and one_pass else None
            if sel is None:
                return self._denoise(run_model, sample_idx, K, sampling_metadata, keep, layout)
            mine = self._denoise(run_model, subset_sample_idx(sample_idx, sel, K + 1, K), K, sampling_metadata, keep,
                                 layout)
            out = mine.new_full((batch_size, K), self.parallel_drafting_token_id)  # [B, K]
            out[torch.tensor(sel, dtype=torch.long, device=mine.device)] = mine
            return out

        if self.controller is not None:
            self._drop_step = False
            try:
                return self._propose_adaptive(draft, K, batch_size, target_token_ids, target_positions,
                                              next_token_ids, common_attn_metadata, num_rejected_tokens_gpu)
            finally:
                # no draft forward: hold the rows for the next one, unless no draft forward may read them (and only
                # those of requests that still hold their draft context: `AdaptiveController.wants_context`)
                if defer and not inputs and not self._context_unused and not self._drop_step:
                    rows = self._wanted_rows(common_attn_metadata, num_context)
                    hidden = target_hidden_states[:num_context]
                    positions = self._context_positions_buffer[:num_context]
                    slots = self._context_slot_mapping_buffer[:num_context]
                    if rows is None:
                        self._defer(hidden, positions, slots)
                    elif rows:
                        idx = torch.tensor(rows, dtype=torch.long, device=hidden.device)
                        self._defer(hidden[idx], positions[idx], slots[idx])
        if K == 0:
            return torch.empty(batch_size, 0, device=next_token_ids.device, dtype=torch.int64)
        self.metrics.inc("draft_steps")
        if self.hint_ngram is not None and not self.vllm_config.scheduler_config.async_scheduling:
            _, hists, rows, _, _ = self._histories(K, target_positions, next_token_ids, common_attn_metadata,
                                                   num_rejected_tokens_gpu)
            self._write_hints(rows, self._hints(None, hists))
        drafts = draft()
        if self._block_q is not None:  # fixed block: every slot of every request is a DFlash token
            cells, q, _ = self._block_q
            self._last_draft_probs = self._q_buffer.build(batch_size, cells, q)
        self.metrics.flush()
        return drafts

    def _propose_adaptive(self, draft, K, batch_size, target_token_ids, target_positions, next_token_ids, cad,
                          num_rejected):
        """Adaptive drafting: this step's plan (prompt lookup first) decides whether `draft()` (the draft forward,
        with the injection of every held context row) runs at all."""
        if K == 0:
            if self.overlap:  # no drafts next step, but this step's tokens and outcomes must still be seen
                self._adaptive_overlap(None, 0, target_token_ids, target_positions, next_token_ids, cad, num_rejected)
            return torch.empty(batch_size, 0, device=next_token_ids.device, dtype=torch.int64)
        self.metrics.inc("draft_steps")
        if self.overlap:
            return self._adaptive_overlap(draft, K, target_token_ids, target_positions, next_token_ids, cad,
                                          num_rejected)
        return self._adaptive(draft, K, target_positions, next_token_ids, cad, num_rejected)

    def _wanted_rows(self, cad, num_context: int) -> list[int] | None:
        """This step's context rows whose requests still hold their draft context (None: all of them; the common case,
        no request released its context)."""
        if self._keep_context or not self.controller.stale:
            return None
        B = cad.num_reqs
        qsl = cad.query_start_loc_cpu[: B + 1].tolist()
        if qsl[B] != num_context:  # rows that are not the requests' query tokens: keep them all
            return None
        ids = self._runner.input_batch.req_ids[:B]
        return kept_rows(qsl, [self.controller.wants_context(r) for r in ids])

    def _defer(self, hidden, positions, slots) -> None:
        """Hold a step's context rows (raw target features [n, n_feat * H], positions, slots); inject them all now
        when the FIFO is full (a long stretch of steps without a draft forward)."""
        if self._deferred.push(hidden, positions, slots):
            self._inject(self._deferred.take())

    def _inject(self, rows) -> None:
        """fc + KV injection of context rows (hidden [M, n_feat * H], positions [M], slots [M]) in one call."""
        if rows is None:
            return
        hidden, positions, slots = rows
        t0 = time.perf_counter()
        t_inj = self.timer.start()
        model = self._inner()
        model.precompute_and_store_context_kv(model.combine_hidden_states(hidden), positions, slots)
        self.timer.stop("kv_injection_seconds", t_inj, self.metrics)
        dt = time.perf_counter() - t0
        self._injection_s += dt  # host time (the adaptive block-cost fit leaves it out)
        if self.controller is not None:
            self.controller.observe_injection(int(slots.shape[0]), dt)

    def _denoise(self, run_model, sample_idx, K, sampling_metadata, keep: torch.Tensor | None = None,
                 layout: list[int] | None = None) -> torch.Tensor:
        """The draft forward: `diffusion_steps` passes of the draft model over [anchor, MASK x K] per request (keep
        the confident prefix, re-mask the rest, run again over the same slots). keep: [n] the positions of
        sample_idx whose drafts are verified (one pass only; `verified_positions`), None: all; layout: the batch
        row of each request of sample_idx (None: 0..). With one pass and sampled requests in the batch, their
        tokens are drawn from the draft's marginals (`_sample_block`).
        -> [B, K] draft token ids (the mask id at positions left out)."""
        model = self._inner()
        t_fwd = self.timer.start()
        steps = self.diffusion_steps
        drafts = prev = fixed = None
        for s in range(steps):
            hidden = run_model()
            sample_hidden = hidden[sample_idx]  # [B * K, H], request-major
            if s == steps - 1:
                if steps == 1 and self.sample_drafts and not sampling_metadata.all_greedy:
                    layout = layout if layout is not None else list(range(sample_hidden.shape[0] // K))
                    drafts = self._sample_block(sample_hidden, K, sampling_metadata, keep, layout)
                elif steps == 1 and keep is not None:  # the verified positions alone (block_rows.py)
                    drafts = torch.full((sample_hidden.shape[0],), self.parallel_drafting_token_id,
                                        dtype=torch.int64, device=sample_hidden.device)  # [B * K]
                    drafts[keep] = model.draft_argmax(sample_hidden[keep]).to(torch.int64)
                    drafts = drafts.view(-1, K)
                elif steps == 1:  # one-hot drafts: the argmax over the draft vocabulary, mapped to target ids (vLLM's
                    # greedy path first spreads the draft logits over the whole target vocabulary: 4x the time on CPU)
                    drafts = model.draft_argmax(sample_hidden).view(-1, K)
                else:  # greedy completion of the still-masked positions (one-hot drafts stay lossless)
                    tok = model.draft_argmax(sample_hidden).view(-1, K)
                    drafts = torch.where(fixed, prev, tok)
                break
            conf, tok = model.draft_confidence(sample_hidden)
            conf, tok = conf.view(-1, K), tok.view(-1, K)
            if prev is not None:
                tok = torch.where(fixed, prev, tok)
                conf = torch.where(fixed, torch.ones_like(conf), conf)
            run = torch.cumprod((conf >= self.confidence_threshold).to(torch.int32), dim=1).sum(1)  # [B]
            quota = math.ceil(K * (s + 1) / steps)
            kept = torch.clamp(torch.clamp(run, min=quota), max=K)
            fixed = torch.arange(K, device=tok.device)[None, :] < kept[:, None]  # [B, K]
            prev = tok
            new_ids = torch.where(fixed, tok, torch.full_like(tok, self.parallel_drafting_token_id))
            self.input_ids[sample_idx] = new_ids.reshape(-1).to(self.input_ids.dtype)  # re-mask the rest
        self.timer.stop("draft_forward_seconds", t_fwd, self.metrics)
        self.metrics.set("block_size", K + 1)
        return drafts

    def _sample_block(self, hidden: torch.Tensor, K: int, sampling_metadata, keep: torch.Tensor | None,
                      layout: list[int]) -> torch.Tensor:
        """The last pass of one-pass drafting when the batch has sampled requests. A greedy request's slots take the
        argmax (as without sampling: lossless one-hot drafts); a sampled request's first `sampled_slots` slots a
        draw from the draft's marginals at the request's temperature, top-k and top-p (`draft_distribution`), drawn
        with the request's own generator where it is seeded, its later slots the argmax (one-hot q). The q of every
        position is kept in `_block_q` for the verifier (`_hand_off_probs`).
        hidden: [len(layout) * K, H] request-major; keep: [m] the positions drafted (None: all).
        -> [len(layout), K] target ids (the mask id at positions left out)."""
        from vllm_dflash.sampling import draft_distribution, sample_rows

        model = self._inner()
        dev, n = hidden.device, hidden.shape[0]
        pos = keep if keep is not None else torch.arange(n, device=dev)  # [m]
        rows = torch.tensor(layout, dtype=torch.long, device=dev).repeat_interleave(K)[pos]  # [m] batch rows
        slots = pos % K  # [m]
        logits = model.draft_logits(hidden[pos])  # [m, V_draft]
        greedy_ids = model._to_target_ids(logits.max(dim=-1).indices)  # == draft_argmax
        sm = sampling_metadata
        temp = sm.temperature[rows]  # [m]; 0 for greedy requests
        sampled = temp != 0
        q = draft_distribution(logits, torch.where(sampled, temp, torch.ones_like(temp)),
                               None if sm.top_k is None else sm.top_k[rows],
                               None if sm.top_p is None else sm.top_p[rows])  # [m, V_draft]
        u = torch.rand(rows.shape[0], dtype=torch.float64, device=dev)  # [m]
        for r, gen in sm.generators.items():  # seeded requests: their own stream
            at = (rows == r).nonzero().squeeze(-1)
            if at.numel():
                u[at] = torch.empty(at.numel(), dtype=torch.float64, device=dev).uniform_(generator=gen)
        draw = sampled & (slots < self.sampled_slots)  # [m] slots drawn from q; the others take the argmax
        argmax = logits.max(dim=-1).indices  # [m] draft ids
        q = torch.where(draw[:, None], q, torch.zeros_like(q).scatter_(1, argmax[:, None], 1.0))  # one-hot there
        ids = torch.where(draw, model._to_target_ids(sample_rows(q, u)), greedy_ids)
        drafts = torch.full((n,), self.parallel_drafting_token_id, dtype=torch.int64, device=dev)  # [len * K]
        drafts[pos] = ids.to(torch.int64)
        self._block_q = (rows * K + slots, q, sampled)
        return drafts.view(-1, K)

    def _hand_off_probs(self, rows: list[int], tokens: np.ndarray, spans: list[tuple[int, int] | None]) -> None:
        """q for the verifier after an adaptive plan (`take_last_draft_probs`): per sampled request of batch row
        rows[j] with proposal tokens[j] [K] (slots past its length unused), the draft's q at its DFlash slots
        spans[j] = (lo, hi) (None: no DFlash slot) and one-hot q at the rest (prompt-lookup tokens, padding). None
        (one-hot for all, vLLM's default) when no sampled request verifies a sampled DFlash token."""
        if self._block_q is None:
            return
        cells_t, q, sampled_t = self._block_q
        K = self.num_speculative_tokens
        B = max(len(self._runner.input_batch.req_ids), max(rows, default=-1) + 1)
        cells, sampled = cells_t.tolist(), sampled_t.tolist()
        where = {c: i for i, (c, s) in enumerate(zip(cells, sampled)) if s}  # sampled cells -> q row
        if not where:
            return
        take, q_cells, hot_cells, hot_tokens = [], [], [], []
        for r, toks, span in zip(rows, tokens, spans):
            lo, hi = span if span is not None else (0, 0)
            if not any(r * K + j in where for j in range(lo, hi)):
                continue  # greedy, or no sampled DFlash token: one-hot everywhere is the default verification
            for j in range(min(len(toks), K)):
                c = r * K + j
                if lo <= j < hi and c in where:
                    take.append(where[c])
                    q_cells.append(c)
                else:
                    hot_cells.append(c)
                    hot_tokens.append(int(toks[j]))
        if not take:
            return
        dev = q.device
        self._last_draft_probs = self._q_buffer.build(
            B, torch.tensor(q_cells, device=dev), q[torch.tensor(take, device=dev)],
            torch.tensor(hot_cells, dtype=torch.long, device=dev), torch.tensor(hot_tokens, device=dev))

    def _block(self, draft, rows: list[int], select: list[int] | None = None,
               spans: dict[int, tuple[int, int]] | None = None) -> np.ndarray:
        """Run the draft forward for adaptive drafting (over the batch rows `select` alone where it can: those whose
        plan verifies DFlash tokens; its tokens at the slots `spans` they verify). -> [len(rows), K] the DFlash
        drafts of those batch rows on the host (a row outside `select`, or a slot outside its span, holds filler).
        Greedy requests' drafts are argmaxes (one-hot q); sampled requests' q is handed over by `_hand_off_probs`
        once the proposals are built."""
        drafts = draft(select, spans)
        return drafts.cpu().numpy()[rows]

    def _histories(self, K, target_positions, next_token_ids, cad, num_rejected):
        """The committed history of every decoding request (synchronous scheduling).

        History of request i = token_ids_cpu[i, :p + 1] + [bonus], p the position of its last accepted query token:
        token_ids_cpu holds the prompt, the committed output and this step's scheduled drafts (the accepted ones are
        exactly those up to p); the bonus is the token the target just sampled.
        -> (req_ids, histories, batch rows, decode_only: no prefill chunk in the step, prefill tokens in it)."""
        batch = self._runner.input_batch
        B = cad.num_reqs
        qsl = cad.query_start_loc_cpu[: B + 1].tolist()
        rej = num_rejected.tolist() if num_rejected is not None else [0] * B
        pos = target_positions.tolist() if target_positions.dim() == 1 else target_positions[0].tolist()
        bonus = next_token_ids.tolist()
        req_ids, hists, rows, decode_only, prefill_tokens = [], [], [], True, 0
        for i in range(B):
            qlen = qsl[i + 1] - qsl[i]
            end = qsl[i + 1] - int(rej[i])
            if qlen <= 0 or end <= qsl[i]:
                continue
            p = int(pos[end - 1])
            if p + 1 < int(batch.num_prompt_tokens[i]):
                decode_only = False  # partial prefill: no draft (the scheduler ignores it anyway)
                prefill_tokens += qlen  # its next chunk will likely share the next step: a cost the plan sees
                continue
            decode_only &= qlen <= K + 1
            hist = np.empty(p + 2, dtype=np.int64)
            hist[: p + 1] = batch.token_ids_cpu[i, : p + 1]
            hist[p + 1] = bonus[i]
            req_ids.append(batch.req_ids[i])
            hists.append(hist)
            rows.append(i)
        return req_ids, hists, rows, decode_only, prefill_tokens

    def _sampled(self, rows: list[int]) -> list[bool]:
        """Per batch row: does its request sample (temperature > 0; the runner stores 0 for greedy requests)?"""
        temperature = self._runner.input_batch.temperature_cpu
        return [bool(temperature[i] > 0) for i in rows]

    def _hints(self, lookups, hists) -> list[np.ndarray] | None:
        """A hinted draft's block inputs: per request the prompt-lookup continuation with the draft's own n-gram
        sizes (the controller's lookups when they are the same lookup). None for a plain draft."""
        if self.hint_ngram is None:
            return None
        if lookups is not None and self.controller is not None and self.controller.mode != "dflash" and (
                self.controller.ngram_min, self.controller.ngram_max) == self.hint_ngram:
            return [np.asarray(t) for t in lookups]
        K = self.num_speculative_tokens
        return [prompt_lookup(h, K, *self.hint_ngram) if h is not None else np.zeros(0, np.int64) for h in hists]

    def _write_hints(self, rows: list[int], hints: list[np.ndarray] | None) -> None:
        """Write hints into the draft's block inputs, [anchor, h1 .. hm, MASK ..] for batch row r (query slots
        r * (K + 1) + 1 .. + m of `input_ids`, which set_inputs_first_pass filled with MASK)."""
        if not hints:
            return
        K = self.num_speculative_tokens
        idx = [r * (K + 1) + 1 + j for r, h in zip(rows, hints) for j in range(min(len(h), K))]
        if not idx:
            return
        vals = np.concatenate([np.asarray(h[:K], dtype=np.int64) for h in hints])
        dev = self.input_ids.device
        self.input_ids[torch.tensor(idx, device=dev)] = torch.from_numpy(vals).to(dev, self.input_ids.dtype)

    def _adaptive(self, draft, K, target_positions, next_token_ids, cad, num_rejected) -> list[list[int]]:
        """Per-request proposals of the adaptive controller (host side; synchronous scheduling). The controller plans
        from the histories (`_histories`) first; `draft()` (the draft forward) runs only if the plan verifies DFlash
        tokens; a hinted draft is fed this step's lookups first."""
        req_ids, hists, rows, decode_only, prefill_tokens = self._histories(K, target_positions, next_token_ids, cad,
                                                                            num_rejected)
        batch, B, qsl = self._runner.input_batch, cad.num_reqs, cad.query_start_loc_cpu
        fwd = self._forward_timer.take() if self._forward_timer is not None else None
        # a sampled request's verification row, measured by the rejection sampler (patch cpu_sampled_verify)
        sampler = getattr(self._runner, "rejection_sampler", None)
        self.controller.sampled_row_s = sampler.__dict__.get("_vllm_dflash_sampled_row_s", 0.0) if sampler else 0.0
        plan = self.controller.plan(req_ids, hists, query_tokens=int(qsl[B]), decode_only=decode_only,
                                    extra_tokens=prefill_tokens, forward_s=fwd, sampled=self._sampled(rows))
        plan = self._sync(plan)  # TP > 1: rank 0's decisions on every rank (its wall clock decided them)
        if plan.drop_context and self._deferred is not None and not self._keep_context:
            # no speculation won at this batch size: holding this step's rows (copy, fc, K/V write) would be the only
            # drafter work of the step. Drop them; the batch's requests are planned without DFlash tokens from now on
            self._drop_step = True
            self.controller.context_dropped(batch.req_ids[:B])
            self.metrics.inc("context_dropped_steps")
        block = None
        if plan.needs_block:
            t0, self._injection_s = time.perf_counter(), 0.0
            self._write_hints(rows, self._hints(plan.lookups, hists))
            spans = {rows[j]: span for j, span in zip(plan.block_requests(), plan.block_spans())}
            select = sorted(spans)  # the batch rows that verify DFlash tokens
            block = self._block(draft, rows, select, spans)  # on GPU, the copy to the host waits: wall time ok
            self.controller.observe_block(self._block_rows, time.perf_counter() - t0, self._injection_s)
        planned = self.controller.propose(plan, block)
        out: list[list[int]] = [[] for _ in range(len(batch.req_ids))]
        for i, toks in zip(rows, planned):
            out[i] = toks
        if block is not None:
            self._hand_off_probs(rows, planned, [spans.get(r) for r in rows])
        self.metrics.flush()
        return out

    def _sync(self, plan):
        """TP rank 0's plan on every rank (`sync_plan_across_tp`); at TP = 1 the plan unchanged, no communication."""
        if self._tp is None:
            return plan
        if self._tp.rank_in_group == 0:
            return sync_plan_across_tp(plan, self._tp)
        own = (list(plan.sources), list(plan.ks), plan.needs_block)
        plan = sync_plan_across_tp(plan, self._tp)
        if not self._plan_diverged and own != (plan.sources, plan.ks, plan.needs_block):
            self._plan_diverged = True
            logger.info("vllm_dflash: TP rank %d's adaptive plan differed from TP rank 0's (each rank times steps "
                        "with its own clock); every rank follows rank 0's plan (logged once)", self._tp.rank_in_group)
        return plan

    def _adaptive_overlap(self, draft, K, target_token_ids, target_positions, next_token_ids, cad,
                          num_rejected) -> torch.Tensor:
        """Adaptive drafting under overlap scheduling: per request the source (DFlash block, prompt lookup or the
        two merged) of a full K-token proposal; the scheduler has already decided how many of them the next step
        verifies. `draft()` (the draft forward) runs only if some chosen proposal holds DFlash tokens (K = 0: no
        proposals, only this step's outcomes are scored).

        The request's history is mirrored from this step's verified query tokens (`TokenHistory`: the host copy
        of the tokens lags under async scheduling). Its query is [previous sampled token, k drafts]: k drafts
        were verified (0 after a prefill chunk, when no proposal was pending) and k - rejected accepted.
        -> [B, K] int64. Rows of partial prefills hold filler (the runner discards their drafts)."""
        batch = self._runner.input_batch
        B = cad.num_reqs
        self._calls += 1
        qsl = cad.query_start_loc_cpu[: B + 1].tolist()
        rej = num_rejected.tolist() if num_rejected is not None else [0] * B
        pos_t = target_positions if target_positions.dim() == 1 else target_positions[0]
        pos = pos_t.cpu().numpy()
        toks = target_token_ids.cpu().numpy()
        bonus = next_token_ids.tolist()
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
            k = min(e - s - 1, self.controller.k_max) if rid in self.controller._pending else 0
            verified.append((k, k - int(rej[i])))
            rows.append(i)
            req_ids.append(rid)
        if rows and K:
            plan = self.controller.plan_overlap(req_ids, hists, verified, sampled=self._sampled(rows))
            # no clock here (the lengths are the scheduler's, one process), but the same insurance as _adaptive
            plan = self._sync(plan)
            block = None
            if plan.needs_block:
                self._write_hints(rows, self._hints(plan.lookups, hists))
                block = self._block(draft, rows)
            out[rows] = self.controller.propose_overlap(plan, block, out[rows, 0])
            if block is not None:
                self._hand_off_probs(rows, out[rows], plan.overlap_spans(K))
        elif rows:
            self.controller.score_overlap(req_ids, verified)
        if self._calls % 64 == 0:  # requests not seen for 64 steps: finished or long preempted
            gone = [r for r, t in self._seen.items() if t < self._calls - 64]
            self.history.drop(gone)
            for r in gone:
                del self._seen[r]
        self.metrics.flush()
        return torch.from_numpy(out).to(next_token_ids.device)


def adaptive_overlap(vllm_config) -> bool:
    """Does adaptive drafting run under overlap (async) scheduling in this engine? Refuses a config it cannot run:
    async scheduling needs our scheduler, which decides each request's draft length."""
    sched = vllm_config.scheduler_config
    if sched.async_scheduling and sched.scheduler_cls != ADAPTIVE_SCHEDULER:
        raise ValueError("vllm_dflash: adaptive drafting with async scheduling needs our scheduler (it decides each "
                         f"request's draft length); this engine's scheduler is {sched.scheduler_cls!r}. Fix: "
                         f"--scheduler-cls {ADAPTIVE_SCHEDULER}, or --no-async-scheduling, or set "
                         "speculative_config.adaptive to false")
    return bool(sched.async_scheduling)


def adaptive_mode(vllm_config=None) -> str | None:
    """The setting `adaptive` of this engine (vllm_config.additional_config["dflash"]; without a config: the
    environment / default): false -> None (fixed block); true -> 'both' (per request-step the DFlash block, prompt
    lookup or the two merged); 'dflash', 'ngram' or 'merged' -> that source only (still adaptive lengths)."""
    return settings.from_vllm_config(vllm_config).adaptive_mode


_UPSTREAM = DFlashProposer


class _DrafterSwitchMeta(type):
    """Stands in for `DFlashProposer` in the runner module: building it returns our drafter (or vLLM's,
    with the setting drafter=vllm); isinstance checks accept either."""

    def __call__(cls, vllm_config, device, runner=None):
        if settings.from_vllm_config(vllm_config).drafter == "vllm":
            logger.info("vllm_dflash: drafter=vllm -> using vLLM's built-in DFlash drafter")
            return _UPSTREAM(vllm_config, device, runner)
        return DFlashDrafter(vllm_config, device, runner)

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, _UPSTREAM)

    def __subclasscheck__(cls, sub) -> bool:
        return issubclass(sub, _UPSTREAM)


class DFlashProposerSwitch(metaclass=_DrafterSwitchMeta):
    pass


def install() -> None:
    from vllm.v1.worker import gpu_model_runner as gmr

    assert hasattr(gmr, "DFlashProposer"), "vllm.v1.worker.gpu_model_runner.DFlashProposer moved"
    if gmr.DFlashProposer is not DFlashProposerSwitch:
        gmr.DFlashProposer = DFlashProposerSwitch
