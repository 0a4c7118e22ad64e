# SPDX-License-Identifier: Apache-2.0
"""Run offline vLLM generations in one fresh process; print one JSON result line per run.

Usage: python tests/support/vllm_run.py RUNS.json (or an inline JSON list). A run: model, prompts (token-id lists or
strings), max_tokens, optional speculative_config, env (set before the LLM is built), sampling
overrides (sampling_list: one dict per prompt), llm_kwargs, lora (an adapter folder every request uses; lora_list: one
flag per prompt, which requests use it), salt_list (one cache_salt per token-id prompt, None: unsalted), expect_error
(the LLM build must fail; its error is returned), generate_error (an error in generate is returned, not raised), patch
(code run before the LLM is built), after (code run after the generations with `llm` and a `probe` dict whose entries
are returned).
vLLM's import costs ~15 s on 2 cores, so the tests put every configuration of a file into one process."""
import gc
import json
import os
import sys
import traceback


def run_one(spec: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    os.environ.update(spec.get("env", {}))
    if spec.get("patch"):  # fault injection for negative controls (test-only)
        exec(spec["patch"], {})
    # float32 by default: greedy equality is a float32 promise (bf16 CPU GEMMs are not batch-invariant, so a bf16
    # target can flip a near-tied token with or without speculation); tests of the bf16 path set llm_kwargs.dtype
    kwargs = dict(model=spec["model"], dtype="float32", enforce_eager=True, max_model_len=spec.get("max_model_len", 1024),
                  kv_cache_memory_bytes=spec.get("kv_bytes", 64 << 20), seed=0, max_num_seqs=spec.get("max_num_seqs", 16),
                  disable_log_stats=False)
    if spec.get("speculative_config"):
        kwargs["speculative_config"] = spec["speculative_config"]
    kwargs.update(spec.get("llm_kwargs", {}))
    try:
        llm = LLM(**kwargs)
    except Exception as e:  # noqa: BLE001 - reported to the test
        if spec.get("expect_error"):
            return {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        raise
    if spec.get("expect_error"):
        return {"error": None}
    sp_args = dict(temperature=0.0, max_tokens=spec.get("max_tokens", 32), ignore_eos=spec.get("ignore_eos", True))
    sp_args.update(spec.get("sampling", {}))
    prompts = [TokensPrompt(prompt_token_ids=p) if isinstance(p, list) else p for p in spec["prompts"]]
    if spec.get("salt_list") is not None:  # per prompt: its cache_salt (None: unsalted); token-id prompts only
        prompts = [TokensPrompt(prompt_token_ids=p["prompt_token_ids"], **({} if s is None else {"cache_salt": s}))
                   for p, s in zip(prompts, spec["salt_list"], strict=True)]
    if spec.get("sampling_list") is not None:  # per prompt: overrides of the sampling (mixed batches)
        seed = spec.get("per_prompt_seed")
        sps = [SamplingParams(**{**sp_args, **o}, **({} if seed is None else {"seed": seed + i}))
               for i, o in enumerate(spec["sampling_list"])]
    elif spec.get("per_prompt_seed") is not None:
        sps = [SamplingParams(**sp_args, seed=spec["per_prompt_seed"] + i) for i in range(len(prompts))]
    else:
        sps = SamplingParams(**sp_args)
    lora = None
    if spec.get("lora"):  # a LoRA adapter folder: every request goes through it (llm_kwargs must enable LoRA)
        from vllm.lora.request import LoRARequest

        lora = LoRARequest("test-lora", 1, spec["lora"])
        if spec.get("lora_list") is not None:
            lora = [lora if use else None for use in spec["lora_list"]]
    try:
        outs = llm.generate(prompts, sps, use_tqdm=False, lora_request=lora)
    except Exception as e:  # noqa: BLE001 - reported to the test
        if not spec.get("generate_error"):
            raise
        return {"generate_error": f"{type(e).__name__}: {e}"}
    first = _spec_counters(llm)
    reps = []  # optional repeats in the same engine (warm prefix cache): tokens and spec counters per repeat
    for _ in range(spec.get("repeat", 0)):
        if spec.get("before_repeat"):  # fault injection for negative controls (test-only), `llm` in scope
            exec(spec["before_repeat"], {"llm": llm})
        before = _spec_counters(llm)
        again = llm.generate(prompts, sps, use_tqdm=False, lora_request=lora)
        after = _spec_counters(llm)
        reps.append({"tokens": [list(o.outputs[0].token_ids) for o in again],
                     "counters": {k: after[k] - before.get(k, 0.0) for k in after},
                     "cached_tokens": [o.num_cached_tokens for o in again]})
    probe = {}  # test-only inspection of the engine after the runs (`llm`, `probe` in scope; JSON-able values)
    if spec.get("after"):
        exec(spec["after"], {"llm": llm, "probe": probe})
    metrics = {}
    for m in llm.get_metrics():
        if m.name.startswith(("vllm:spec_decode", "vllm:dflash")):
            metrics[m.name] = list(m.values) if hasattr(m, "values") else getattr(m, "value", None)
    res = {"async_scheduling": bool(llm.llm_engine.vllm_config.scheduler_config.async_scheduling),
           "tokens": [list(o.outputs[0].token_ids) for o in outs], "texts": [o.outputs[0].text for o in outs],
           "finish": [o.outputs[0].finish_reason for o in outs], "metrics": metrics, "repeats": reps, "first_counters": first,
           "cached_tokens": [o.num_cached_tokens for o in outs], "probe": probe}
    if sp_args.get("logprobs"):  # per generated token: {token id: logprob} of the top `logprobs` (+ the chosen one)
        res["logprobs"] = [[{str(t): lp.logprob for t, lp in step.items()} for step in o.outputs[0].logprobs or []]
                           for o in outs]
    if any(o.prompt_logprobs for o in outs):  # per prompt position: {token id: logprob} (None: the first position)
        res["prompt_logprobs"] = [[None if pos is None else {str(t): lp.logprob for t, lp in pos.items()}
                                   for pos in o.prompt_logprobs or []] for o in outs]
    res["generate_error"] = None
    for k in spec.get("env", {}):
        os.environ.pop(k, None)
    del llm
    gc.collect()
    return res


def _spec_counters(llm) -> dict:
    out = {}
    for m in llm.get_metrics():
        if m.name in ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens"):
            out[m.name] = float(getattr(m, "value", 0) or 0)
    return out


def main() -> None:
    arg = sys.argv[1]
    runs = json.loads(open(arg).read() if os.path.isfile(arg) else arg)
    for spec in runs:
        print("RESULT " + json.dumps(run_one(spec)), flush=True)


if __name__ == "__main__":
    main()
