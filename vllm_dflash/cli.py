# SPDX-License-Identifier: Apache-2.0
"""`vllm-dflash` command line: prepare-target, collect, train, export, eval, demo, check-data, check-install,
bench, soak."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from vllm_dflash.utils import HelpFormatter


def _is_default_target(target: str | None) -> bool:
    from vllm_dflash.target import DEFAULT_TARGET_NAME

    return target in (None, "", "default", DEFAULT_TARGET_NAME)


def _draft_arg(a: argparse.Namespace) -> str | Path:
    """--draft of eval / demo: a folder as given, else resolved (bundled draft of a checkout, or 'untrained')."""
    from vllm_dflash.drafts import UNTRAINED, resolve_draft_arg

    if a.draft is not None and a.draft != UNTRAINED:
        return a.draft  # checked where it is loaded
    from vllm_dflash.target import resolve_target

    target = resolve_target(a.target) if a.draft == UNTRAINED else None  # the bundled draft needs no target
    return resolve_draft_arg(a.draft, target, default_target=_is_default_target(a.target))[0]


def _env_defaults() -> None:
    # 2-core CPU defaults; users override by exporting them.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def cmd_prepare_target(a: argparse.Namespace) -> int:
    from vllm_dflash.target import prepare_target

    print(prepare_target(a.out, dtype=a.dtype, force=a.force))
    return 0


def cmd_collect(a: argparse.Namespace) -> int:
    from vllm_dflash.data.collect import CollectConfig, collect, collect_ray, resolve_collect_mask
    from vllm_dflash.target import resolve_target

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    target = resolve_target(a.target)
    cfg = CollectConfig(target=str(target), out_dir=a.out, sources=tuple(a.sources.split(",")),
                        mask_token_id=resolve_collect_mask(target, a.mask_token_id),
                        prompts_file=a.prompts, limit=a.limit, max_new_tokens=a.max_new_tokens,
                        max_prompt_tokens=a.max_prompt_tokens, sample_fraction=a.sample_fraction,
                        chunk_size=a.chunk_size, max_num_seqs=a.max_num_seqs, seed=a.seed,
                        enforce_eager=a.enforce_eager, dtype=a.dtype, temperature=a.temperature,
                        exclude_collected=tuple(f for f in (a.exclude_collected or "").split(",") if f))
    man = collect_ray(cfg, a.ray, address=a.ray_address) if a.ray else collect(cfg)
    print(json.dumps({k: v for k, v in man.items() if k not in ("done_ids", "skipped_ids", "config")}, indent=1))
    return 0


def cmd_eval(a: argparse.Namespace) -> int:
    from vllm_dflash.eval.reference import evaluate_reference
    from vllm_dflash.eval.report import format_report

    a.draft = _draft_arg(a)
    if a.engine == "vllm":
        from vllm_dflash.eval.vllm_engine import evaluate_vllm

        report = evaluate_vllm(target=a.target, draft=a.draft, prompts=a.prompts, limit=a.limit,
                               max_new_tokens=a.max_new_tokens, block_size=a.block_size,
                               diffusion_steps=a.diffusion_steps, baseline=not a.no_baseline, concurrency=a.concurrency,
                               ngram_k=a.ngram)
    else:
        report = evaluate_reference(target=a.target, draft=a.draft, prompts=a.prompts, limit=a.limit,
                                    max_new_tokens=a.max_new_tokens, block_size=a.block_size,
                                    diffusion_steps=a.diffusion_steps, baseline=not a.no_baseline, dtype=a.dtype)
    print(json.dumps(report.to_dict()) if a.json else format_report(report))
    return 0


def cmd_train(a: argparse.Namespace) -> int:
    from vllm_dflash.train.run import run_train

    res = run_train(data=a.data, out=a.out, target=a.target, num_layers=a.layers, block_size=a.block_size,
                    draft_vocab_size=a.draft_vocab or None, mask_token_id=a.mask_token_id, batch_size=a.batch_size,
                    num_epochs=a.epochs, max_steps=a.max_steps, lr=a.lr, anchors_per_seq=a.anchors, max_len=a.max_len,
                    eval_every=a.eval_every, ckpt_every=a.ckpt_every, log_every=a.log_every,
                    diffusion_steps=a.diffusion_steps, feature_cache=a.feature_cache, threads=a.threads,
                    init_from_target=a.init_from_target, init_draft=a.init_draft,
                    use_target_features=not a.no_target_features, standardize_features=a.standardize_features,
                    train_fraction=a.train_fraction, greedy_only=a.greedy_only, precision=a.precision,
                    run_steps=a.run_steps, run_minutes=a.run_minutes, device=a.device,
                    time_budget_minutes=a.time_budget_minutes,
                    hint_ngram=tuple(a.hints) if a.hints else None, hint_prob=a.hint_prob, gamma=a.gamma,
                    kl_weight=a.kl_weight, kl_temperature=a.kl_temperature,
                    eval_temperature=a.eval_temperature)
    print(json.dumps(res, indent=1))
    return 0


def cmd_export(a: argparse.Namespace) -> int:
    from vllm_dflash.train.export import export_draft

    print(json.dumps(export_draft(a.run, a.out, a.target)))
    return 0


def cmd_demo(a: argparse.Namespace) -> int:
    from vllm_dflash.bench.demo import run_demo

    return run_demo(draft=a.draft, num_prompts=a.num_prompts, max_tokens=a.max_tokens, mode=a.mode, dtype=a.dtype,
                    eager=a.enforce_eager, cpu_bind=a.cpu_bind, parallel=False if a.serial_start else None)


def cmd_check_data(a: argparse.Namespace) -> int:
    from vllm_dflash.data.contamination import check_data, format_report, load_tokenizer

    folders = [f.strip() for f in a.data.split(",") if f.strip()]
    report = check_data(folders, load_tokenizer(a.target), sets=[x.strip() for x in a.sets.split(",") if x.strip()],
                        containment=a.containment)
    print(json.dumps(report, indent=1) if a.json else format_report(report))
    return 0 if report["clean"] else 1


def cmd_bench(a: argparse.Namespace) -> int:
    from vllm_dflash.bench.run import run_from_args

    return run_from_args(a)


def build_parser() -> argparse.ArgumentParser:
    """The `vllm-dflash` parser with every sub-command (each sets `fn`, the function that runs it)."""
    from vllm_dflash.config import describe_known_mask_token_ids

    p = argparse.ArgumentParser(prog="vllm-dflash", description="DFlash speculative decoding for vLLM: "
                                "prepare the target, collect data, train and evaluate drafts, demo, benchmark.",
                                formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    known_masks = describe_known_mask_token_ids()

    def parser(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, formatter_class=HelpFormatter)

    s = parser("prepare-target", "convert the bundled SmolLM2-135M-Instruct GGUF to a HF folder")
    s.add_argument("--out", default=None, help="output folder (default: $DFLASH_CACHE/SmolLM2-135M-Instruct)")
    s.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="weights dtype of the folder")
    s.add_argument("--force", action="store_true", help="convert again even if the folder is complete")
    s.set_defaults(fn=cmd_prepare_target)

    s = parser("collect", "generate training data with the target through vLLM (resumable)")
    s.add_argument("--target", default=None, help="target folder (default: SmolLM2-135M-Instruct)")
    s.add_argument("--out", required=True, help="output folder (resumes what is there)")
    s.add_argument("--sources", default="code-stdlib,code-codeio,chat-web,code-pkgs",
                   help="comma-separated prompt sources: code-stdlib, code-codeio, code-pkgs, chat-web, chat-sharegpt "
                        "(multi-turn; the target answers every turn), and code-stdlib-alt, code-pkgs-alt, "
                        "code-codeio-alt, chat-web-alt (the same material under another instruction: new prompts), "
                        "math-gsm (math word problems from templates the 'math' eval set never uses); all but the "
                        "code-stdlib and code-pkgs ones read files of the data packages: pip install "
                        "'vllm-dflash[data]'")
    s.add_argument("--prompts", default=None, help="a JSONL prompt file instead of the built-in sources "
                   "(default: none, the built-in --sources)")
    s.add_argument("--limit", type=int, default=None, help="at most this many prompts (default: all)")
    s.add_argument("--max-new-tokens", type=int, default=320, help="response tokens per prompt at most")
    s.add_argument("--max-prompt-tokens", type=int, default=768, help="longer prompts are skipped (counted)")
    s.add_argument("--sample-fraction", type=float, default=0.25,
                   help="share of prompts sampled at --temperature instead of greedy")
    s.add_argument("--temperature", type=float, default=0.7, help="for the sampled share")
    s.add_argument("--mask-token-id", type=int, default=None,
                   help="the mask token the drafts will be trained with: recorded in the manifest, and every time the "
                        "target itself writes it in a response is counted (a token the target writes is a bad mask) "
                        f"(default: the known id for the target family [{known_masks}], else none)")
    s.add_argument("--enforce-eager", action="store_true",
                   help="disable torch.compile (vLLM's default is compiled: several times faster on CPU)")
    s.add_argument("--dtype", default=None, choices=("bfloat16", "float32", "float16"),
                   help="model dtype (default: bfloat16 on bf16 CPUs and GPUs, float32 on AVX2-only CPUs)")
    s.add_argument("--chunk-size", type=int, default=48, help="prompts per written part (the resume granularity)")
    s.add_argument("--max-num-seqs", type=int, default=48, help="vLLM's concurrent sequences")
    s.add_argument("--seed", type=int, default=0, help="prompt order and sampling seed")
    s.add_argument("--exclude-collected", default=None, metavar="DIRS",
                   help="comma-separated collection folders: skip prompts they already answered (another machine's "
                        "share of the same list) (default: none)")
    s.add_argument("--ray", type=int, default=0, metavar="N",
                   help="shard over N Ray actors (one vLLM engine each); 0 = one engine in this process")
    s.add_argument("--ray-address", default=None, help="Ray cluster address (default: start a local one)")
    s.set_defaults(fn=cmd_collect)

    from vllm_dflash.train.config import TrainConfig

    tc = TrainConfig()  # the training defaults (one place): the train options below show and pass these
    s = parser("train", "train (or resume) a DFlash draft on collected trajectories")
    s.add_argument("--data", required=True,
                   help="collection folder(s) (vllm-dflash collect --out), comma-separated; read again at every start")
    s.add_argument("--out", required=True, help="run folder: checkpoint/, log.jsonl, curves.png, draft/ (resumes)")
    s.add_argument("--target", default=None, help="target folder (default: SmolLM2-135M-Instruct)")
    s.add_argument("--init-draft", default=None,
                   help="fine-tune: start from this trained draft's weights (architecture and mask from it; the draft "
                        "vocabulary is rebuilt from the data; new runs only) (default: none, a new draft)")
    s.add_argument("--layers", type=int, default=None,
                   help="draft decoder layers (default: 1 for a new draft, the --init-draft's own count when "
                        "fine-tuning; more than that grows it, each new layer starting as the identity)")
    s.add_argument("--block-size", type=int, default=8, help="draft block size")
    s.add_argument("--draft-vocab", type=int, default=8192, help="reduced draft vocabulary (0 = full)")
    s.add_argument("--mask-token-id", type=int, default=None,
                   help="mask token (new runs; a resumed run keeps its own) (default: the known id for the target "
                        f"family [{known_masks}]; required for any other target)")
    s.add_argument("--batch-size", type=int, default=tc.batch_size, help="sequences per optimizer step")
    s.add_argument("--anchors", type=int, default=tc.anchors_per_seq, help="anchor blocks per sequence and step")
    s.add_argument("--epochs", type=int, default=tc.num_epochs, help="passes over the data")
    s.add_argument("--max-steps", type=int, default=tc.max_steps,
                   help="total optimizer steps (the lr schedule's length; with --epochs, whichever ends first) "
                        "(default: --epochs alone)")
    s.add_argument("--lr", type=float, default=tc.lr,
                   help=f"peak lr, {tc.warmup_ratio * 100:g}%% warm-up, cosine to 10%%")
    s.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"),
                   help="auto: bf16 autocast on GPUs and CPUs with avx512_bf16 / AMX, fp32 elsewhere")
    s.add_argument("--greedy-only", action=argparse.BooleanOptionalAction, default=True,
                   help="train on greedy (temperature 0) trajectories only; sampled ones are label noise for greedy "
                        "serving")
    s.add_argument("--max-len", type=int, default=640, help="tokens per sequence, prompt included")
    s.add_argument("--eval-every", type=int, default=tc.eval_every, help="held-out τ every this many steps")
    s.add_argument("--ckpt-every", type=int, default=tc.ckpt_every,
                   help=f"checkpoint every this many steps (and every {tc.ckpt_minutes:g} minutes)")
    s.add_argument("--log-every", type=int, default=tc.log_every, help="log a training row every this many steps")
    s.add_argument("--run-steps", type=int, default=tc.run_steps,
                   help="stop after this many steps in this invocation (checkpointed; run again to resume) "
                        "(default: no limit)")
    s.add_argument("--run-minutes", type=float, default=tc.run_minutes,
                   help="stop after this many minutes in this invocation (checkpointed; run again to resume) "
                        "(default: no limit)")
    s.add_argument("--device", default="auto", help="auto (a CUDA GPU when torch sees one), cpu or cuda[:N]")
    s.add_argument("--time-budget-minutes", type=float, default=tc.time_budget_minutes,
                   help=f"fit the lr schedule to this much time: after {tc.probe_steps} steps the schedule's length "
                        "becomes the steps that fit at the measured rate, and the run stops when the time is spent "
                        "(default: none)")
    s.add_argument("--diffusion-steps", type=int, default=tc.diffusion_steps, help="denoising passes per block")
    s.add_argument("--feature-cache", default=None, help="cache target features on disk here (bf16, "
                   "num_features x hidden_size x 2 bytes per token) (default: no cache)")
    s.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's on CPU, at most 4 on CUDA)")
    s.add_argument("--init-from-target", action="store_true",
                   help="start the draft layers from the target's last layers (new runs only)")
    s.add_argument("--no-target-features", action="store_true",
                   help="ablation baseline: train without target features (context K/V from zeros; not servable)")
    s.add_argument("--train-fraction", type=float, default=1.0,
                   help="train on this deterministic share of the training split (data-scaling runs; held-out set "
                        "unchanged)")
    s.add_argument("--standardize-features", action="store_true", default=tc.standardize_features,
                   help="fc sees per-dimension standardised features, folded into fc at export (new runs only; "
                        "no gain measured on SmolLM2)")
    s.add_argument("--hints", type=int, nargs=2, metavar=("MIN_N", "MAX_N"), default=None,
                   help="train a hinted draft: blocks [anchor, h1 .. hm, MASK ..] with the prompt-lookup continuation "
                        "(n-grams MIN_N..MAX_N, e.g. 2 4, as served) of each anchor's context (new runs and "
                        "--init-draft; stored in the draft's dflash_config.hint_ngram) (default: a plain draft)")
    s.add_argument("--gamma", type=float, default=tc.gamma,
                   help="loss weight decay over block slots, w_k = exp(-(k-1)/gamma) (default: the paper's, 4 for "
                        "block 8, 5 for 10, 7 for 16; smaller puts more weight on the first slots)")
    s.add_argument("--kl-weight", type=float, default=tc.kl_weight,
                   help="weight of KL(target || draft) against the cross-entropy on the target's tokens, the target's "
                        "distribution from the cached features (0: cross-entropy only)")
    s.add_argument("--kl-temperature", type=float, default=tc.kl_temperature,
                   help="temperature of both distributions in the KL term")
    s.add_argument("--eval-temperature", type=float, default=tc.eval_temperature,
                   help="held-out evaluation also estimates acceptance of drafts sampled at this temperature "
                        "(eval_sampled in the log; 0: off)")
    s.add_argument("--hint-prob", type=float, default=tc.hint_prob,
                   help="hinted drafts: share of blocks fed their hints where the lookup matches (the rest are plain)")
    s.set_defaults(fn=cmd_train)

    s = parser("export", "a training run's latest checkpoint -> a serving draft folder (bf16)")
    s.add_argument("--run", required=True, help="the --out folder of `vllm-dflash train`")
    s.add_argument("--out", required=True, help="draft folder to write (config.json + model.safetensors)")
    s.add_argument("--target", default=None, help="the run's target folder (default: SmolLM2-135M-Instruct)")
    s.set_defaults(fn=cmd_export)

    draft_help = ("DFlash draft folder, or 'untrained' for a random draft shaped for the target (default: the trained "
                  "draft of a source checkout, models/SmolLM2-135M-Instruct-DFlash-b8, default target only; an error "
                  "names the fix when it is missing)")
    s = parser("eval", "τ, per-position acceptance and speedup of a draft (reference loop)")
    s.add_argument("--target", default=None, help="target folder (default: SmolLM2-135M-Instruct)")
    s.add_argument("--draft", default=None, help=draft_help)
    s.add_argument("--prompts", default="humaneval", help="'humaneval', 'chat', 'sharegpt', 'open-chat' (held-out "
                   "open-ended chat; 'open-chat/CATEGORY' for one category), 'math' (held-out word problems) or a "
                   "JSONL file")
    s.add_argument("--limit", type=int, default=None, help="at most this many prompts (default: all)")
    s.add_argument("--max-new-tokens", type=int, default=256, help="new tokens per prompt at most")
    s.add_argument("--block-size", type=int, default=None, help="block size (default: the draft's)")
    s.add_argument("--diffusion-steps", type=int, default=None, help="denoising passes (default: the draft's)")
    s.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="reference-loop dtype")
    s.add_argument("--no-baseline", action="store_true", help="skip the baseline run (no speedup figure)")
    s.add_argument("--engine", default="reference", choices=["reference", "vllm"],
                   help="reference: the PyTorch loop (baseline = block size 1); vllm: offline vLLM with our drafter "
                        "(baseline = vLLM without speculation)")
    s.add_argument("--concurrency", type=int, default=1, help="requests in flight (vllm engine)")
    s.add_argument("--ngram", type=int, default=0, metavar="K",
                   help="vllm engine: also run vLLM's prompt lookup with K tokens on the same prompts (its τ beside "
                        "ours); 0 = off")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s.set_defaults(fn=cmd_eval)

    s = parser("demo", "the main job: serve SmolLM2 with stock vLLM (no speculation, n-gram; the plugin not loaded) "
               "and with our drafter, side by side: tok/s, speedup over stock vLLM, tokens per forward, τ, greedy "
               "exactness")
    s.add_argument("--draft", default=None, help=draft_help)
    s.add_argument("--num-prompts", type=int, default=4, help="HumanEval prompts, sent one at a time")
    s.add_argument("--max-tokens", type=int, default=128, help="new tokens per prompt")
    s.add_argument("--dtype", default=None, choices=["bfloat16", "float32"],
                   help="model dtype (default: the fastest on this machine: bfloat16 with avx512_bf16, else float32); "
                        "float32 makes every greedy output token-exact")
    s.add_argument("--enforce-eager", action="store_true", help="skip torch.compile (faster start, slower steps)")
    s.add_argument("--mode", default="serve", choices=["serve", "reference"],
                   help="serve: real `vllm serve`; reference: the plain-PyTorch reference loop")
    s.add_argument("--cpu-bind", default=None,
                   help="VLLM_CPU_OMP_THREADS_BIND of the servers, OMP_NUM_THREADS = the cores listed; 'auto' = vLLM's "
                        "default layout (default: every core bound to the model worker, the bench's measured layout; "
                        "a VLLM_CPU_OMP_THREADS_BIND already set in the shell wins)")
    s.add_argument("--serial-start", action="store_true",
                   help="start the servers one after another (default: all at once when the memory allows, 3 x "
                        "3 GiB; each is paused once ready, so none takes CPU while another is measured)")
    s.set_defaults(fn=cmd_demo)

    s = parser("check-data", "contamination check: no evaluation prompt in the training data (by id, hash of the "
               "normalised user turns and hashed-shingle containment); exit 1 on a hit")
    s.add_argument("--data", required=True, help="collection folder(s) (vllm-dflash collect --out), comma-separated")
    s.add_argument("--sets", default="humaneval,chat,sharegpt",
                   help="comma-separated evaluation prompt sets: humaneval, chat, sharegpt, math or JSONL files")
    s.add_argument("--target", default=None,
                   help="target folder whose tokenizer decodes the records (default: SmolLM2-135M-Instruct)")
    s.add_argument("--containment", type=float, default=0.8,
                   help="share of an evaluation text's 8-word shingles inside one training text that counts as a hit")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s.set_defaults(fn=cmd_check_data)

    from vllm_dflash import install_check

    s = parser("check-install", "does this environment serve? vLLM's metadata, a CPU torch, CUDA builds of "
               "torchvision/torchaudio/torchcodec, triton, the csrc/ kernel, the extras: each problem with its fix; "
               "exit 1 when it cannot serve (what scripts/setup.sh fixes; a hand `pip install` needs this)")
    install_check.add_arguments(s)
    s.set_defaults(fn=install_check.run)

    from vllm_dflash.bench.args import add_arguments as add_bench_arguments

    s = parser("bench", "serving benchmark: none / ngram / vLLM's dflash / ours over real `vllm serve`, "
               "concurrency 1/8/32; results under ./bench-results unless --out-dir (benchmarks/bench_serving.py)")
    add_bench_arguments(s)
    s.set_defaults(fn=cmd_bench)

    parser("soak", "the soak test, the served feature check and the checks of sampled output (calibration, mixed "
           "proposal sources): `vllm-dflash soak [--quick] [--preempt] [--features-check] [--calibration] "
           "[--mixed-check] ...` (its own flags: "
           "`vllm-dflash soak --help`; docs/RELIABILITY.md)")
    return p


def main(argv: list[str] | None = None) -> int:
    _env_defaults()
    p = build_parser()
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["soak"]:  # the soak's own command line (vllm_dflash/bench/soak/run.py)
        from vllm_dflash.bench.soak.run import main as soak_main

        return soak_main(args[1:], prog="vllm-dflash soak")
    a = p.parse_args(argv)
    try:
        return a.fn(a)
    except (FileNotFoundError, ValueError) as e:
        print(f"vllm-dflash {a.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
