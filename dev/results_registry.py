# SPDX-License-Identifier: Apache-2.0
"""The result files docs/BENCHMARKS.md and dev/BENCHMARKS-history.md are built from, and the facts about them the
files do not record: the machine kind each ran on, commands and dates missing from older files, which result is the
latest of its kind, the order of the sections and their titles.

Adding a result: put its JSON (and markdown, plots) in benchmarks/results/, then give it a PROVENANCE entry, a place
in ORDER and, for a serving run, a title in SERVING_TITLES (a non-serving JSON needs an entry in MD_SECTIONS or a
renderer in dev/make_bench_docs.py). If it replaces the latest of its kind, put it in LATEST in place of the old one
and move the old one's files to dev/results/ (`gzip -9 -n` its JSON). `python dev/make_bench_docs.py` renders; this
module holds no logic."""
from __future__ import annotations

# The two machine kinds the results were measured on. `cpu` must occur in the CPU name a JSON records (checked).
MACHINES = {
    "epyc-avx2": {"cpu": "AMD EPYC",
                  "kind": "2-core AMD EPYC, AVX2 only (no AVX-512, no bf16), 24 GiB, no GPU"},
    "xeon-bf16": {"cpu": "Xeon",
                  "kind": "2-core Intel Xeon with avx512_bf16 and amx_bf16, 24 GiB, no GPU"},
    "epyc-bf16": {"cpu": "AMD EPYC",
                  "kind": "2-core AMD EPYC with avx512_bf16 (no AMX), 24 GiB, no GPU"},
}

