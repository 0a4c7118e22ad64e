# SPDX-License-Identifier: Apache-2.0
"""Where an engine step's wall time goes, per configuration, in process (offline `LLM`, vLLM's defaults: compiled).

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python dev/step_profile.py --configs none,ngram,ours --concurrency 32

Wraps (outermost call only): the scheduler, the target forward, target logits, the (rejection) sampler, drafting, and
the engine step. Prints per-step means (ms) and query tokens per step; --json writes every step's record."""
from __future__ import annotations

import argparse
import functools
import json
import os
import time
from collections import defaultdict

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

REC: list[dict] = []
CUR: dict = defaultdict(float)
DEPTH: dict = defaultdict(int)
PLAN: dict = {}  # the adaptive plan of the current step (ours only)


def wrap(obj, name, key):
    f = getattr(obj, name)

    @functools.wraps(f)  # keeps the signature: the plugin's seam check inspects some of these
    def w(*a, **k):
        DEPTH[key] += 1
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            DEPTH[key] -= 1
            if DEPTH[key] == 0:
                CUR[key] += time.perf_counter() - t
    setattr(obj, name, w)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="none,ngram,ours")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--prompts", default="humaneval")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0, help="of every request (seeded per request)")
    ap.add_argument("--config", default=None, help="(internal) run one config in this process")
    ap.add_argument("--json", default=None)
    from vllm_dflash.utils import default_dtype

    ap.add_argument("--dtype", default=default_dtype(),
                    help="the target's dtype (default: the fastest on this CPU, as the bench picks it: bfloat16 with "
                         "avx512_bf16, else float32)")
    ap.add_argument("--ops", type=int, default=0, metavar="N",
                    help="also profile N decode steps of the measured run (from its 20th step) with torch.profiler "
                         "and print the top operators by self CPU time per step")
    ap.add_argument("--pin-off", action="store_true",
                    help="ours: pin every adaptive guard to 'off' (no speculation, nothing planned), to measure what "
                         "a speculative engine costs when it drafts nothing")
    ap.add_argument("--spec-extra", action="append", default=[], metavar="CONFIG:KEY=VALUE",
                    help="a speculative-config override, as `vllm-dflash bench --spec-extra` takes it (repeatable)")
    a = ap.parse_args()
    if a.config is None:  # one process per configuration (vLLM state does not reset between engines)
        import subprocess
        import sys
        for c in a.configs.split(","):
            subprocess.run([sys.executable, __file__, "--config", c, "--concurrency", str(a.concurrency),
                            "--prompts", a.prompts, "--max-tokens", str(a.max_tokens), "--ops", str(a.ops),
                            "--temperature", str(a.temperature),
                            "--dtype", a.dtype]
                           + (["--pin-off"] if a.pin_off else [])
                           + [f"--spec-extra={x}" for x in a.spec_extra if x.startswith(c + ":")]
                           + (["--json", f"{a.json}.{c}.json"] if a.json else []), check=True)
        return

    from vllm import LLM, SamplingParams
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker import gpu_model_runner as gmr

    from vllm_dflash.bench.configs import select
    from vllm_dflash.bench.run import load_prompt_set
    from vllm_dflash.drafts import resolve_draft_arg
    from vllm_dflash.target import resolve_target

    target = resolve_target(None)
    draft, _ = resolve_draft_arg(None, target, default_target=True)
    cfg = select(["none", a.config], a.spec_extra)[-1]  # the bench's parser ("none" is its required baseline)
    spec = cfg.speculative_config(str(draft), 7)
    for k, v in (getattr(cfg, "env", None) or {}).items():
        os.environ[k] = v
    R = gmr.GPUModelRunner
    wrap(R, "_model_forward", "fwd")
    wrap(R, "propose_draft_token_ids", "draft")
    wrap(RejectionSampler, "forward", "rej")
    wrap(Sampler, "forward", "samp")
    if a.config.startswith("ours"):  # the drafter's parts
        from vllm_dflash.adaptive.controller import AdaptiveController
        from vllm_dflash.integration import proposer as P
        from vllm_dflash.integration import vllm_model as VM
        from vllm_dflash.integration.drafting import adaptive as DA
        from vllm_dflash.integration.drafting import step as DS
        prop = P.DFlashDrafter
        for name in ("propose", "prepare_next_token_ids_padded", "prepare_inputs_padded", "set_inputs_first_pass",
                     "build_per_group_and_layer_attn_metadata", "build_model_inputs_first_pass", "forward_inputs",
                     "_defer", "_inject", "_determine_batch_execution_and_padding"):
            if hasattr(prop, name):
                wrap(prop, name, "p." + name)
        wrap(DA.AdaptiveDrafting, "_block", "p._block")
        wrap(DA.AdaptiveDrafting, "_propose", "p._adaptive")
        wrap(DA, "decode_rows", "p._histories")  # module globals: patched where the strategies call them
        wrap(DA, "write_hints", "p._write_hints")
        wrap(DS, "denoise", "p._denoise")
        wrap(AdaptiveController, "plan", "p.plan")
        for name in ("_best_plan", "_score_previous", "_gain_table", "_choose", "_lookup", "_prune"):
            wrap(AdaptiveController, name, "p.ctl" + name)
        from vllm_dflash.adaptive import controller as C
        from vllm_dflash.adaptive import policy as PO
        wrap(PO.StepCostModel, "observe", "p.cost_observe")  # both fits: the step's and the draft forward's
        wrap(PO.SpeculationGuard, "record", "p.guard_record")
        for name in ("plan_lengths", "predicted_speedup"):
            wrap(C, name, "p." + name)
        if a.pin_off:
            SpeculationGuard = PO.SpeculationGuard
            init = SpeculationGuard.__init__

            def pinned(self, *x, **k):
                init(self, *x, **k)
                self.arm, self.rate = "off", {"plan": 0.0, "off": 1.0}
                self.record = lambda *x, **k: None
            SpeculationGuard.__init__ = pinned
        plan_f = AdaptiveController.plan

        @functools.wraps(plan_f)
        def plan_rec(self, *x, **k):  # the step's decisions and the models behind them, into the step's record
            out = plan_f(self, *x, **k)
            g = self.guard
            PLAN.update(srcs={s: out.sources.count(s) for s in set(out.sources)}, drafted=sum(out.ks),
                        matched=sum(len(t) > 0 for t in out.lookups),  # requests with a prompt-lookup match
                        matched_unused=sum(len(t) > 0 and k == 0 for t, k in zip(out.lookups, out.ks)),
                        block=bool(out.needs_block), cost=[self.cost.alpha, self.cost.beta, self.cost.delta],
                        block_cost=[self.block_cost.alpha, self.block_cost.beta], arm=g.arm,
                        forecast=g.forecast, rates={a: g.rate[a] for a in g.ARMS})
            return out
        AdaptiveController.plan = plan_rec
        wrap(AdaptiveController, "propose", "p.ctl_propose")
        for name in ("_copy_draft_token_ids_to_cpu", "_copy_valid_sampled_token_count"):
            wrap(R, name, "p.runner" + name)
        for v in vars(VM).values():
            if isinstance(v, type) and hasattr(v, "combine_hidden_states"):
                wrap(v, "combine_hidden_states", "p.combine")
        dm = VM.DFlashDraftForVllm
        for name in ("precompute_and_store_context_kv", "draft_argmax", "forward"):
            wrap(dm, name, "p.draft_" + name)
    llm = LLM(model=str(target), dtype=a.dtype, max_model_len=2048, max_num_seqs=max(a.concurrency, 8),
              speculative_config=spec, seed=0, gpu_memory_utilization=0.5)  # CPU: a share of RAM (other jobs hold some)
    core = llm.llm_engine.engine_core.engine_core  # InprocClient -> EngineCore
    sched = core.scheduler
    wrap(sched, "schedule", "sched")
    model = core.model_executor.driver_worker.worker.model_runner.model
    wrap(model, "compute_logits", "logits")
    f = core.step_fn  # bound at init (step or step_with_batch_queue); the in-process client calls it

    OPS: dict = {}  # the torch.profiler of --ops while it runs; "table" after it

    def stepw(*x, **k):
        CUR.clear()
        if a.ops and MEASURED and len(REC) == 20 and "prof" not in OPS:
            import torch.profiler as tp
            OPS["prof"] = tp.profile(activities=[tp.ProfilerActivity.CPU])
            OPS["prof"].__enter__()
        t = time.perf_counter()
        out = f(*x, **k)
        if "prof" in OPS and "table" not in OPS and len(REC) == 20 + a.ops - 1:
            OPS["prof"].__exit__(None, None, None)
            OPS["table"] = OPS["prof"].key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        rec = dict(CUR)
        rec["step"] = time.perf_counter() - t
        rec["query_tokens"] = LAST.pop("n", 0)
        rec["reqs"] = LAST.pop("b", 0)
        rec.update(PLAN)
        PLAN.clear()
        REC.append(rec)
        return out
    core.step_fn = stepw

    import gc
    GC_T: list = []

    def gc_cb(phase, info):  # Python's garbage collections inside a step (gen 2 ones can stall a large heap)
        if phase == "start":
            GC_T.append(time.perf_counter())
        elif GC_T:
            CUR["gc"] += time.perf_counter() - GC_T.pop()
            if info.get("generation") == 2:
                CUR["gc2_n"] += 1
    gc.callbacks.append(gc_cb)
    LAST: dict = {}
    MEASURED: list = []  # non-empty once the measured run starts (--ops profiles inside it only)
    orig_sched = sched.schedule

    def sched_w(*x, **k):
        out = orig_sched(*x, **k)
        LAST["n"] = out.total_num_scheduled_tokens
        LAST["b"] = len(out.num_scheduled_tokens)
        return out
    sched.schedule = sched_w

    items = load_prompt_set(a.prompts, 2 * a.concurrency + 1)
    sp = SamplingParams(temperature=a.temperature, max_tokens=a.max_tokens, seed=0 if a.temperature else None)
    llm.chat([items[-1]["messages"]], sp, use_tqdm=False)  # warm-up
    llm.chat([it["messages"] for it in items[: a.concurrency]], sp, use_tqdm=False)  # warm-up at this batch
    REC.clear()
    MEASURED.append(True)
    t0 = time.perf_counter()
    outs = llm.chat([it["messages"] for it in items[a.concurrency: 2 * a.concurrency]], sp, use_tqdm=False)
    wall = time.perf_counter() - t0
    ntok = sum(len(o.outputs[0].token_ids) for o in outs)
    dec = [r for r in REC if r["query_tokens"] and r.get("reqs")]
    keys = ["step", "sched", "fwd", "logits", "rej", "samp", "draft", "gc"]
    pk = sorted({k for r in dec for k in r if k.startswith("p.")})
    mean = {k: 1e3 * sum(r.get(k, 0.0) for r in dec) / max(len(dec), 1) for k in keys}
    mean["other"] = mean["step"] - sum(mean[k] for k in keys[1:])
    qt = sum(r["query_tokens"] for r in dec) / max(len(dec), 1)
    import torch
    print(f"[{a.config}] torch threads {torch.get_num_threads()}, affinity {sorted(os.sched_getaffinity(0))}")
    print(f"{a.config:14s} c{a.concurrency} {ntok} tok in {wall:.1f} s = {ntok / wall:.1f} tok/s; {len(dec)} steps, "
          f"{qt:.1f} query tokens/step; ms/step: " + " ".join(f"{k} {v:.1f}" for k, v in mean.items()), flush=True)
    gcs = [r.get("gc", 0.0) for r in REC]
    print(f"  Python GC: {1e3 * sum(gcs):.0f} ms in the run, {int(sum(r.get('gc2_n', 0) for r in REC))} full "
          f"(generation 2) collections, longest step share {1e3 * max(gcs, default=0.0):.0f} ms", flush=True)
    if pk:
        print("  drafter parts ms/step: " + " ".join(f"{k[2:]} {1e3 * sum(r.get(k, 0.0) for r in dec) / len(dec):.2f}"
                                              for k in pk), flush=True)
    threads = []  # every thread of this process by CPU time (user + system): a thread that competes with the OMP team
    for tid in os.listdir("/proc/self/task"):
        try:
            name = open(f"/proc/self/task/{tid}/comm").read().strip()
            f = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
            threads.append((int(f[11]) + int(f[12]), name))
        except OSError:
            continue
    hz = os.sysconf("SC_CLK_TCK")
    print("  threads by CPU time (s, whole process life): " + ", ".join(
        f"{n} {t / hz:.1f}" for t, n in sorted(threads, reverse=True)[:8]), flush=True)
    if "table" in OPS:
        print(f"  torch.profiler, {a.ops} decode steps from the 20th (self CPU time over all {a.ops}):")
        print(OPS["table"], flush=True)
    if a.json:
        json.dump({"config": a.config, "wall": wall, "tokens": ntok, "steps": dec}, open(a.json, "w"))


if __name__ == "__main__":
    main()
