# SPDX-License-Identifier: Apache-2.0
"""`vllm-dflash collect`: target-generated training data through vLLM, resumable, shardable on Ray.

Layout of an output folder:
  prompts.jsonl.gz   the frozen, ordered prompt list (written once; resuming reuses it)
  part-00000.jsonl.gz ...  completed chunks, each written atomically (tmp + rename)
  manifest.json      settings, counts, skip reasons, throughput (rewritten after every chunk)

A record: {"id", "source", "prompt_ids", "response_ids", "temperature", "finish_reason"}. A share of
prompts (`sample_fraction`, chosen by a hash of the id, so sharding never changes it) is sampled at
`temperature` with a per-prompt seed; the rest is greedy. Prompts that are too long, fail to render
or yield an empty response are counted under a reason and skipped, never fatal.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vllm_dflash.utils import default_dtype, get_logger, read_jsonl

logger = get_logger(__name__)


@dataclass(frozen=True)
class CollectConfig:
    target: str
    out_dir: str
    sources: tuple[str, ...] = ("code-stdlib", "code-codeio", "chat-web", "code-pkgs")
    prompts_file: str | None = None  # JSONL prompt file instead of the built-in sources
    limit: int | None = None
    max_prompt_tokens: int = 768
    max_new_tokens: int = 320
    sample_fraction: float = 0.25
    temperature: float = 0.7
    top_p: float = 0.95
    chunk_size: int = 48
    max_num_seqs: int = 48
    kv_cache_gib: float = 1.0
    seed: int = 0
    shard: tuple[int, int] = (0, 1)  # (index, count): this process handles prompts[index::count]


def _is_sampled(item_id: str, fraction: float) -> bool:
    return int(hashlib.sha1(f"sample:{item_id}".encode()).hexdigest()[:8], 16) % 10_000 < fraction * 10_000


def _seed_of(item_id: str, seed: int) -> int:
    return (int(hashlib.sha1(item_id.encode()).hexdigest()[:8], 16) + seed) % (2**31 - 1)


def _write_atomic(path: Path, text: str, gz: bool = False) -> None:
    tmp = path.with_name(path.name + ".tmp")
    if gz:
        with gzip.open(tmp, "wt") as f:
            f.write(text)
    else:
        tmp.write_text(text)
    os.replace(tmp, path)


def load_records(out_dir: str | Path) -> list[dict[str, Any]]:
    """All records of a collection folder (merged shards included), in part order."""
    out = Path(out_dir)
    recs: list[dict[str, Any]] = []
    for part in sorted(out.glob("part-*.jsonl.gz")) + sorted(out.glob("shard-*/part-*.jsonl.gz")):
        recs.extend(read_jsonl(part))
    return recs


def _frozen_prompts(cfg: CollectConfig) -> list[dict[str, Any]]:
    out = Path(cfg.out_dir)
    path = out / "prompts.jsonl.gz"
    if path.exists():
        return list(read_jsonl(path))
    if cfg.prompts_file:
        from vllm_dflash.data.prompts import load_prompt_file

        items = load_prompt_file(cfg.prompts_file)
    else:
        from vllm_dflash.data.sources import training_prompts

        items = training_prompts(list(cfg.sources), seed=cfg.seed)
    if cfg.limit:
        items = items[: cfg.limit]
    out.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, "".join(json.dumps(it) + "\n" for it in items), gz=True)
    return items


class Collector:
    """Generates responses for one shard of the prompt list with an offline vLLM engine."""

    def __init__(self, cfg: CollectConfig, prompts: list[dict[str, Any]] | None = None):
        self.cfg = cfg
        self.out = Path(cfg.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.prompts = prompts if prompts is not None else _frozen_prompts(cfg)
        idx, count = cfg.shard
        self.mine = self.prompts[idx::count]
        self.llm = None

    def _manifest_path(self) -> Path:
        return self.out / "manifest.json"

    def _load_manifest(self) -> dict[str, Any]:
        if self._manifest_path().exists():
            return json.loads(self._manifest_path().read_text())
        return {"config": {k: v for k, v in asdict(self.cfg).items()}, "done_ids": [], "skipped": {},
                "num_records": 0, "num_response_tokens": 0, "wall_time_s": 0.0, "parts": 0}

    def _engine(self):
        if self.llm is None:
            from vllm import LLM

            self.llm = LLM(model=self.cfg.target, dtype=default_dtype(), max_model_len=self.cfg.max_prompt_tokens +
                           self.cfg.max_new_tokens + 8, max_num_seqs=self.cfg.max_num_seqs, enforce_eager=True,
                           kv_cache_memory_bytes=int(self.cfg.kv_cache_gib * (1 << 30)), seed=self.cfg.seed,
                           disable_log_stats=True)
        return self.llm

    def run(self, progress: bool = True) -> dict[str, Any]:
        from tqdm import tqdm

        man = self._load_manifest()
        done = set(man["done_ids"]) | set(man.get("skipped_ids", []))
        todo = [it for it in self.mine if it["id"] not in done]
        bar = tqdm(total=len(self.mine), initial=len(self.mine) - len(todo), desc=f"collect[{self.cfg.shard[0]}]",
                   unit="prompt", disable=not progress, dynamic_ncols=True)
        for start in range(0, len(todo), self.cfg.chunk_size):
            chunk = todo[start: start + self.cfg.chunk_size]
            t0 = time.perf_counter()
            records, skipped = self._generate(chunk)
            part = self.out / f"part-{man['parts']:05d}.jsonl.gz"
            _write_atomic(part, "".join(json.dumps(r) + "\n" for r in records), gz=True)
            man["parts"] += 1
            man["done_ids"].extend(r["id"] for r in records)
            man.setdefault("skipped_ids", []).extend(i for i, _ in skipped)
            for _, reason in skipped:
                man["skipped"][reason] = man["skipped"].get(reason, 0) + 1
            man["num_records"] += len(records)
            man["num_response_tokens"] += sum(len(r["response_ids"]) for r in records)
            man["wall_time_s"] += time.perf_counter() - t0
            man["tokens_per_s"] = man["num_response_tokens"] / max(man["wall_time_s"], 1e-9)
            _write_atomic(self._manifest_path(), json.dumps(man, indent=1))
            bar.update(len(chunk))
            bar.set_postfix(records=man["num_records"], tok_s=f"{man['tokens_per_s']:.0f}", skipped=sum(man["skipped"].values()))
        bar.close()
        return man

    def _generate(self, chunk: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from vllm_dflash.data.prompts import render

        llm = self._engine()
        tok = llm.get_tokenizer()
        skipped: list[tuple[str, str]] = []
        batch, params, kept = [], [], []
        for it in chunk:
            try:
                ids = render(tok, it)
            except Exception as e:  # noqa: BLE001 - a bad record must not stop the run
                skipped.append((it["id"], f"render_error:{type(e).__name__}"))
                continue
            if len(ids) > self.cfg.max_prompt_tokens:
                skipped.append((it["id"], "prompt_too_long"))
                continue
            if not ids:
                skipped.append((it["id"], "empty_prompt"))
                continue
            sampled = _is_sampled(it["id"], self.cfg.sample_fraction)
            params.append(SamplingParams(max_tokens=self.cfg.max_new_tokens, temperature=self.cfg.temperature if sampled else 0.0,
                                         top_p=self.cfg.top_p if sampled else 1.0,
                                         seed=_seed_of(it["id"], self.cfg.seed) if sampled else None))
            batch.append(TokensPrompt(prompt_token_ids=ids))
            kept.append((it, ids, sampled))
        records = []
        if batch:
            outs = llm.generate(batch, params, use_tqdm=False)
            for (it, ids, sampled), o in zip(kept, outs):
                resp = list(o.outputs[0].token_ids)
                if not resp:
                    skipped.append((it["id"], "empty_response"))
                    continue
                records.append({"id": it["id"], "source": it.get("source", "file"), "prompt_ids": ids,
                                "response_ids": resp, "temperature": self.cfg.temperature if sampled else 0.0,
                                "finish_reason": o.outputs[0].finish_reason})
        return records, skipped


def collect(cfg: CollectConfig, progress: bool = True) -> dict[str, Any]:
    """Single-engine collection into cfg.out_dir (resumes what is there)."""
    return Collector(cfg).run(progress=progress)


def collect_ray(cfg: CollectConfig, num_workers: int, progress: bool = True, address: str | None = None) -> dict[str, Any]:
    """Shard prompts over `num_workers` Ray actors (one vLLM engine each), then merge the shards.

    Each actor writes to out_dir/shard-{i}/ (resumable on its own); the merged manifest sums them.
    In a real cluster each actor lands on its own node / GPU (num_gpus=1 when GPUs exist)."""
    import ray

    prompts = _frozen_prompts(cfg)
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, ignore_reinit_error=True, log_to_driver=progress)
    gpus = 1 if ray.cluster_resources().get("GPU", 0) >= num_workers else 0

    @ray.remote(num_cpus=1, num_gpus=gpus)
    class CollectWorker:
        def run(self, shard_cfg: dict) -> dict:
            c = CollectConfig(**{**shard_cfg, "sources": tuple(shard_cfg["sources"]), "shard": tuple(shard_cfg["shard"])})
            return Collector(c, prompts=prompts_ref).run(progress=False)

    prompts_ref = prompts  # captured by the actor class; shipped once per actor
    workers = [CollectWorker.remote() for _ in range(num_workers)]
    futures = []
    for i, w in enumerate(workers):
        shard_cfg = {**asdict(cfg), "out_dir": str(Path(cfg.out_dir) / f"shard-{i}"), "shard": (i, num_workers)}
        futures.append(w.run.remote(shard_cfg))
    mans = ray.get(futures)
    merged = {"config": asdict(cfg), "ray_workers": num_workers, "num_records": sum(m["num_records"] for m in mans),
              "num_response_tokens": sum(m["num_response_tokens"] for m in mans),
              "skipped": dict(sum((Counter(m["skipped"]) for m in mans), Counter())),
              "shards": [f"shard-{i}" for i in range(num_workers)]}
    _write_atomic(Path(cfg.out_dir) / "manifest.json", json.dumps(merged, indent=1))
    return merged