# Facts a result file does not record itself: which machine (kind) it ran on, and for the files that do not
# store their command line, the command. Taken from the commit that added each file and the project's log.
PROVENANCE: dict[str, dict[str, str]] = {
    "bench_merged": {"machine": "xeon-bf16"},
    "bench_serving": {"machine": "epyc-avx2"},
    "bench_adaptive_overlap": {"machine": "epyc-avx2"},
    "bench_serving_quick": {"machine": "epyc-avx2"},
    "eval_humaneval164": {"machine": "epyc-avx2", "date": "2026-11-29"},
    "eval_humaneval164_v3": {"machine": "xeon-bf16", "date": "2026-11-30"},
    "eval_humaneval164_v4": {"machine": "epyc-avx2", "date": "2026-12-04"},
    "eval_humaneval164_v3_avx2": {"machine": "epyc-avx2", "date": "2026-12-04"},
    "eval_chat_v4": {"machine": "epyc-avx2", "date": "2026-12-04"},
    "eval_chat_v3_avx2": {"machine": "epyc-avx2", "date": "2026-12-04"},
    "bench_v3": {"machine": "xeon-bf16"},
    "bench_v6": {"machine": "xeon-bf16"},
    "bench_v7": {"machine": "xeon-bf16"},
    "bench_v9": {"machine": "xeon-bf16"},
    "bench_v10": {"machine": "xeon-bf16"},
    "bench_v14": {"machine": "xeon-bf16"},
    "bench_v15": {"machine": "xeon-bf16"},
    "bench_v16": {"machine": "xeon-bf16"},
    "bench_v17_epyc": {"machine": "epyc-bf16"},
    "bench_v18": {"machine": "xeon-bf16"},
    "bench_v19_layout": {"machine": "xeon-bf16"},
    "bench_v19": {"machine": "xeon-bf16"},
    "bench_v20_c8c32": {"machine": "xeon-bf16"},
    "bench_v20_c1": {"machine": "xeon-bf16"},
    "bench_v21_c32": {"machine": "xeon-bf16"},
    "bench_v22": {"machine": "xeon-bf16"},
    "bench_v23": {"machine": "xeon-bf16"},
    "bench_v24": {"machine": "xeon-bf16"},
    "bench_v24_c32": {"machine": "xeon-bf16"},
    "ab_cache": {"machine": "xeon-bf16"},
    "bench_v25": {"machine": "xeon-bf16"},
    "bench_v26_avx2": {"machine": "epyc-avx2"},
    "bench_v28_avx2": {"machine": "epyc-avx2"},
    "waves_c32_avx2": {"machine": "epyc-avx2"},
    "bench_v29_avx2": {"machine": "epyc-avx2"},
    "bench_v30_avx2": {"machine": "epyc-avx2"},
    "ab_c32_he_avx2": {"machine": "epyc-avx2"},
    "bench_v31_avx2": {"machine": "epyc-avx2"},
    "bench_v32_avx2": {"machine": "epyc-avx2"},
    "bench_v33_avx2": {"machine": "epyc-avx2"},
    "ab_gemm_prefetch_avx2": {"machine": "epyc-avx2"},
    "step_ops_avx2": {"machine": "epyc-avx2"},
    "ab_argmax_slots_avx2": {"machine": "epyc-avx2"},
    "bench_v34_avx2": {"machine": "epyc-avx2"},
    "bench_v38_xeon_stock": {"machine": "xeon-bf16"},
    "bench_v40_xeon_open_t0": {"machine": "xeon-bf16"},
    "bench_v41_xeon_cross": {"machine": "xeon-bf16"},
    "bench_v41_xeon_cross2": {"machine": "xeon-bf16"},
    "bench_v41_xeon_open_t07": {"machine": "xeon-bf16"},
    "bench_v41_xeon_open_categories": {"machine": "xeon-bf16"},
    "bench_v40_xeon_open_t10": {"machine": "xeon-bf16"},
    "bench_v40_xeon_open_t07_c32": {"machine": "xeon-bf16"},
    "bench_v48_epyc_bf16_open_t0": {"machine": "epyc-bf16"},
    "bench_v48_epyc_bf16_open_t07": {"machine": "epyc-bf16"},
    "ab_v48_epyc_bf16_twins_c8_t07": {"machine": "epyc-bf16"},
    "ab_v48_epyc_bf16_pinoff_c32_t0": {"machine": "epyc-bf16"},
    "ab_v48_epyc_bf16_pinoff_c32_t0_r12": {"machine": "epyc-bf16"},
    "ab_v49_epyc_bf16_traced_c32_t0_r12": {"machine": "epyc-bf16"},
    "bench_v50_epyc_bf16_open_t10": {"machine": "epyc-bf16"},
    "ab_v50_epyc_bf16_host_c32_t0_r12": {"machine": "epyc-bf16"},
    "ab_v51_epyc_bf16_twins_c8_t07_r12": {"machine": "epyc-bf16"},
    "ab_v51_epyc_bf16_lazy_c8_t07_r12": {"machine": "epyc-bf16"},
    "ab_v51_epyc_bf16_hold_c8_t07_r12": {"machine": "epyc-bf16"},
    "ab_v50_epyc_bf16_host_c8_t07_r12": {"machine": "epyc-bf16"},
    "bench_v50_epyc_bf16_humaneval_t0": {"machine": "epyc-bf16"},
    "bench_v50_epyc_bf16_humaneval_t0_c32": {"machine": "epyc-bf16"},
    "ab_v49_epyc_bf16_drain_c32_t0_r12": {"machine": "epyc-bf16"},
    "bench_v47_epyc_bf16_open_t0_c32": {"machine": "epyc-bf16"},
    "bench_v47_epyc_bf16_open_t07_c1c32": {"machine": "epyc-bf16"},
    "bench_v47_epyc_bf16_open_t0": {"machine": "epyc-bf16"},
    "bench_v47_epyc_bf16_open_t07": {"machine": "epyc-bf16"},
    "bench_v47_epyc_bf16_math_t0": {"machine": "epyc-bf16"},
    "ab_v47_epyc_bf16_pinoff_c8_t07": {"machine": "epyc-bf16"},
    "bench_v46_epyc_bf16_c8": {"machine": "epyc-bf16"},
    "cost_model_epyc_bf16": {"machine": "epyc-bf16"},
    "bench_v45_avx2_c8_fixed": {"machine": "epyc-avx2"},
    "bench_v43_avx2_open_t0": {"machine": "epyc-avx2"},
    "bench_v43_avx2_open_t07": {"machine": "epyc-avx2"},
    "bench_v43_avx2_open_t10": {"machine": "epyc-avx2"},
    "bench_v43_avx2_stock": {"machine": "epyc-avx2"},
    "ab_v43_avx2_idle_spec_t07": {"machine": "epyc-avx2"},
    "bench_v38_xeon_stock_t07": {"machine": "xeon-bf16"},
    "ab_merged_he_c8_avx2": {"machine": "epyc-avx2"},
    "ab_guard_margin": {"machine": "epyc-avx2"},
    "bench_v27_avx2": {"machine": "epyc-avx2"},
    "bench_v27_avx2_c32": {"machine": "epyc-avx2"},
    "ab_gemm_f32": {"machine": "epyc-avx2"},
    "ab_guard_threshold": {"machine": "epyc-avx2"},
    "gemm_f32": {"machine": "epyc-avx2", "command": "python dev/studies/gemm_f32.py"},
    "bench_v25_c32": {"machine": "xeon-bf16"},
    "bench_v23_c32": {"machine": "xeon-bf16"},
    "bench_v22_c32": {"machine": "xeon-bf16"},
    "bench_v18_c32": {"machine": "xeon-bf16"},
    "bench_v18_c8": {"machine": "xeon-bf16"},
    "bench_v17_epyc_c32": {"machine": "epyc-bf16"},
    "bench_v16_c8": {"machine": "xeon-bf16"},
    "bench_v15_c32": {"machine": "xeon-bf16"},
    "bench_v15_overlap_c1": {"machine": "xeon-bf16"},
    "merged_c32_recheck": {"machine": "xeon-bf16"},
    "bench_v13": {"machine": "xeon-bf16"},
    "bench_v12": {"machine": "xeon-bf16"},
    "bench_v12_c32": {"machine": "xeon-bf16"},
    "bench_v11": {"machine": "xeon-bf16"},
    "bench_v11_c32": {"machine": "xeon-bf16"},
    "bench_v8": {"machine": "xeon-bf16"},
    "bench_v8_c32": {"machine": "xeon-bf16"},
    "spec_overhead_c32": {"machine": "xeon-bf16"},
    "bench_v6_c8c32": {"machine": "xeon-bf16"},
    "gemv_vllm": {"machine": "xeon-bf16"},
    "hinted_vllm": {"machine": "xeon-bf16"},
    "gemv": {"machine": "epyc-bf16"},
    "gemv_ab_off": {"machine": "xeon-bf16"},
    "gemv_ab_auto": {"machine": "xeon-bf16"},
    "bench_v5": {"machine": "epyc-bf16"},
    "bench_v4": {"machine": "epyc-bf16"},
    "step_cost": {"machine": "epyc-bf16"},
    "kv_injection": {"machine": "epyc-avx2", "date": "2026-11-29",
                     "command": "python benchmarks/bench_kv_injection.py --clock cpu --serving"},
    "draft_depth": {"machine": "epyc-avx2", "date": "2026-11-29"},
    "profile_train_step": {"machine": "epyc-avx2", "date": "2026-11-29",
                           "command": "python benchmarks/profile_train_step.py --threads 1 "
                                      "--out benchmarks/results/profile_train_step.json"},
    "soak": {"machine": "epyc-avx2"},
    "train_throughput_xeon": {"machine": "xeon-bf16"},
    "planner_cost": {"machine": "xeon-bf16"},
    "step_ops": {"machine": "xeon-bf16"},
}

