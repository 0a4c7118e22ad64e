# SPDX-License-Identifier: Apache-2.0
"""The seam table's rows for sampling on CPU: the runner's sampling branch, vLLM's rejection sampler (its greedy and
sampled paths, which integration/greedy_verify.py and integration/sampled_verify.py take over for eligible batches),
the sampling metadata they read and the CPU expand kernel. Part of `CONTRACTS` (integration/contracts.py), in place."""
from __future__ import annotations

from vllm_dflash.integration.contract_types import Contract, Sig

SAMPLING_CONTRACTS: tuple[Contract, ...] = (
    Contract(
        "vllm.v1.worker.cpu_model_runner:CPUModelRunner._sample", "method", "integration/patches/cpu_plain_sample.py",
        "wrapped: a batch whose `spec_decode_metadata.max_spec_len` is 0 is sampled as `_sample(logits, None)`",
        "`_sample(logits, None)` is the runner's non-speculative branch (the plain sampler on `logits`); with no "
        "drafts the speculative `logits_indices` are the last query token of each request, the rows that branch "
        "expects, and the rejection sampler's output would be the same [num_reqs, 1] tokens",
        params=("logits", "spec_decode_metadata"), exact=True,
        source=("if spec_decode_metadata is None:", "return self.sampler("),
        patch="cpu_plain_sample",
        test="tests/vllm/test_vllm_patches.py::test_steps_without_drafts_sample_plainly"),
    Contract(
        "vllm.v1.sample.rejection_sampler:RejectionSampler.forward", "method",
        "integration/patches/cpu_greedy_verify.py, integration/greedy_verify.py",
        "wrapped: on CPU an eligible all-greedy batch returns `SamplerOutput(greedy_verify(metadata, logits), None)`",
        "for an all-greedy batch without logprobs, penalties, bad words, allowed-token masks, active "
        "argmax-changing logits processors (builtins `MinTokensLogitsProcessor.min_toks`, "
        "`LogitBiasLogitsProcessor.biases`) or thinking budget, its output is the greedy kernel over the argmax of "
        "`logits[target_logits_indices]` plus the sampler's greedy argmax of `logits[bonus_logits_indices]`: "
        "[B, max_spec_len + 1] int32, `PLACEHOLDER_TOKEN_ID` (-1) after each request's tokens",
        params=("metadata", "draft_probs", "logits", "sampling_metadata"), exact=True,
        attrs=("synthetic_mode",),
        source=("bonus_logits = logits[bonus_logits_indices]", "raw_target_logits = logits[target_logits_indices]",
                "output_token_ids = rejection_sample("),
        patch="cpu_greedy_verify",
        test="tests/vllm/test_greedy_verify.py"),
    Contract(
        "vllm.v1.sample.rejection_sampler:rejection_sample", "function",
        "integration/greedy_verify.py, integration/patches/cpu_sampled_verify.py, integration/sampled_verify.py",
        "reimplemented for eligible all-greedy batches (`greedy_accept`); replaced by a wrapper that takes "
        "all-sampled CPU batches itself (`rejection_sample_sampled`) and calls it otherwise",
        "all greedy: the greedy kernel over `target_logits.argmax(dim=-1)` and returns; the kernel writes the "
        "target's token at each draft position up to and including the first mismatch, the bonus after an "
        "all-accepted request, and leaves `PLACEHOLDER_TOKEN_ID` (-1, module constant) elsewhere. Sampled: "
        "`target_logits` come after the sampling constraints; a draft is accepted while `draft_prob > 0 and "
        "target_prob / draft_prob >= uniform_prob` (draft_prob 1 without `draft_probs`); the first rejected "
        "position gets a token from max(p - q, 0) (without draft probabilities: p with the draft token zeroed); "
        "`RejectionSampler.forward` calls it through the module global",
        params=("draft_token_ids", "num_draft_tokens", "max_spec_len", "cu_num_draft_tokens", "draft_probs",
                "target_logits", "bonus_token_ids", "sampling_metadata", "synthetic_mode",
                "synthetic_conditional_rates", "use_fp64_gumbel"), exact=True,
        source=("if sampling_metadata.all_greedy:", "target_argmax = target_logits.argmax(dim=-1)",
                "PLACEHOLDER_TOKEN_ID,", "uniform_probs = generate_uniform_probs(",
                "target_probs = target_logits.softmax(dim=-1, dtype=torch.float32)"),
        patch="cpu_sampled_verify",
        test="tests/vllm/test_greedy_verify.py, tests/unit/test_sampled_verify.py, tests/vllm/test_vllm_sampling.py"),
    Contract(
        "vllm.v1.sample.rejection_sampler:generate_uniform_probs", "function",
        "integration/patches/cpu_sampled_verify.py",
        "called for the uniform draws of an all-sampled batch",
        "[num_tokens] float64 uniforms, a seeded request's rows from its generator, none drawn for requests without "
        "drafts", params=("num_tokens", "num_draft_tokens", "generators", "device"), exact=True,
        test="tests/unit/test_sampled_verify.py"),
    Contract(
        "vllm.v1.sample.sampler:Sampler.greedy_sample", "method", "integration/greedy_verify.py",
        "mirrored: `row_argmax` takes every row's argmax with the same CPU op",
        "on CPU the greedy sampler (the bonus token of a speculative step, every token without speculation) is "
        "`torch.ops._C.greedy_argmax` over float32 logits; like torch's argmax it returns the first index of a tie",
        params=("logits",), source=("torch.ops._C.greedy_argmax(logits)",),
        test="tests/vllm/test_greedy_verify.py"),
    Contract(
        "vllm.v1.sample.rejection_sampler", "module", "integration/greedy_verify.py, integration/sampled_verify.py",
        "`PLACEHOLDER_TOKEN_ID` mirrored as a constant; the sampled rule mirrored",
        "the placeholder of rejected positions is -1; the random kernel accepts while `draft_prob > 0` and "
        "`target / draft >= uniform`, and recovers from max(p - q, 0) (without draft probabilities: p without the "
        "draft token)",
        attrs=("PLACEHOLDER_TOKEN_ID",),
        source=("PLACEHOLDER_TOKEN_ID: tl.constexpr = -1",
                "accepted = draft_prob > 0 and target_prob / draft_prob >= uniform_prob",
                "mask=(vocab_mask & (vocab_offset != draft_token_id))",
                "prob = tl.maximum(target_prob - draft_prob, 0.0)"),
        test="tests/vllm/test_greedy_verify.py, tests/unit/test_sampled_verify.py"),
    Contract(
        "vllm.v1.sample.metadata:SamplingMetadata", "class", "integration/greedy_verify.py",
        "read: which batches the one-pass greedy verification may take",
        "these fields describe everything the rejection sampler's greedy path applies to the logits",
        attrs=("all_greedy", "max_num_logprobs", "logprob_token_ids", "no_penalties", "allowed_token_ids_mask",
               "bad_words_token_ids", "logitsprocs", "thinking_budget_state_holder"),
        test="tests/vllm/test_greedy_verify.py"),
    Contract(
        "vllm.v1.spec_decode.metadata:SpecDecodeMetadata", "class", "integration/greedy_verify.py",
        "read: draft tokens, drafts per request, the target and bonus logits rows",
        "`target_logits_indices` [N] and `bonus_logits_indices` [B] index the logits rows, request-major; "
        "`draft_token_ids` [N]; `num_draft_tokens` list of B ints; `max_spec_len`",
        attrs=("draft_token_ids", "num_draft_tokens", "target_logits_indices", "bonus_logits_indices",
               "max_spec_len"),
        test="tests/vllm/test_greedy_verify.py"),
    Contract(
        "vllm.utils.cpu_triton_utils:_expand_kernel_impl", "function", "integration/patches/cpu_expand_kernel.py, "
        "integration/cpu_sampling.py",
        "replaced with a per-call switch: `cpu_sampling.expand_kernel_impl` inside the rejection sampler of an "
        "engine the fix acts for, vLLM's own kernel anywhere else",
        "`CpuPlatform.register_triton_kernel_overrides` reads this attribute when the worker initialises (after "
        "general plugins load) and binds it to `vllm.v1.sample.rejection_sampler.expand_kernel`, once per process",
        params=("output", "input_val", "cu_num_tokens", "replace_from", "replace_to", "MAX_NUM_TOKENS"), exact=True,
        patch="cpu_expand_kernel",
        test="tests/vllm/test_seam.py::test_expand_kernel_patch_still_needed, tests/vllm/test_vllm_sampling.py"),
    Contract(
        "vllm.v1.sample.rejection_sampler:RejectionSampler", "class", "integration/patches/cpu_expand_kernel.py",
        "`__init__` wrapped (records whether its engine gets the expand-kernel fix), `forward` wrapped (the kernel "
        "acts as in that engine for the duration of the call)",
        "built by the model runner while the engine's config is current; every expand-kernel launch of a "
        "verification happens inside `forward`",
        methods=(Sig("__init__", ("sampler", "spec_config", "device")),
                 Sig("forward", ("metadata", "draft_probs", "logits", "sampling_metadata"), exact=True)),
        test="tests/vllm/test_walls_one_process.py"),
)
