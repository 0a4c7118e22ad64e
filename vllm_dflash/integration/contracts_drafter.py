# SPDX-License-Identifier: Apache-2.0
"""The seam table's rows for our drafter: the drafter class and its vLLM base (`DRAFTER_CONTRACTS`: the runner's
proposer global, `DFlashProposer`, the draft model classes, its checkpoint format and config) and adaptive drafting
(`ADAPTIVE_CONTRACTS`: the input batch and runner internals the drafting strategies read, the async scheduler's base
class and the objects it reads). Part of `CONTRACTS` (integration/contracts.py), each spliced in place."""
from __future__ import annotations

from vllm_dflash.integration.contract_types import Contract, Sig

_ADAPTIVE_TEST = "tests/vllm/test_vllm_adaptive.py"
_KV_TEST = "tests/vllm/test_kv_injection_vllm.py"
_CROSS_TEST = "tests/vllm/test_vllm_cross_lookup.py"

DRAFTER_CONTRACTS: tuple[Contract, ...] = (
    Contract(
        "vllm.v1.worker.gpu_model_runner:DFlashProposer", "attribute", "integration/proposer.py",
        "bound to `DFlashProposerSwitch`, building our `DFlashDrafter` or vLLM's (setting `drafter`)",
        "the runner constructs its drafter from this module global (`DFlashProposer(self.vllm_config, self.device, "
        "self)`) and otherwise only uses it in `isinstance` checks; `CPUModelRunner` inherits the V1 runner",
        source=("DFlashProposer(self.vllm_config, self.device, self)",), patch="drafter_class",
        test="tests/vllm/test_vllm_drafter.py::test_our_drafter_is_active_and_logged"),
    Contract(
        "vllm.v1.spec_decode.dflash:DFlashProposer", "class", "integration/proposer.py, integration/drafting/ "
        "(step.py, denoise.py, block_sampling.py, hints.py)",
        "base class of `DFlashDrafter` (input kernel, attention metadata, draft KV cache, sampling)",
        "`set_inputs_first_pass` writes query ids / positions / slots for [bonus, MASK x K] per request and the "
        "context rows' positions / slots into `_context_positions_buffer` / `_context_slot_mapping_buffer` (first "
        "`_dflash_num_context` rows), and returns a new `CommonAttentionMetadata`; `build_model_inputs_first_pass` "
        "calls `model.precompute_and_store_context_kv` and returns `input_ids[:n]`, `_get_positions(n)` (deferred "
        "injection, integration/deferred_context.py, builds the same inputs itself after one injection of the held "
        "rows); "
        "`propose` has the signature of `SpecDecodeBaseProposer.propose`; `input_ids` is the draft's input buffer "
        "(re-masked between denoising passes); `load_model(target_model)` gets the loaded target; `block_size` is "
        "the draft KV cache's block size once vLLM set it (a slot is block id x block_size + offset: "
        "integration/draft_cache_record.py)",
        methods=(Sig("__init__", ("vllm_config", "device", "runner"), exact=True),
                 Sig("set_inputs_first_pass", ("target_token_ids", "next_token_ids", "target_positions",
                                               "target_hidden_states", "token_indices_to_sample", "cad",
                                               "num_rejected_tokens_gpu")),
                 Sig("build_per_group_and_layer_attn_metadata", ("cad",)),
                 Sig("build_model_inputs_first_pass", ("num_tokens", "num_input_tokens", "mm_embed_inputs")),
                 Sig("_determine_batch_execution_and_padding", ("num_tokens",)),
                 Sig("_get_slot_mapping", ("num_tokens", "slot_mapping")),
                 Sig("_get_positions", ("num_tokens",)),
                 Sig("_sample_draft_tokens", ("hidden_states", "sampling_metadata")),
                 Sig("load_model", ("target_model",), exact=True),
                 Sig("propose", ("num_speculative_tokens", "target_token_ids", "target_positions",
                                 "target_hidden_states", "next_token_ids", "token_indices_to_sample",
                                 "common_attn_metadata", "sampling_metadata", "mm_embed_inputs",
                                 "num_rejected_tokens_gpu", "slot_mappings"), exact=True)),
        attrs=("vllm_config", "model", "input_ids", "parallel_drafting_token_id", "num_speculative_tokens",
               "_enable_probabilistic_draft_probs", "_last_draft_probs", "_dflash_num_context",
               "_context_positions_buffer", "_context_slot_mapping_buffer", "block_size"),
        test="tests/vllm/test_vllm_drafter.py"),
    Contract(
        "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer", "class", "integration/padded_inputs.py, "
        "integration/proposer.py",
        "`prepare_next_token_ids_padded` and `prepare_inputs_padded` overridden (adaptive drafting, synchronous "
        "scheduling): the runner gets markers and vLLM's own methods run when `propose` first reads their results",
        "`prepare_next_token_ids_padded(sampled_token_ids, requests, gpu_input_batch, discard_request_mask)` -> "
        "(next_token_ids [B], valid_sampled_tokens_count [B]); `prepare_inputs_padded(common_attn_metadata, "
        "spec_decode_metadata, valid_sampled_tokens_count)` -> (metadata, token_indices_to_sample, num_rejected), a "
        "request's rejected count 0 where it verified no draft (`spec_decode_metadata.num_draft_tokens`, a host list)",
        methods=(Sig("prepare_next_token_ids_padded", ("sampled_token_ids", "requests", "gpu_input_batch",
                                                       "discard_request_mask"), exact=True),
                 Sig("prepare_inputs_padded", ("common_attn_metadata", "spec_decode_metadata",
                                               "valid_sampled_tokens_count"), exact=True)),
        source=("_eagle_prepare_inputs_padded(",),
        test="tests/vllm/test_vllm_deferred_injection.py::test_a_step_that_drafts_nothing_prepares_nothing"),
    Contract(
        "vllm.v1.worker.gpu_model_runner:GPUModelRunner.propose_draft_token_ids", "method",
        "integration/padded_inputs.py",
        "what the runner does with the padded preparation's results before our `propose` (the markers pass through)",
        "under DFlash with the padded batch: `prepare_next_token_ids_padded`, then `_copy_valid_sampled_token_count` "
        "(returns at once where `valid_sampled_token_count_event` is None: no async scheduling), then, after a step "
        "with spec-decode metadata, `prepare_inputs_padded`, of whose metadata it reads `num_actual_tokens` only, "
        "then `propose`, all before the step's bookkeeping changes the input batch",
        source=("self.drafter.prepare_next_token_ids_padded(", "self.drafter.prepare_inputs_padded(",
                "total_num_tokens = common_attn_metadata.num_actual_tokens"),
        test="tests/vllm/test_vllm_deferred_injection.py"),
    Contract(
        "vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM", "class", "integration/vllm_model.py",
        "base class of `DFlashDraftForVllm` (the V1 proposer asserts it); `combine_hidden_states` = fc; reduced "
        "vocabulary through `draft_id_to_target_id` (d2t offsets)",
        "paged-KV attention, weight loading and TP sharding are vLLM's; we override `precompute_and_store_context_kv` "
        "(KV injection) and read `logits_processor`, `lm_head`",
        methods=(Sig("__init__", ("*", "vllm_config", "prefix"), exact=True),
                 Sig("load_weights", ("weights",), exact=True),
                 Sig("precompute_and_store_context_kv", ("context_states", "context_positions",
                                                         "context_slot_mapping"), exact=True),
                 Sig("combine_hidden_states", ("hidden_states",))),
        attrs=("model", "logits_processor", "lm_head", "draft_id_to_target_id"),
        test="tests/vllm/test_vllm_drafter.py"),
    Contract(
        "vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model", "class", "integration/vllm_model.py",
        "our fused KV injection reads vLLM's stacked buffers (`_build_fused_kv_buffers()`) as its weights and the "
        "draft's attention layers (`_attn_layers[i].impl`, `.kv_cache`)",
        "`_fused_kv_weight` [L*2*nkv*hd, H] (None when quantized), `_fused_kv_bias` (None without bias), "
        "`_k_norm_weights`, `_hidden_norm_weight`, `_rope_cos_sin_cache`, `_rope_is_neox`, `_num_attn_layers`, "
        "`_num_kv_heads`, `_head_dim`, `_rms_norm_eps`",
        methods=(Sig("_build_fused_kv_buffers", ()),),
        attrs=("layers", "_attn_layers", "_fused_kv_weight", "_fused_kv_bias", "_k_norm_weights",
               "_hidden_norm_weight", "_rope_cos_sin_cache", "_rope_is_neox", "_num_attn_layers", "_num_kv_heads",
               "_head_dim", "_rms_norm_eps"),
        test=_KV_TEST),
    Contract(
        "vllm.model_executor.models.qwen3_dflash", "module", "vllm_dflash/model.py (checkpoint format)",
        "the draft checkpoint format: `architectures: [\"DFlashDraftModel\"]`, `model_type: \"qwen3\"`, `block_size`, "
        "`num_target_layers`, `dflash_config.{mask_token_id,target_layer_ids}`, optional `draft_vocab_size` + "
        "`lm_head.weight` + `d2t`",
        "what `qwen3_dflash.py` loads (`d2t` renamed to `draft_id_to_target_id`)",
        source=('"d2t"',), test="tests/vllm/test_vllm_upstream_compat.py"),
    Contract(
        "vllm:ModelRegistry.register_model", "method", "integration/patches/__init__.py",
        "`register_model(\"DFlashDraftModel\", \"vllm_dflash.integration.vllm_model:DFlashDraftForVllm\")`; "
        "`DFlashDraftForVllm.__new__` builds vLLM's own `DFlashQwen3ForCausalLM` for an engine without our drafter",
        "maps the architecture name to a `module:Class` string, loaded lazily, process-wide",
        params=("model_arch", "model_cls"), test="tests/vllm/test_vllm_package.py"),
    Contract(
        "vllm.transformers_utils.configs.eagle:EAGLEConfig", "class", "integration/proposer.py, vllm_dflash/config.py",
        "the drafter re-parses `DFlashConfig` from `draft_model_config.hf_config.to_dict()` and re-checks the target",
        "keeps architecture names starting with `DFlash`, and `dflash_config`, `block_size`, `num_target_layers` and "
        "the Qwen3 fields",
        source=('arch.startswith("DFlash")',), test="tests/vllm/test_vllm_drafter.py"),
    Contract(
        "vllm.model_executor.models.qwen3_dflash:DFlashQwen3Attention", "class", "integration/proposer.py",
        "`_check_tp_shards`: `model.layers[0].self_attn.num_kv_heads` / `.total_num_kv_heads`",
        "per-rank and total KV heads of the sharded draft (total // TP, or one replica when TP exceeds them)",
        attrs=("num_kv_heads", "total_num_kv_heads"), test="tests/vllm/test_tp.py"),
)