# The latest result of each kind: docs/BENCHMARKS.md shows these (in this order, under these titles); every result,
# these included, is in dev/BENCHMARKS-history.md. "soak" stands for every soak*.json file.
LATEST: dict[str, str] = {
    "bench_v47_epyc_bf16_open_t0": ("Open-ended chat against stock vLLM and `none+extras`, AMD EPYC with "
                                    "avx512_bf16 (bf16), greedy, concurrency 1 / 8 / 32"),
    "ab_v48_epyc_bf16_pinoff_c32_t0_r12": ("Open-ended chat against stock vLLM and `none+extras`, AMD EPYC with "
                                           "avx512_bf16 (bf16), greedy, concurrency 32 in twelve rounds, with "
                                           "speculation pinned off"),
    "bench_v47_epyc_bf16_open_t07": ("Open-ended chat against stock vLLM and `none+extras`, AMD EPYC with "
                                     "avx512_bf16 (bf16), temperature 0.7, concurrency 1 / 8 / 32"),
    "bench_v47_epyc_bf16_open_t07_c1c32": ("Open-ended chat against stock vLLM and `none+extras`, AMD EPYC with "
                                           "avx512_bf16 (bf16), temperature 0.7, concurrency 1 / 32 in three rounds"),
    "bench_v47_epyc_bf16_math_t0": ("Math word problems against stock vLLM and `none+extras`, AMD EPYC with "
                                    "avx512_bf16 (bf16), greedy, concurrency 1 / 8 / 32"),
    "bench_v45_avx2_c8_fixed": ("The fixed DFlash block against our default and stock vLLM, AMD EPYC with AVX2 only "
                                "(float32), open-ended chat and math, greedy, concurrency 8"),
    "bench_v43_avx2_open_t07": "Open-ended chat against stock vLLM, AMD EPYC with AVX2 only (float32), temperature "
                               "0.7, concurrency 1 / 8 / 32",
    "bench_v43_avx2_open_t10": "Open-ended chat against stock vLLM, AMD EPYC with AVX2 only (float32), temperature "
                               "1.0, concurrency 8 / 32",
    "bench_v43_avx2_stock": "Serving against stock vLLM, AMD EPYC with AVX2 only (float32), HumanEval and chat, greedy, "
                            "concurrency 1 / 8",
    "bench_v41_xeon_open_categories": "Open-ended chat per category against stock vLLM, Intel Xeon (bf16), greedy, "
                                      "concurrency 1, 90 prompts",
    "bench_v41_xeon_open_t07": "Open-ended chat against stock vLLM, Intel Xeon (bf16), temperature 0.7, concurrency "
                               "1 / 8",
    "bench_v40_xeon_open_t10": "Open-ended chat against stock vLLM, Intel Xeon (bf16), temperature 1.0, concurrency "
                               "1 / 8 / 32",
    "bench_v40_xeon_open_t07_c32": "Open-ended chat against stock vLLM, Intel Xeon (bf16), temperature 0.7, "
                                   "concurrency 32",
    "bench_v38_xeon_stock": "Serving against stock vLLM, Intel Xeon (bf16), HumanEval and open-ended chat, greedy, "
                            "concurrency 1 / 8",
    "bench_serving": "Serving against vLLM's own DFlash drafter on the same checkpoint (eager float32, older code)",
    "eval_humaneval164_v4": "Acceptance through vLLM: HumanEval, all 164 prompts (bundled draft version 4)",
    "eval_chat_v4": "Acceptance through vLLM: held-out chat, 102 prompts (bundled draft version 4)",
    "kv_injection": "Fused KV injection (csrc/ CPU kernel) against the PyTorch path and vLLM's own",
    "train_throughput_xeon": "Training throughput on both cores (anchor-blocks/s)",
    "profile_train_step": "Training step cost by phase",
    "soak": "Soak test (serving under load, faults and bad input)",
}

# Latest results whose open-chat per-category table is shown in docs/BENCHMARKS.md too (runs sized for it: many
# prompts at concurrency 1); the history shows it for every run that has one.
CATEGORY_TABLES = {"bench_v41_xeon_open_categories"}

# Order of the sections in the history; result files not listed here are appended in name order (serving JSON only).
ORDER = ["ab_v51_epyc_bf16_twins_c8_t07_r12", "ab_v51_epyc_bf16_hold_c8_t07_r12", "ab_v51_epyc_bf16_lazy_c8_t07_r12", "bench_v50_epyc_bf16_humaneval_t0_c32", "bench_v50_epyc_bf16_humaneval_t0", "ab_v50_epyc_bf16_host_c8_t07_r12", "ab_v50_epyc_bf16_host_c32_t0_r12", "bench_v50_epyc_bf16_open_t10", "ab_v49_epyc_bf16_drain_c32_t0_r12", "ab_v49_epyc_bf16_traced_c32_t0_r12", "ab_v48_epyc_bf16_twins_c8_t07", "bench_v48_epyc_bf16_open_t07", "ab_v48_epyc_bf16_pinoff_c32_t0_r12", "ab_v48_epyc_bf16_pinoff_c32_t0", "bench_v48_epyc_bf16_open_t0", "bench_v47_epyc_bf16_open_t0", "bench_v47_epyc_bf16_open_t0_c32", "bench_v47_epyc_bf16_open_t07", "bench_v47_epyc_bf16_open_t07_c1c32", "bench_v47_epyc_bf16_math_t0", "ab_v47_epyc_bf16_pinoff_c8_t07", "bench_v46_epyc_bf16_c8", "cost_model_epyc_bf16", "bench_v45_avx2_c8_fixed", "ab_v43_avx2_idle_spec_t07", "bench_v43_avx2_stock", "bench_v43_avx2_open_t10", "bench_v43_avx2_open_t07", "bench_v43_avx2_open_t0", "bench_v41_xeon_open_categories", "bench_v41_xeon_open_t07", "bench_v41_xeon_cross2", "bench_v41_xeon_cross", "bench_v40_xeon_open_t07_c32", "bench_v40_xeon_open_t10", "bench_v40_xeon_open_t0", "bench_v38_xeon_stock_t07", "bench_v38_xeon_stock", "ab_gemm_prefetch_avx2", "step_ops_avx2", "ab_merged_he_c8_avx2", "bench_v34_avx2", "ab_argmax_slots_avx2", "bench_v33_avx2", "bench_v32_avx2", "bench_v31_avx2", "ab_c32_he_avx2", "bench_v30_avx2", "bench_v29_avx2", "waves_c32_avx2", "ab_guard_margin", "bench_v28_avx2", "eval_humaneval164_v4", "eval_humaneval164_v3_avx2", "eval_chat_v4", "eval_chat_v3_avx2", "ab_guard_threshold", "bench_v27_avx2_c32", "bench_v27_avx2", "ab_gemm_f32", "gemm_f32", "bench_v26_avx2", "bench_v25_c32", "bench_v25", "ab_cache", "bench_v24_c32", "bench_v24", "bench_v23_c32", "bench_v23", "bench_v22_c32", "bench_v22", "bench_v21_c32", "bench_v20_c1", "bench_v20_c8c32", "bench_v19", "bench_v19_layout", "bench_v18_c8", "bench_v18_c32", "bench_v18", "bench_v17_epyc_c32", "bench_v17_epyc", "bench_v16_c8", "bench_v16", "bench_v15_overlap_c1", "bench_v15_c32", "bench_v15", "step_ops", "bench_v14", "merged_c32_recheck", "bench_v13", "bench_v12_c32", "bench_v12", "bench_v11_c32", "bench_v11", "bench_v10", "bench_v9", "bench_v8", "bench_v8_c32", "spec_overhead_c32", "bench_v7", "bench_v6", "bench_v6_c8c32", "hinted_vllm", "bench_v5", "bench_v4", "step_cost", "bench_v3", "bench_merged", "bench_serving", "bench_adaptive_overlap", "eval_humaneval164_v3",
         "eval_humaneval164", "kv_injection",
         "draft_depth", "train_throughput_xeon", "planner_cost", "profile_train_step", "gemv_vllm", "gemv_ab_off", "gemv_ab_auto", "gemv", "soak", "bench_serving_quick"]

