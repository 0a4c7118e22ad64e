# SPDX-License-Identifier: Apache-2.0
"""The main job: SmolLM2-135M-Instruct served by `vllm serve` with our DFlash drafter vs without
speculation, real HumanEval chat prompts through the OpenAI client; prints τ and the speedup."""
from __future__ import annotations

import json
import time
from pathlib import Path

from vllm_dflash.utils import get_logger

logger = get_logger(__name__)


# The trained SmolLM2 draft ships with a source checkout (models/<name> beside the package), not with an installed
# package. Only the default target uses it, and only after resolve_draft_arg() found it there.
BUNDLED_DRAFT_NAME = "SmolLM2-135M-Instruct-DFlash-b8"
UNTRAINED = "untrained"  # --draft untrained: a random draft shaped for the target (expect τ ≈ 1)


def checkout_draft_dir() -> Path:
    """Where a source checkout keeps its trained draft for the default target. The folder exists only when the
    package runs from a checkout (pip install -e .); callers must check (resolve_draft_arg does)."""
    return Path(__file__).resolve().parent.parent / "models" / BUNDLED_DRAFT_NAME


def untrained_draft(target_dir: Path, block_size: int = 8, mask_token_id: int | None = None) -> Path:
    """A random (untrained) draft shaped for the target, built once in the cache (one folder per target config).
    mask_token_id None: the id known for the target family; any other target raises, naming --mask-token-id."""
    import hashlib

    from vllm_dflash.config import DFlashConfig
    from vllm_dflash.model import DFlashDraftModel
    from vllm_dflash.target import cache_root

    raw = (Path(target_dir) / "config.json").read_text()
    cfg = DFlashConfig.for_target(json.loads(raw), num_layers=1, block_size=block_size, mask_token_id=mask_token_id)
    key = hashlib.sha1(raw.encode() + f"|{cfg.mask_token_id}".encode()).hexdigest()[:10]
    out = cache_root() / f"untrained-draft-b{block_size}-{key}"
    if not (out / "model.safetensors").is_file():
        DFlashDraftModel(cfg).save_pretrained(out)
    return out


def ensure_draft(draft: str | Path, target_dir: Path) -> tuple[Path, bool]:
    """The draft folder, or an untrained draft for the target (created once in the cache) if it is missing.
    (path, untrained?). For scripts that want that fallback; the CLI resolves --draft with resolve_draft_arg."""
    draft = Path(draft)
    if (draft / "config.json").is_file():
        return draft, False
    return untrained_draft(target_dir), True


def resolve_draft_arg(draft: str | Path | None, target_dir: Path, *, default_target: bool = True,
                      flag: str = "--draft") -> tuple[Path, bool]:
    """A --draft value -> (draft folder, untrained?).

    A folder: must hold config.json. 'untrained': a random draft shaped for the target (built once in the cache).
    None: the trained draft of a source checkout, for the default target only; anything missing fails naming the fix
    (an installed package has no bundled draft)."""
    if draft is not None and str(draft) == UNTRAINED:
        return untrained_draft(target_dir), True
    if draft is not None:
        if not (Path(draft) / "config.json").is_file():
            raise FileNotFoundError(f"{flag} {str(draft)!r} has no config.json. Fix: pass a DFlash draft folder "
                                    f"(`vllm-dflash train` writes <out>/draft), or {flag} {UNTRAINED}")
        return Path(draft), False
    if not default_target:
        raise ValueError(f"no {flag} given: the bundled draft is for the default target only. Fix: pass {flag} "
                         f"<draft folder trained for this target>, or {flag} {UNTRAINED}")
    bundled = checkout_draft_dir()
    if not (bundled / "config.json").is_file():
        raise FileNotFoundError(
            f"no {flag} given and no bundled draft at {bundled} (it comes with a source checkout of vllm-dflash, not "
            f"with an installed package). Fix: pass {flag} <draft folder> (e.g. `vllm-dflash train` then "
            f"`vllm-dflash export`), or {flag} {UNTRAINED} for a random draft (τ ≈ 1, a slowdown)")
    return bundled, False


def _drive(server, prompts: list[list[dict]], max_tokens: int) -> tuple[list[str], int, float]:
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="none")
    client.chat.completions.create(model="target", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)  # warm-up
    texts, n_tokens, t0 = [], 0, time.perf_counter()
    for messages in prompts:
        r = client.chat.completions.create(model="target", messages=messages, max_tokens=max_tokens, temperature=0.0)
        texts.append(r.choices[0].message.content)
        n_tokens += r.usage.completion_tokens
    return texts, n_tokens, time.perf_counter() - t0


