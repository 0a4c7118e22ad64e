# SPDX-License-Identifier: Apache-2.0
"""`DFlashDrafter`: our drafter for `method: "dflash"` in vLLM's V1 model runner (CPU and GPU).

It subclasses vLLM's `DFlashProposer`, reusing its input kernel (query ids / positions / slots for
[bonus, MASK x K] per request), attention metadata and draft KV cache, and the runner's rejection
sampler for verification (greedy, or lossless rejection sampling of our one-hot greedy drafts). This class owns
vLLM's seam only: loading (the draft model, the LoRA embedding, start-up checks), `propose` as vLLM calls it, and
the hand-off of the step's context rows to the draft's KV cache (KV injection through our op, DFlashDraftForVllm;
held for a later draft forward under deferred injection). How it drafts is its strategy, one per mode
(integration/drafting/: the fixed block, adaptive drafting under synchronous scheduling, adaptive drafting under
overlap scheduling; `drafting_mode` resolves the mode once from the frozen settings).

Async-scheduling rule (vLLM MRv2's invariant): inputs keep the target's token count, rejected
positions are padding, `num_rejected_tokens` stays a device tensor; `propose` does no host sync
(no .item() / .tolist(); timings use CUDA events resolved a step later on GPU).

Tensor parallelism (docs/TP.md, dev/TP_DESIGN.md): every TP rank runs this drafter on the same inputs; the draft's
layers are vLLM's parallel layers in the target's TP group (per-rank KV heads, all-reduced / all-gathered outputs),
so the fixed-block path is rank-consistent by construction; adaptive drafting adopts TP rank 0's plan
(integration/drafting/adaptive.py). Only TP rank 0 (vLLM's output rank) publishes our metrics: merged snapshots are
summed.
"""
from __future__ import annotations

import time

import torch
from typing_extensions import override
from vllm.logger import init_logger
from vllm.v1.spec_decode.dflash import DFlashProposer