# Section titles of the serving benchmarks (others: "Serving benchmark <stem>").
SERVING_TITLES: dict[str, str] = {
    "ab_v51_epyc_bf16_twins_c8_t07_r12": ("Two server processes per configuration (`NAME#p2`; pooled by "
                                          "`benchmarks/pooled.py`: ours / none+extras 0.958, rounds 0.90-1.04; twin "
                                          "against twin 1.04 for none+extras, 1.04 for ours): open chat, T 0.7, c8, "
                                          "192 prompts in twelve interleaved rounds, AMD EPYC with avx512_bf16 (no "
                                          "AMX), bf16"),
    "ab_v51_epyc_bf16_lazy_c8_t07_r12": ("vLLM's padded drafter inputs computed on first read (session 51) against "
                                         "session 50's code (`ours#s50`, its package on PYTHONPATH): open chat, "
                                         "T 0.7, c8, 192 prompts in twelve interleaved rounds, both traced, AMD EPYC "
                                         "with avx512_bf16 (no AMX), bf16"),
    "ab_v51_epyc_bf16_hold_c8_t07_r12": ("A study, not kept: `ours#hold` never drops a step's context rows where "
                                         "'off' won (a one-line change on PYTHONPATH) against our default: open "
                                         "chat, T 0.7, c8, 192 prompts in twelve interleaved rounds, both traced, "
                                         "AMD EPYC with avx512_bf16 (no AMX), bf16"),
    "bench_v50_epyc_bf16_humaneval_t0_c32": ("HumanEval, greedy, concurrency 32, 150 prompts in three interleaved "
                                             "rounds on a quiet machine (the run below was disturbed at this level), "
                                             "our default with session 50's changes (and a CPU override of "
                                             "`prepare_next_token_ids_padded` tried then, reverted: no measurable "
                                             "effect) against stock vLLM and `none+extras`, AMD EPYC with "
                                             "avx512_bf16 (no AMX), bf16"),
    "bench_v50_epyc_bf16_humaneval_t0": ("HumanEval, greedy, concurrency 1 / 8 / 32 in three interleaved rounds, our "
                                         "default (session 50, idle plans) against stock vLLM and `none+extras`, "
                                         "AMD EPYC with avx512_bf16 (no AMX), bf16. The c32 level is not valid: "
                                         "tests ran on the machine during it (see the re-run above)"),
    "ab_v50_epyc_bf16_host_c8_t07_r12": ("The same A/B at temperature 0.7: open chat, c8, 192 prompts in twelve "
                                         "interleaved rounds, session 50's code against session 49's (`ours#s49`), "
                                         "both traced, AMD EPYC with avx512_bf16 (no AMX), bf16"),
    "ab_v50_epyc_bf16_host_c32_t0_r12": ("Session 50's host-work cuts (a step that plans nothing copies no history, "
                                         "idle plans back off) against the code of session 49 (`ours#s49`, its "
                                         "package on PYTHONPATH): open chat, greedy, c32, 384 prompts in twelve "
                                         "interleaved rounds, both traced, AMD EPYC with avx512_bf16 (no AMX), bf16"),
    "bench_v50_epyc_bf16_open_t10": ("Open-ended chat at temperature 1.0, concurrency 1 / 8 / 32 in three "
                                     "interleaved rounds, our default (after the first of session 50's host-work "
                                     "cuts) against stock vLLM and `none+extras`, traced, AMD EPYC with avx512_bf16 "
                                     "(no AMX), bf16"),
    "ab_v49_epyc_bf16_traced_c32_t0_r12": ("Where the speculative engine loses at concurrency 32: open chat, greedy, "
                                           "384 prompts in twelve interleaved rounds (one wave of 32 each), our "
                                           "default and `ours#off` (dev/pinoff) both traced (DFLASH_TRACE), AMD "
                                           "EPYC with avx512_bf16 (no AMX), bf16"),
    "ab_v49_epyc_bf16_drain_c32_t0_r12": ("A drain valuation tried and not kept: open chat, greedy, c32 in twelve "
                                          "rounds; `ours` valued each request's tokens by the round time they "
                                          "save when finished requests were not replaced (dev/studies/"
                                          "drain_valuation.md), `ours#nodrain` is the code kept; AMD EPYC with "
                                          "avx512_bf16 (no AMX), bf16"),
    "ab_v48_epyc_bf16_pinoff_c32_t0_r12": ("What the speculative engine costs at concurrency 32: open chat, greedy, "
                                           "384 prompts in twelve interleaved rounds, our default against "
                                           "`ours#off` (every adaptive guard pinned to 'off' by dev/pinoff on "
                                           "PYTHONPATH), `none+extras` and stock vLLM, context rows dropped with "
                                           "prefix caching on (session 48), AMD EPYC with avx512_bf16 (no AMX), bf16"),
    "ab_v48_epyc_bf16_pinoff_c32_t0": ("The same A/B in three rounds of 64 prompts (session 48), AMD EPYC with "
                                       "avx512_bf16 (no AMX), bf16"),
    "ab_v48_epyc_bf16_twins_c8_t07": ("How far two servers of one configuration differ, and what the engine costs "
                                      "where it drafts nothing: open chat at temperature 0.7, c8, 192 prompts in "
                                      "twelve interleaved rounds, `none+extras` twice (`none+extras#b`), `ours#off` "
                                      "and stock vLLM (session 48), AMD EPYC with avx512_bf16 (no AMX), bf16"),
    "bench_v48_epyc_bf16_open_t07": ("Open-ended chat at temperature 0.7, concurrency 8 / 32 in three interleaved "
                                     "rounds, our default (context rows dropped with prefix caching on) against "
                                     "stock vLLM and `none+extras` (session 48), AMD EPYC with avx512_bf16 (no AMX), "
                                     "bf16"),
    "bench_v48_epyc_bf16_open_t0": ("Open-ended chat, greedy, concurrency 8 / 32 in three interleaved rounds, our "
                                    "default (context rows dropped with prefix caching on) against stock vLLM and "
                                    "`none+extras` (session 48), AMD EPYC with avx512_bf16 (no AMX), bf16"),
    "bench_v47_epyc_bf16_open_t0_c32": ("Open-ended chat, greedy, concurrency 32, 192 prompts in three interleaved "
                                        "rounds, our default against stock vLLM and `none+extras` (session 47), AMD "
                                        "EPYC with avx512_bf16 (no AMX), bf16"),
    "bench_v47_epyc_bf16_open_t07_c1c32": ("Open-ended chat at temperature 0.7, concurrency 1 and 32 in three "
                                           "interleaved rounds (24 and 192 prompts), our default against stock vLLM "
                                           "and `none+extras` (session 47), AMD EPYC with avx512_bf16 (no AMX), bf16"),
    "bench_v47_epyc_bf16_open_t0": ("Open-ended chat, greedy, concurrency 1 / 8 / 32, our default against stock vLLM "
                                    "and stock vLLM with the plugin's CPU speed-ups alone (`none+extras`) (session "
                                    "47), AMD EPYC with avx512_bf16 (no AMX), bf16; c32 one round of 96 prompts"),
    "bench_v47_epyc_bf16_open_t07": ("Open-ended chat at temperature 0.7, concurrency 1 / 8 / 32, our default against "
                                     "stock vLLM and `none+extras` (session 47), AMD EPYC with avx512_bf16 (no AMX), "
                                     "bf16; c32 one round of 96 prompts"),
    "bench_v47_epyc_bf16_math_t0": ("Math word problems, greedy, concurrency 1 / 8 / 32, our default against stock "
                                    "vLLM and `none+extras` (session 47), AMD EPYC with avx512_bf16 (no AMX), bf16; "
                                    "c32 one round of 96 prompts"),
    "ab_v47_epyc_bf16_pinoff_c8_t07": ("What the speculative engine costs where it drafts nothing: open chat at "
                                       "temperature 0.7, c8, our default against `ours#off` (our default with every "
                                       "adaptive guard pinned to 'off' by a sitecustomize on PYTHONPATH: nothing "
                                       "drafted or planned), `none+extras` and stock vLLM (session 47), AMD EPYC "
                                       "with avx512_bf16 (no AMX), bf16"),
    "bench_v46_epyc_bf16_c8": ("Open-ended chat, greedy, concurrency 8 in three interleaved rounds, our default "
                               "against stock vLLM and `none+extras` (session 46), AMD EPYC with avx512_bf16 (no "
                               "AMX), bf16"),
    "bench_v45_avx2_c8_fixed": ("Open-ended chat and math word problems at concurrency 8, greedy: the fixed DFlash "
                                "block (`ours-fixed`) against our default and stock vLLM (session 45), AMD EPYC "
                                "with AVX2 only (a slower host: 19.5 GB/s, 134 GFLOP/s), float32"),
    "ab_v43_avx2_idle_spec_t07": ("What speculation costs where it drafts nothing: open chat at temperature 0.7, c8 / "
                                  "c32, our default against stock vLLM with the plugin's CPU speed-ups alone "
                                  "(`none+extras`) and stock (session 43), AMD EPYC with AVX2 only, float32"),
    "bench_v43_avx2_open_t0": ("Open-ended chat and math word problems, greedy, concurrency 1 / 8, against stock vLLM "
                               "(session 43), AMD EPYC with AVX2 only, float32"),
    "bench_v43_avx2_open_t07": ("Open-ended chat at temperature 0.7, concurrency 1 / 8 / 32, against stock vLLM "
                                "(session 43), AMD EPYC with AVX2 only, float32"),
    "bench_v43_avx2_open_t10": ("Open-ended chat at temperature 1.0, concurrency 8 / 32 in four interleaved rounds, "
                                "against stock vLLM (session 43), AMD EPYC with AVX2 only, float32"),
    "bench_v43_avx2_stock": ("HumanEval and the copy-heavy chat set, greedy, concurrency 1 / 8, against stock vLLM and "
                             "stock vLLM with the plugin's CPU speed-ups alone (`none+extras`) (session 43), AMD EPYC "
                             "with AVX2 only, float32"),
    "bench_v41_xeon_open_categories": ("Open-ended chat per category, greedy, concurrency 1, 90 held-out prompts "
                                       "(session 41), Xeon with AMX, bf16: none, n-gram and our default"),
    "bench_v41_xeon_open_t07": ("Open-ended chat at temperature 0.7, concurrency 1 / 8, against stock vLLM (session "
                                "41, cross-request lookup on), Xeon with AMX, bf16"),
    "bench_v41_xeon_cross2": ("Cross-request lookup on (the default) and off (`ours-no-cross`) with its own acceptance "
                              "record, open chat and math word problems, greedy, concurrency 1 / 8 (session 41), "
                              "Xeon with AMX, bf16"),
    "bench_v41_xeon_cross": ("Cross-request lookup sharing prompt lookup's acceptance record (superseded by "
                             "`bench_v41_xeon_cross2`): open chat and math, greedy, concurrency 1 / 8 (session 41), "
                             "Xeon with AMX, bf16"),
    "bench_v40_xeon_open_t0": ("Open-ended chat, greedy, concurrency 1 / 8 / 32 against stock vLLM (session 40), Xeon "
                               "with AMX, bf16: our default then (re-exploration off) and `ours-reexplore` "
                               "(reexplore_steps 32, the default since)"),
    "bench_v40_xeon_open_t10": ("Open-ended chat at temperature 1.0, concurrency 1 / 8 / 32, against stock vLLM "
                                "(session 40), Xeon with AMX, bf16"),
    "bench_v40_xeon_open_t07_c32": ("Open-ended chat at temperature 0.7, concurrency 32, against stock vLLM (session "
                                    "40), Xeon with AMX, bf16"),
    "bench_v38_xeon_stock": ("The first run against stock vLLM (session 39; `none` and `ngram` with the plugin not "
                             "loaded), Xeon with AMX, bf16: HumanEval and open-chat (held-out ShareGPT first turns), "
                             "greedy, concurrency 1 and 8"),
    "bench_v38_xeon_stock_t07": ("Open-chat at temperature 0.7 against stock vLLM (session 39; sampled drafting, the "
                                 "CPU sampled verification and the planner's charge for it), Xeon with AMX, bf16"),
    "bench_v30_avx2": ("The AVX2-only EPYC, `bench_v29_avx2` again with the first configuration rotating across "
                       "levels (session 32, the same code otherwise; our default traced): none, n-gram, adaptive, "
                       "merged"),
    "bench_v29_avx2": ("The AVX2-only EPYC on vLLM's defaults with at least three waves per run (compiled float32, "
                       "both cores bound; session 32): 32 / 72 / 96 prompts at concurrency 1 / 8 / 32, none, n-gram, "
                       "adaptive, merged"),
    "ab_merged_he_c8_avx2": ("HumanEval at concurrency 8 on the AVX2-only EPYC, merged drafting against n-gram "
                             "(session 36): 96 prompts in four interleaved rounds, with none"),
    "bench_v34_avx2": ("The AVX2-only EPYC after the draft's argmax moved to the verified slots (session 36; every "
                       "level in at least two interleaved rounds, both adaptive configurations traced): none, n-gram, "
                       "adaptive, merged"),
    "ab_gemm_prefetch_avx2": ("The fp32 GEMM's spread prefetch of the next k-chunk, on the AVX2-only EPYC (session "
                              "37): our default on the new kernel against the previous one (`ours#prev`), with "
                              "none and n-gram, c8, both sets, interleaved rounds"),
    "ab_argmax_slots_avx2": ("The draft's argmax at the verified block slots alone, on the AVX2-only EPYC (session "
                             "36): our default against the previous code (`ours#prev`), with none and n-gram, "
                             "c8, both sets, interleaved rounds"),
    "bench_v33_avx2": ("The AVX2-only EPYC after the guard confirms a change of winner (session 35; every level in "
                       "interleaved rounds as `bench_v31_avx2`, both adaptive configurations traced): none, n-gram, "
                       "adaptive, merged"),
    "bench_v32_avx2": ("Concurrency 8 and 32 on the AVX2-only EPYC after the draft forward runs over the requests "
                       "that use it (session 34; interleaved rounds as `bench_v31_avx2`, our default traced): none, "
                       "n-gram, adaptive, merged"),
    "bench_v31_avx2": ("The AVX2-only EPYC with every level in at least two interleaved rounds and the spread of the "
                       "per-round speed-ups (session 33; c32 sends its 96 prompts in each of two rounds): none, "
                       "n-gram, adaptive, merged"),
    "ab_c32_he_avx2": ("HumanEval at concurrency 32 on the AVX2-only EPYC (session 33): none, n-gram and our default, "
                       "160 prompts in two interleaved rounds, our default traced"),
    "waves_c32_avx2": ("Concurrency 32 in steady state on the AVX2-only EPYC: 96 chat prompts per run (three waves, a "
                       "freed slot takes the next prompt) instead of one wave of 32; none, n-gram, adaptive, merged, "
                       "one server after another"),
    "ab_guard_threshold": ("Adaptive drafting's guard threshold on the AVX2-only EPYC: the default (1.3) against 1.1 "
                           "(`ours#g11`), with none and n-gram, c8 and c32, one run"),
    "bench_v27_avx2_c32": ("The AVX2-only EPYC at concurrency 32 with our fp32 GEMM (session 29): none, n-gram, "
                           "adaptive (96 prompts per set in three interleaved rounds)"),
    "ab_guard_margin": ("The guard's margin on the AVX2-only EPYC, chat prompts at concurrency 8: the noise-sized "
                        "margin (default) against a fixed 0 (the rule before), with none and n-gram, one run"),
    "bench_v28_avx2": ("The AVX2-only EPYC on vLLM's defaults with bundled draft version 4 and the noise-aware guard "
                       "(compiled float32, both cores bound; session 31), concurrency 1, 8 and 32: none, n-gram, "
                       "adaptive, merged"),
    "bench_v27_avx2": ("The AVX2-only EPYC on vLLM's defaults with our fp32 GEMM (compiled float32, both cores "
                       "bound; session 29), concurrency 1, 8 and 32: none, n-gram, adaptive, merged"),
    "ab_gemm_f32": ("Our fp32 AVX2 GEMM (DFLASH_CPU_GEMM_F32, auto) against vLLM's oneDNN GEMM (`@onednn`) on the "
                    "AVX2-only EPYC: none, n-gram and adaptive, each both ways, c1 and c8, one run"),
    "bench_v26_avx2": ("The AVX2-only EPYC on vLLM's defaults (compiled float32, both cores bound; session 28), "
                       "concurrency 1, 8 and 32: none, n-gram, adaptive, merged"),
    "bench_v25_c32": ("The Xeon at concurrency 32 on the code of session 27: none, n-gram, adaptive, merged (96 "
                      "prompts per set in three interleaved rounds)"),
    "bench_v25": ("The Xeon with the oneDNN row-count cache (session 27), concurrency 1, 8 and 32: none, n-gram, "
                  "adaptive, merged (32 prompts, three interleaved rounds at c1 / c8, one at c32)"),
    "ab_cache": ("A/B of the oneDNN row-count cache (session 27, the Xeon): adaptive with `DFLASH_ONEDNN_CACHE` at "
                 "its default (512, `ours`) and off (vLLM's 32, shown as `ours-merged`), beside none and "
                 "n-gram, c8 / c32 (32 prompts)"),
    "bench_v24_c32": ("The Xeon at concurrency 32 on the code of session 26: none, n-gram, adaptive, merged (96 "
                      "prompts per set in three interleaved rounds)"),
    "bench_v24": ("The Xeon with the guards' forecast vouch and no re-measuring after a measured win (session 26), "
                  "concurrency 1, 8 and 32: none, n-gram, adaptive, merged (32 prompts, three interleaved rounds at "
                  "c1 / c8, one at c32; the machine slower than in session 25)"),
    "bench_v23": ("The Xeon with the guards' cross-bucket vouch and the logits in the timed forward (session 25), "
                  "concurrency 1, 8 and 32: none, n-gram, adaptive, merged (32 prompts, three interleaved rounds at "
                  "c1 / c8, one at c32)"),
    "bench_v23_c32": ("The Xeon at concurrency 32 on the code of session 25: none, n-gram, adaptive, merged (96 "
                      "prompts per set in three interleaved rounds)"),
    "bench_v22": ("The Xeon with the split step-cost fit and the context lease (session 24), concurrency 1, 8 and 32: "
                  "none, n-gram, adaptive, merged (32 prompts, three interleaved rounds at c1 / c8, one at c32)"),
    "bench_v22_c32": ("The Xeon at concurrency 32 on the code of session 24: none, n-gram, adaptive, merged (96 "
                      "prompts per set in three interleaved rounds)"),
    "bench_v21_c32": ("The Xeon at concurrency 32 on the final code of session 23 (buffered deferral): none, n-gram, "
                      "adaptive, merged (96 prompts per set in three interleaved rounds)"),
    "bench_v20_c1": ("The Xeon at concurrency 1 with the per-produced-token term in the step-cost fit: none, n-gram, "
                     "adaptive, merged (16 prompts, two interleaved rounds)"),
    "bench_v20_c8c32": ("The Xeon at concurrency 8 and 32 with the per-produced-token term in the step-cost fit: none, "
                        "n-gram, adaptive, merged (32 prompts, three interleaved rounds at c8, one at c32)"),
    "bench_v19": ("The Xeon with the model in the engine core, concurrency 1, 8 and 32: none, n-gram, adaptive, "
                  "merged (32 prompts, three interleaved rounds at c1 / c8, one at c32)"),
    "bench_v19_layout": ("The process layout on the Xeon: the model in the engine core (vllm_dflash's default on CPU) "
                         "against vLLM's worker process (@mp), concurrency 1, 8 and 32 (16 prompts, two interleaved "
                         "rounds)"),
    "bench_v18_c8": ("The Xeon at concurrency 8 again, 64 prompts per set in three interleaved rounds: none, n-gram, "
                     "adaptive, merged"),
    "bench_v18_c32": ("The Xeon at concurrency 32: none, n-gram, adaptive, merged (32 prompts per set in three "
                      "interleaved rounds)"),
    "bench_v18": ("The Xeon (AMX), concurrency 1, 8 and 32: none, n-gram, adaptive, merged (32 prompts, three "
                  "interleaved rounds at c1 / c8, one at c32)"),
    "bench_v17_epyc_c32": ("The bf16 EPYC at concurrency 32 after 'off' drops context rows: none, n-gram, adaptive, "
                           "merged (32 prompts per set in three interleaved rounds)"),
    "bench_v17_epyc": ("The bf16 EPYC (no AMX), concurrency 1, 8 and 32: none, n-gram, adaptive, merged (32 prompts, "
                       "three interleaved rounds at c1 / c8, one at c32)"),
    "bench_v16_c8": ("Concurrency 8 again, 64 prompts per set in three interleaved rounds: none, n-gram, adaptive, "
                     "merged"),
    "bench_v16": ("Concurrency 1, 8 and 32 after the guard's flanked comparison: none, n-gram, adaptive, merged "
                  "(32 prompts, three interleaved rounds at c1 / c8, one at c32)"),
    "bench_v15_overlap_c1": ("Overlap (async) scheduling without speculation at concurrency 1: none against none with "
                             "DFLASH_OVERLAP=1 (12 prompts per set, three interleaved rounds)"),
    "bench_v15_c32": ("Concurrency 32 in three interleaved rounds of 32 prompts: none, none with overlap scheduling, "
                      "n-gram, adaptive, merged"),
    "bench_v15": ("Concurrency 1, 8 and 32 with the CPU time of every process outside the measured server recorded: "
                  "none, n-gram, adaptive, merged (32 prompts, three interleaved rounds at c1 / c8, one at c32)"),
    "merged_c32_recheck": ("Recheck of bench_v14's stalled cell, right after it: none, n-gram, merged at HumanEval "
                           "c32 (64 prompts, two interleaved rounds)"),
    "bench_v14": ("The five drafting sources side by side at concurrency 1, 8 and 32: none, n-gram, the DFlash block "
                  "alone (fixed block), adaptive, merged (32 prompts, two interleaved rounds)"),
    "bench_v13": ("Concurrency 1, 8 and 32 with every configuration's target forward timed and greedy outputs judged "
                  "on the servers' token ids: none, n-gram, adaptive, merged (32 prompts, three interleaved rounds)"),
    "bench_v12": ("Concurrency 1, 8 and 32 with a step-cost fit per batch-size bucket (reverted after this run): "
                  "none, n-gram, adaptive, merged (32 prompts, interleaved)"),
    "bench_v12_c32": ("Concurrency 32 in three interleaved rounds of 32 prompts, with the per-bucket step-cost fit "
                      "(reverted after this run): none, n-gram, adaptive, merged"),
    "bench_v11_c32": ("Concurrency 32 in three interleaved rounds of 32 prompts, after the two-regressor step-cost "
                      "fit: none, n-gram, adaptive, merged"),
    "bench_v11": ("Concurrency 8 and 32 after the two-regressor step-cost fit (T(n, B)): none, n-gram, adaptive, "
                  "merged (32 prompts, interleaved)"),
    "bench_v10": ("Concurrency 1, 8 and 32 with one-pass greedy verification on CPU and merged proposals scored per "
                  "slot: none, n-gram, adaptive, merged (32 prompts, interleaved)"),
    "bench_v9": ("Concurrency 8 and 32 with vLLM's n-gram fixed and as vLLM ships it: none, n-gram, n-gram without "
                 "the plugin, adaptive, merged (50 prompts, interleaved)"),
    "bench_v8": ("Interleaved serving benchmark, repeat of bench_v7 with the fixed block: none, n-gram, fixed block, "
                 "adaptive, merged (32 prompts, all servers up, configurations back to back)"),
    "bench_v8_c32": ("Concurrency 32 again, 64 prompts per run in two interleaved rounds: none, n-gram, adaptive, "
                     "merged"),
    "spec_overhead_c32": ("vLLM's n-gram with a 48-token match required (it almost never proposes) against no "
                          "speculation at concurrency 32, taken with vLLM's CPU n-gram thread bug"),
    "bench_v7": ("Interleaved serving benchmark on a Xeon with AMX: none, n-gram, adaptive, merged, hinted (32 "
                 "prompts per run, all servers up, configurations back to back in rotated rounds)"),
    "bench_v6": ("Serving compiled bf16, every core bound to the worker, on a Xeon with AMX: none, n-gram, fixed "
                 "block, adaptive, merged, hinted; deferred KV injection; client-measured tokens per forward for "
                 "every configuration"),
    "bench_v6_c8c32": "Repeat of bench_v6 at concurrency 8 and 32 with 32 prompts per run: none, n-gram, adaptive",
    "gemv_ab_off": "Serving A/B of DFLASH_CPU_GEMV, part 1: off (none and adaptive, HumanEval c1 / c8)",
    "gemv_ab_auto": "Serving A/B of DFLASH_CPU_GEMV, part 2: auto (8 rows), run right after part 1",
    "bench_v5": ("Serving compiled bf16 with every core bound to the worker (the benchmark's default layout since "
                 "0.2.0), bundled draft version 3: none, n-gram, fixed block, adaptive, merged"),
    "bench_v4": ("Serving on vLLM's defaults (compiled bf16, vLLM's default layout), bundled draft version 3, "
                 "step-cost-aware adaptive drafting: none, n-gram, fixed block, adaptive, merged"),
    "bench_v3": ("Serving on vLLM's defaults (compiled bf16), bundled draft version 3: none, n-gram, fixed block, "
                 "adaptive, merged"),
    "bench_merged": "Serving on vLLM's defaults (compiled bf16), draft version 1: none, n-gram, adaptive, merged",
    "bench_serving": "Serving, eager float32: seven configurations",
    "bench_adaptive_overlap": "Adaptive drafting with and without overlap scheduling",
    "bench_serving_quick": "Serving benchmark, quick mode (smoke run)",
}

# Result files rendered from their own markdown (the title of each section).
MD_SECTIONS = {"cost_model_epyc_bf16": ("The adaptive planner's step-cost model, predicted against measured, on "
                                        "the traces of `bench_v47_epyc_bf16_open_t0`, `_open_t07` and `_math_t0` "
                                        "(session 47), bf16 EPYC"),
               "gemm_f32": "The fp32 AVX2 GEMM against vLLM's CPU linear: the 121 GEMMs of one step, 1 to 512 rows",
               "step_ops_avx2": ("One decode step without speculation at concurrency 1, op by op, against the memory "
                                 "bound: float32 on the AVX2-only EPYC (session 37)"),
               "step_ops": "One decode step without speculation at concurrency 1, op by op, against the memory bound",
               "planner_cost": "Adaptive planner: host time per engine step against batch size",
               "hinted_vllm": "Plain draft, hinted draft and prompt lookup through vLLM, each alone (fixed block)",
               "gemv_vllm": "The skinny-GEMM kernel inside vLLM (DFLASH_CPU_GEMV): decode step time off and on",
               "gemv": "The skinny-GEMM kernel in isolation against vLLM's CPU linear"}
