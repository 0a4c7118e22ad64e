# SPDX-License-Identifier: Apache-2.0
"""The main job: SmolLM2-135M-Instruct served by `vllm serve` with our DFlash drafter vs without
speculation, real HumanEval chat prompts through the OpenAI client; prints τ and the speedup."""
from __future__ import annotations

import json
import time
from pathlib import Path

from vllm_dflash.utils import get_logger

logger = get_logger(__name__)


def ensure_draft(draft: str | Path, target_dir: Path) -> tuple[Path, bool]:
    """The draft folder, or an untrained draft for the target (created once in the cache) if it is missing."""
    draft = Path(draft)
    if (draft / "config.json").is_file():
        return draft, False
    from vllm_dflash.config import DFlashConfig
    from vllm_dflash.model import DFlashDraftModel
    from vllm_dflash.target import cache_root

    untrained = cache_root() / "untrained-draft-b8"
    if not (untrained / "model.safetensors").is_file():
        cfg = DFlashConfig.for_target(json.loads((target_dir / "config.json").read_text()), num_layers=1,
                                      block_size=8, mask_token_id=16)
        DFlashDraftModel(cfg).save_pretrained(untrained)
    return untrained, True


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


def run_demo(draft: str | Path, num_prompts: int = 4, max_tokens: int = 128, mode: str = "serve") -> int:
    from vllm_dflash.config import DFlashConfig
    from vllm_dflash.data.prompts import humaneval_prompts
    from vllm_dflash.target import prepare_target

    target = prepare_target()
    draft_dir, untrained = ensure_draft(draft, target)
    if untrained:
        logger.warning("no trained draft at %s: using an UNTRAINED draft (%s); expect τ ≈ 1 and a slowdown. "
                       "Train one with `vllm-dflash train` (see README).", draft, draft_dir)
    items = humaneval_prompts(num_prompts)
    if mode == "reference":
        from vllm_dflash.evaluate import evaluate_reference, format_report

        report = evaluate_reference(target=str(target), draft=draft_dir, prompts="humaneval", limit=num_prompts,
                                    max_new_tokens=max_tokens)
        print(format_report(report))
        return 0

    from vllm_dflash.serving import Server, acceptance_length

    cfg = DFlashConfig.from_pretrained(draft_dir)
    spec = {"method": "dflash", "model": str(draft_dir), "num_speculative_tokens": cfg.block_size - 1}
    prompts = [it["messages"] for it in items]
    results = {}
    for name, sc in (("no speculation", None), ("vllm_dflash", spec)):
        print(f"starting vllm serve ({name}) ...", flush=True)
        with Server(str(target), speculative_config=sc) as srv:
            texts, n, dt = _drive(srv, prompts, max_tokens)
            tau = acceptance_length(srv.metrics()) if sc else None
        results[name] = {"texts": texts, "tokens": n, "seconds": dt, "tok_s": n / dt, "tau": tau}
    base, ours = results["no speculation"], results["vllm_dflash"]
    same = sum(a == b for a, b in zip(base["texts"], ours["texts"]))
    print(f"\nSmolLM2-135M-Instruct, {len(prompts)} HumanEval chat prompts, greedy, max_tokens {max_tokens}, concurrency 1")
    print(f"  draft: {draft_dir}{'  (UNTRAINED)' if untrained else ''}")
    print(f"  no speculation : {base['tok_s']:7.1f} tok/s")
    print(f"  vllm_dflash    : {ours['tok_s']:7.1f} tok/s   τ = {ours['tau']:.2f}" if ours["tau"] else
          f"  vllm_dflash    : {ours['tok_s']:7.1f} tok/s   τ = n/a")
    print(f"  speedup        : {ours['tok_s'] / base['tok_s']:.2f}x")
    print(f"  greedy outputs identical: {same}/{len(prompts)}")
    return 0