ADAPTIVE_CONTRACTS: tuple[Contract, ...] = (
    Contract(
        "vllm.v1.worker.gpu_input_batch:InputBatch", "class", "integration/drafting/ (plan.py, adaptive.py, "
        "overlap.py, block_sampling.py), integration/proposer.py, integration/patches/generator_rewind.py",
        "adaptive drafting reads `runner.input_batch.req_ids`, `.token_ids_cpu`, `.num_prompt_tokens` (the runner "
        "passed to `DFlashProposer(vllm_config, device, runner)`); the generator patch swaps `.generators`",
        "synchronous: the drafter runs BEFORE `_bookkeeping_sync`; `token_ids_cpu` then holds prompt + committed "
        "output + this step's scheduled drafts (written by `_update_states`), so a request's accepted history is "
        "`token_ids_cpu[i, :p + 1]` (p: the position of its last accepted query token) plus `next_token_ids[i]`; rows "
        "in batch order; `propose` may return `list[list[int]]` of per-request lengths (passed through like the "
        "n-gram proposer's). Overlap (async): `target_token_ids` are the query tokens the target verified (the "
        "accepted ones: the first qlen - rejected), `token_ids_cpu` holds the prompt only (later outputs stay on the "
        "device), hence the mirror `adaptive/history.py`",
        attrs=("req_ids", "token_ids_cpu", "num_prompt_tokens", "generators", "num_reqs", "temperature_cpu"),
        test=_ADAPTIVE_TEST),
    Contract(
        "vllm.v1.worker.gpu_model_runner:GPUModelRunner._get_spec_decode_draft_probs", "method",
        "integration/drafting/fixed.py, integration/drafting/block_sampling.py, integration/draft_probs.py",
        "probabilistic drafting: after `propose` the runner reads `drafter.take_last_draft_probs()` ([B, K, V] or "
        "None) with the batch's `req_ids`; the next step's rejection sampler gets each request's first num_draft rows",
        "rows are the batch rows at `propose` time (`_draft_prob_req_ids`), sliced `[row, :num_draft]` and copied "
        "(`torch.cat`) before the next `propose`; V = the target's logits width (`model_config.get_vocab_size()`); "
        "`None` = one-hot drafts for every request. Greedy rows are verified by argmax whatever q holds; "
        "`SamplingMetadata.temperature` is 0 for greedy rows, `.top_k` (>= vocab: off) / `.top_p` None when no request "
        "uses them",
        params=("spec_decode_metadata",), source=("self._draft_probs[row_idx, :num_draft]",
                                                  "torch.cat(draft_probs_rows, dim=0)"),
        test="tests/vllm/test_vllm_sampling.py"),
    Contract(
        "vllm.v1.attention.backend:CommonAttentionMetadata", "class", "integration/proposer.py, integration/drafting/ "
        "(plan.py, overlap.py, step.py), block_rows.py",
        "`propose`'s `common_attn_metadata`: `query_start_loc_cpu`, `num_reqs`, `batch_size()`; `slot_mapping`. "
        "block_rows.py copies the drafter's query metadata (`dataclasses.replace`) for the requests a draft forward "
        "runs over",
        "per-request query boundaries on the host; a dataclass whose per-request fields are the ones block_rows.py "
        "rewrites (query_start_loc[_cpu], seq_lens, seq_lens_cpu_upper_bound, block_table_tensor rows, slot_mapping) "
        "or leaves the full forward to when set (its `_UNHANDLED`)", methods=(Sig("batch_size", ()),),
        attrs=("query_start_loc", "query_start_loc_cpu", "num_reqs", "slot_mapping", "seq_lens", "num_actual_tokens",
               "max_query_len", "block_table_tensor", "seq_lens_cpu_upper_bound", "causal", "logits_indices_padded",
               "encoder_seq_lens", "dcp_local_seq_lens", "is_prefilling", "req_idx", "mm_req_doc_ranges",
               "rswa_prefix_lens", "positions"),
        test="tests/vllm/test_vllm_block_rows.py"),
    Contract(
        "vllm.v1.core.sched.async_scheduler:AsyncScheduler", "class", "integration/async_scheduler.py",
        "base class of `AdaptiveAsyncScheduler` (adaptive drafting + overlap), set through `scheduler_cls`",
        "after vLLM's `_update_after_schedule`, `request.spec_token_ids` of each scheduled request with "
        "`is_prefill_chunk` False is the placeholder list the next `schedule()` verifies; "
        "`scheduler_output.num_spec_tokens_to_schedule` is the draft count the runner asks for (0 allowed); the "
        "runner's `_prepare_input_ids` takes the first `len(scheduled_spec_decode_tokens[r])` previous drafts",
        methods=(Sig("_update_after_schedule", ("scheduler_output",), exact=True),
                 Sig("update_from_output", ("scheduler_output", "model_runner_output"), exact=True)),
        attrs=("num_spec_tokens", "requests", "vllm_config"), test=_ADAPTIVE_TEST),
    Contract(
        "vllm.v1.core.sched.output:SchedulerOutput", "class", "integration/async_scheduler.py",
        "read in `update_from_output`; `num_spec_tokens_to_schedule` written in `_update_after_schedule`",
        "drafts scheduled per request and the step's token count",
        attrs=("num_scheduled_tokens", "scheduled_spec_decode_tokens", "total_num_scheduled_tokens",
               "scheduled_new_reqs", "num_spec_tokens_to_schedule"), test=_ADAPTIVE_TEST),
    Contract(
        "vllm.v1.outputs:ModelRunnerOutput", "class", "integration/async_scheduler.py",
        "`sampled_token_ids[req_id_to_index[r]]`", "host lists of the tokens each request produced this step",
        attrs=("sampled_token_ids", "req_id_to_index"), test=_ADAPTIVE_TEST),
    Contract(
        "vllm.v1.request:Request", "class", "integration/async_scheduler.py",
        "`spec_token_ids` replaced by k_r placeholders; `is_prefill_chunk`, `num_tokens`, `all_token_ids`",
        "the scheduler's view of a request's committed tokens", attrs=("request_id", "spec_token_ids",
                                                                       "is_prefill_chunk", "num_tokens",
                                                                       "all_token_ids"), test=_ADAPTIVE_TEST),
    # cross-request lookup's tenant (cache_salt, LoRA adapter): adaptive/cross_lookup.py, drafting/adaptive.py
    Contract(
        "vllm.v1.core.sched.scheduler:Scheduler.add_request", "method", "integration/patches/cross_lookup_salt.py",
        "wrapped: sets `request.cache_salt` (None when empty) on `request.sampling_params` as the attribute "
        "`_vllm_dflash_cache_salt`, for an engine with our drafter (the scheduler's `vllm_config`)",
        "called in the engine core for each new request (and each streaming-input chunk) before it is scheduled, "
        "also by `AsyncScheduler` (inherited)",
        params=("request",), exact=True, attrs=("vllm_config",), patch="cross_lookup_salt", test=_CROSS_TEST),
    Contract(
        "vllm.v1.request:Request", "class", "integration/patches/cross_lookup_salt.py",
        "`cache_salt`, `sampling_params`, `lora_request` of each new request",
        "`cache_salt` is the tenant key of vLLM's prefix cache (in the first block's hash); not sent to the worker",
        attrs=("cache_salt", "sampling_params", "lora_request"), test=_CROSS_TEST),
    Contract(
        "vllm.sampling_params:SamplingParams", "class", "integration/patches/cross_lookup_salt.py",
        "carries the salt attribute from the scheduler to the runner's request state",
        "a msgspec Struct with `dict=True`: an instance takes attributes that are not fields (never serialised)",
        source=("dict=True",), test=_CROSS_TEST),
    Contract(
        "vllm.v1.core.sched.output:NewRequestData.from_request", "method", "integration/drafting/adaptive.py",
        "`_tenant` reads the salt from the request's SamplingParams in the runner",
        "hands the runner the scheduler's own `Request.sampling_params` and `lora_request` objects (the `uni` "
        "executor calls the worker in the engine-core process: no copy)",
        source=("sampling_params=request.sampling_params", "lora_request=request.lora_request"), test=_CROSS_TEST),
    Contract(
        "vllm.v1.worker.gpu_model_runner:GPUModelRunner._update_states", "method", "integration/drafting/adaptive.py",
        "`_tenant`: `runner.requests[req_id].sampling_params` (the salt attribute) and `.lora_request`",
        "each new request's `CachedRequestState` keeps `new_req_data.sampling_params` and `.lora_request` as they "
        "are; `requests` holds every request of the batch until it finishes",
        source=("sampling_params = new_req_data.sampling_params", "lora_request=new_req_data.lora_request"),
        attrs=("requests",), test=_CROSS_TEST),
    Contract(
        "vllm.v1.worker.gpu_input_batch:CachedRequestState", "class", "integration/drafting/adaptive.py",
        "`sampling_params`, `lora_request` (`lora_name`, `lora_path`) of a request in the batch",
        "the runner's per-request state", attrs=("sampling_params", "lora_request"), test=_CROSS_TEST),
    Contract(
        "vllm.v1.core.kv_cache_utils", "module", "integration/drafting/adaptive.py",
        "the tenant of cross-request lookup mirrors what vLLM's prefix cache keeps apart: cache_salt and the LoRA "
        "adapter's (name, path)",
        "a block's hash includes the request's cache_salt (first block; `generate_block_hash_extra_keys`) and its "
        "adapter's (lora_name, lora_path) (`_gen_lora_extra_hash_keys`)",
        source=('("cache_salt", request.cache_salt)', "lora_request.lora_name, lora_request.lora_path"),
        scope="tests", test=_CROSS_TEST),
)