from vllm_dflash import settings
from vllm_dflash.config import DFlashConfig
from vllm_dflash.integration.block_rows import block_subset
from vllm_dflash.integration.deferred_context import kept_rows
from vllm_dflash.integration.drafting.adaptive import AdaptiveDrafting
from vllm_dflash.integration.drafting.block_sampling import resolve_draft_sampling
from vllm_dflash.integration.drafting.fixed import FixedBlock
from vllm_dflash.integration.drafting.mode import drafting_mode
from vllm_dflash.integration.drafting.overlap import OverlapDrafting
from vllm_dflash.integration.drafting.step import DraftStep, ForwardInputs
from vllm_dflash.integration.forward_timer import StepTimer
from vllm_dflash.integration.padded_inputs import PaddedInputs
from vllm_dflash.integration.tp_plan import tp_group
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
        self.mode = drafting_mode(vllm_config)  # refuses adaptive drafting under async scheduling without our scheduler
        self.diffusion_steps = self.settings.diffusion_steps or self.dflash.diffusion_steps
        self.hint_ngram = self.dflash.hint_ngram  # a hinted draft: its block is fed the prompt-lookup continuation
        if self.hint_ngram is not None and self.diffusion_steps > 1:
            raise ValueError(f"vllm_dflash: the draft {spec.draft_model_config.model} is a hinted draft "
                             "(dflash_config.hint_ngram), which drafts in one pass; diffusion_steps is "
                             f"{self.diffusion_steps}. Fix: set speculative_config.diffusion_steps to 1")
        self.confidence_threshold = self.settings.confidence_threshold
        # sampled requests draft from the draft's marginals (setting draft_sampling); vLLM's own probabilistic path
        # (draft_sample_method) stays off: q is ours, over the target vocabulary (integration/draft_probs.py)
        self.sample_drafts = resolve_draft_sampling(self.settings.draft_sampling, self.diffusion_steps, spec)
        # slots drawn from q: auto the first (its marginal is the distribution the target verifies there; a later
        # slot's marginal ignores the sampled tokens before it, and drawing those lowered acceptance on the tiny
        # pair: tests/vllm/test_vllm_sampling.py), probabilistic every slot; the rest take the argmax (one-hot q)
        self.sampled_slots = 1 if self.settings.draft_sampling == "auto" else self.num_speculative_tokens
        self._enable_probabilistic_draft_probs = False
        self._q_buffer = None  # DraftProbs, built in load_model when sample_drafts
        # only the output rank publishes (merged() sums snapshots: TP = 2 would count every event twice)
        self.metrics = MetricsSink.get(vllm_config) if is_output_rank() else MetricsSink.disabled()
        self.timer = StepTimer(torch.device(device))
        self.metrics.set("diffusion_steps", self.diffusion_steps)
        self.metrics.set("block_size", self.num_speculative_tokens + 1)
        self._runner = runner
        self.adaptive = self.mode.sources
        self.overlap = self.mode.overlap
        self._injection_s = 0.0  # host seconds in `_inject` since the adaptive draft forward's timer started
        # adaptive "ngram" drafts from prompt lookup only: no draft forward ever reads the draft's cache, so no context
        # row is kept, combined (fc) or injected (measured at concurrency 32 on chat prompts: 1.3-2.3 ms of a 50-90 ms
        # step went to rows nothing read)
        self._context_unused = self.adaptive == "ngram"
        self._padded: PaddedInputs | None = None  # this call's deferred padded-batch preparation (padded_inputs.py)
        self._deferred = None  # adaptive drafting with defer_injection: context rows held until a draft forward
        if self.mode.adaptive and (self.settings.defer_injection or self._context_unused):
            from vllm_dflash.integration.deferred_context import DeferredContext

            self._deferred = DeferredContext()
        # prefix caching: a later request that hits a cached block drafts against that block's draft K/V, so the
        # blocks some of whose rows were dropped are recorded (draft_cache_record.py; built at the first step, when
        # vLLM has set the block size), and a request whose prefix hit covers one drafts without DFlash
        self._prefix_caching = bool(getattr(vllm_config.cache_config, "enable_prefix_caching", False))
        self.cache_record: DraftCacheRecord | None = None
        # how this engine drafts (integration/drafting/), one strategy per mode
        strategy = OverlapDrafting if self.mode.overlap else AdaptiveDrafting if self.mode.adaptive else FixedBlock
        self.strategy = strategy(self, self.mode, device)
        self.controller = self.strategy.controller  # the adaptive controller (None: the fixed block)
        # the series this drafter publishes, at 0 from the start; accepted_tokens_per_step is observed in the engine
        # core (patches/observe_draft.py), declared here too so that it is there before the first verification
        self.metrics.declare("draft_steps", "accepted_tokens_per_step",
                             *(() if self._context_unused else ("draft_forward_seconds", "kv_injection_seconds")))
        logger.info("vllm_dflash: our DFlash drafter is active (draft %s; block size %d, %d draft tokens/step, "
                    "diffusion steps %d, confidence threshold %.2f, target layers %s, mask id %d)",
                    spec.draft_model_config.model, self.dflash.block_size, self.num_speculative_tokens,
                    self.diffusion_steps, self.confidence_threshold, list(self.dflash.target_layer_ids),
                    self.dflash.mask_token_id)
        if self.hint_ngram is not None:
            if self.controller is None and self.mode.async_scheduling:
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

    def _inner(self):
        m = self.model
        return m.unwrap() if hasattr(m, "unwrap") else m

    @override
    def load_model(self, target_model) -> None:
        super().load_model(target_model)
        self._unwrap_lora_embedding()
        self.strategy.load_model(target_model)  # adaptive, CPU, synchronous: times the target forward
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
    def prepare_next_token_ids_padded(self, sampled_token_ids, requests, gpu_input_batch, discard_request_mask):
        """vLLM's, deferred to first use where adaptive drafting runs under synchronous scheduling (the runner makes
        no host copy of the counts then): most of its steps at concurrency read none of it (padded_inputs.py)."""
        self._padded = None
        if self.controller is None or self.overlap or \
                getattr(self._runner, "valid_sampled_token_count_event", None) is not None:
            return super().prepare_next_token_ids_padded(sampled_token_ids, requests, gpu_input_batch,
                                                         discard_request_mask)
        self._padded = PaddedInputs(self, sampled_token_ids, requests, gpu_input_batch, discard_request_mask)
        return self._padded.next_marker, self._padded.count_marker

    @override
    def prepare_inputs_padded(self, common_attn_metadata, spec_decode_metadata, valid_sampled_tokens_count):
        """vLLM's, deferred too where the step verified no draft (nothing rejected): the runner reads only
        `num_actual_tokens` of the metadata it returns, which the target's equals then."""
        p = self._padded
        if p is None or valid_sampled_tokens_count is not p.count_marker:
            return super().prepare_inputs_padded(common_attn_metadata, spec_decode_metadata,
                                                 valid_sampled_tokens_count)
        if p.defer_padding(common_attn_metadata, spec_decode_metadata):
            return common_attn_metadata, p.index_marker, p.index_marker
        return super().prepare_inputs_padded(common_attn_metadata, spec_decode_metadata, p.next_and_count()[1])

    @override
    def propose(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                mm_embed_inputs=None, num_rejected_tokens_gpu=None, slot_mappings=None) -> torch.Tensor:
        """vLLM's call, once per engine step. -> [B, K] drafts, or per batch row a list of drafts (adaptive drafting
        under synchronous scheduling: variable lengths)."""
        K = self.num_speculative_tokens = num_speculative_tokens
        self._last_draft_probs = None
        padded, self._padded = self._padded, None
        batch_size = common_attn_metadata.batch_size()
        self.timer.drain(self.metrics)
        defer = self._deferred is not None  # adaptive: this step's context rows wait until a draft forward needs them
        if not defer:  # [num_tokens, n_feat * H] -> [num_tokens, H] (fc); hidden_norm happens inside the injection
            target_hidden_states = self._inner().combine_hidden_states(target_hidden_states)
        step = DraftStep(self, K, batch_size, common_attn_metadata, target_hidden_states, sampling_metadata,
                         mm_embed_inputs, target_token_ids, target_positions, next_token_ids, token_indices_to_sample,
                         num_rejected_tokens_gpu, defer, padded)
        try:
            if not defer:
                step.prepare()  # injection every step (the fixed block drafts every step anyway)
            return self.strategy.propose(step)
        finally:
            if defer:
                self._hold(step)
            if padded is not None:
                padded.open = False

    def first_pass(self, step: DraftStep, cad, token_indices_to_sample, num_rejected):
        """vLLM's `set_inputs_first_pass` for `step` (the draft's query ids / positions / slots, the context rows'
        positions / slots). -> (num_tokens, sample_idx, cad) of the draft's query rows."""
        num_tokens, sample_idx, cad = self.set_inputs_first_pass(
            target_token_ids=step.target_token_ids, next_token_ids=step.next_token_ids,
            target_positions=step.target_positions, target_hidden_states=step.hidden,
            token_indices_to_sample=token_indices_to_sample, cad=cad, num_rejected_tokens_gpu=num_rejected)
        if self._query_rows is not None:  # the query block (last position + 1 + offset) inside the RoPE cache
            self.positions.clamp_(max=self._query_rows - 1)  # [max_padded_query_tokens], in place: no host sync
        return num_tokens, sample_idx, cad

    def forward_inputs(self, step: DraftStep, select: list[int] | None = None) -> ForwardInputs:
        """Attention metadata and model inputs of `step`'s draft forward, after the KV injection of the context rows
        (this step's, and under deferred injection the rows held since the last draft forward, in one injection).
        select: the batch rows the forward runs over (block_rows.py; deferred path only), None: every request."""
        K, cad, num_tokens = step.K, step.cad, step.num_tokens
        sub = block_subset(cad, select, K + 1) if select is not None and step.defer else None
        md_cad, n = (cad, num_tokens) if sub is None else (sub[0], sub[0].num_actual_tokens)
        mode, num_input_tokens, across_dp = self._determine_batch_execution_and_padding(n)
        if sub is not None and num_input_tokens != n:  # padded (graph sizes): the subset would not fill it
            sub, md_cad, n = None, cad, num_tokens
            mode, num_input_tokens, across_dp = self._determine_batch_execution_and_padding(n)
        _, per_layer_md = self.build_per_group_and_layer_attn_metadata(md_cad)
        if step.defer:  # the rows held since the last draft forward, then this step's, in one injection
            self._inject(self._deferred.take(step.hidden[:step.num_context], *step.context_rows()))
            ids, pos = self.input_ids[:num_input_tokens], self._get_positions(num_input_tokens)
            if sub is not None:  # [len(select) * (K + 1)]: the selected requests' slots (hints already written)
                ids, pos = self.input_ids[:num_tokens][sub[1]], self._get_positions(num_tokens)[sub[1]]
            model_kwargs = dict(input_ids=ids, positions=pos, inputs_embeds=None)
            slot_mapping_size = num_input_tokens
        else:
            t_inj = self.timer.start()
            # KV injection of this step's context rows into every draft layer's paged cache
            model_kwargs, slot_mapping_size = self.build_model_inputs_first_pass(num_tokens, num_input_tokens,
                                                                                 step.mm_embed_inputs)
            self.timer.stop("kv_injection_seconds", t_inj, self.metrics)
        return ForwardInputs(per_layer_md, mode, num_input_tokens, across_dp, model_kwargs, slot_mapping_size, md_cad,
                             None if sub is None else select)

    def _hold(self, step: DraftStep) -> None:
        """Deferred injection, after the strategy: a step that ran no draft forward holds its context rows for the
        next one, unless no draft forward may read them (adaptive "ngram", or the plan dropped them), and only those
        of requests that still hold their draft context (`AdaptiveController.wants_context`)."""
        if self._context_unused:
            return
        m = step.num_context
        record = self.cache_record
        if step.inputs is not None or step.drop_context:  # injected with the draft forward, or dropped
            if record is not None:
                (record.dropped if step.drop_context else record.written)(step.context_rows()[1])
            return
        rows = self._wanted_rows(step.target_cad, m)
        if rows == [] and record is None:  # every request of the step released its draft context
            return
        positions, slots = step.context_rows()
        hidden = step.hidden[:m]
        if rows is None:
            self._defer(hidden, positions, slots)
            if record is not None:
                record.written(slots)
            return
        keep = torch.zeros(m, dtype=torch.bool, device=hidden.device)
        keep[rows] = True
        if rows:
            self._defer(hidden[keep], positions[keep], slots[keep])
        if record is not None:
            record.written(slots[keep])
            record.dropped(slots[~keep])

    def _wanted_rows(self, cad, num_context: int) -> list[int] | None:
        """This step's context rows whose requests still hold their draft context (None: all of them; the common case,
        no request released its context)."""
        if not self.controller.stale:
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


def adaptive_overlap(vllm_config) -> bool:
    """Does adaptive drafting run under overlap (async) scheduling in this engine? Refuses a config it cannot run:
    async scheduling needs our scheduler, which decides each request's draft length (`drafting_mode`)."""
    return drafting_mode(vllm_config).overlap


def adaptive_mode(vllm_config=None) -> str | None:
    """The setting `adaptive` of this engine (vllm_config.additional_config["dflash"]; without a config: the
    environment / default): false -> None (fixed block); true -> 'both' (per request-step the DFlash block, prompt
    lookup or the two merged); 'dflash', 'ngram' or 'merged' -> that source only (still adaptive lengths)."""
    return drafting_mode(vllm_config, check=False).sources


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