def demo_configs(draft_dir: Path, block_size: int) -> list[tuple[str, dict | None]]:
    """Side by side: no speculation, vLLM's prompt lookup (its best measured k), and our drafter as a user gets it
    with no extra keys (adaptive: DFlash, prompt lookup or both per request-step)."""
    return [("no speculation", None),
            ("vLLM n-gram (k=4)", {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                                   "prompt_lookup_min": 2}),
            ("vllm_dflash", {"method": "dflash", "model": str(draft_dir), "num_speculative_tokens": block_size - 1})]


def run_demo(draft: str | Path | None = None, num_prompts: int = 4, max_tokens: int = 128, mode: str = "serve",
             dtype: str | None = None, eager: bool = False) -> int:
    from transformers import AutoTokenizer

    from vllm_dflash.config import DFlashConfig
    from vllm_dflash.data.prompts import humaneval_prompts
    from vllm_dflash.exactness import explain, summarize, verdict_line
    from vllm_dflash.serving import Server, acceptance_length, tokens_per_forward
    from vllm_dflash.target import prepare_target
    from vllm_dflash.utils import cpu_kind, default_dtype

    target = prepare_target()
    draft_dir, untrained = resolve_draft_arg(draft, target)
    if untrained:
        logger.warning("using an UNTRAINED draft (%s); expect τ ≈ 1 and a slowdown. Train one with "
                       "`vllm-dflash train` (see README).", draft_dir)
    items = humaneval_prompts(num_prompts)
    if mode == "reference":
        from vllm_dflash.evaluate import evaluate_reference, format_report

        report = evaluate_reference(target=str(target), draft=draft_dir, prompts="humaneval", limit=num_prompts,
                                    max_new_tokens=max_tokens)
        print(format_report(report))
        return 0

    dtype = dtype or default_dtype()
    tok = AutoTokenizer.from_pretrained(str(target))
    cfg = DFlashConfig.from_pretrained(draft_dir)
    prompts = [it["messages"] for it in items]
    results: dict[str, dict] = {}
    for name, sc in demo_configs(draft_dir, cfg.block_size):
        how = "eager" if eager else "torch.compile: the first start compiles, about 1-2 min on 2 cores"
        print(f"starting vllm serve ({name}; {dtype}, {how}) ...", flush=True)
        t0 = time.perf_counter()
        with Server(str(target), speculative_config=sc, dtype=dtype, enforce_eager=eager).start(
                timeout=900 if eager else 1500) as srv:
            start_s = time.perf_counter() - t0
            before = srv.metrics()
            texts, n, dt = _drive(srv, prompts, max_tokens)
            after = srv.metrics()
            r = {"texts": texts, "tokens": n, "seconds": dt, "tok_s": n / dt, "start_s": start_s,
                 "tau": acceptance_length(after, before) if sc else None,
                 "per_forward": tokens_per_forward(after, before)}
            if sc is not None:  # explain each differing output on this server (the target's top-2 margin there)
                base = results["no speculation"]["texts"]
                divs = [d for it, a, b in zip(items, base, texts) if (d := explain(srv.url, tok, it, a, b, dtype))]
                r["exact"] = summarize(len(texts), divs, dtype)
        results[name] = r
    print(f"\nSmolLM2-135M-Instruct, {len(prompts)} HumanEval chat prompts, greedy, max_tokens {max_tokens}, "
          f"concurrency 1, {dtype}, {'eager' if eager else 'torch.compile (vLLM default)'}; CPU: {cpu_kind()}")
    print(f"draft: {draft_dir}{'  (UNTRAINED)' if untrained else ''}")
    base = results["no speculation"]
    print(f"  {'configuration':22s} {'tok/s':>7s} {'speedup':>8s} {'tokens/forward':>15s} {'τ (per draft)':>14s}  start-up")
    for name, r in results.items():
        tau = "–" if r["tau"] is None else f"{r['tau']:.2f}"
        pf = "–" if r["per_forward"] is None else f"{r['per_forward']:.2f}"
        print(f"  {name:22s} {r['tok_s']:7.1f} {r['tok_s'] / base['tok_s']:7.2f}x {pf:>15s} {tau:>14s}  "
              f"{r['start_s']:.0f} s")
    failed = False
    for name, r in results.items():
        if "exact" in r:
            print(f"  {name}: {verdict_line(r['exact'])}")
            failed |= not r["exact"]["passed"]
    print("tokens/forward: generated tokens per target forward (engine step); τ: vLLM's mean acceptance length, "
          "counted only on steps that proposed drafts.")
    return 1 if failed else 0
