# SPDX-License-Identifier: Apache-2.0
"""`vllm-dflash collect`: target-generated training data through vLLM, resumable, shardable on Ray.

Layout of an output folder:
  prompt_ids.txt.gz  the frozen, ordered prompt ids (written once; resuming rebuilds the prompts from the same
                     sources in this order; older folders hold the full list as prompts.jsonl.gz)
  part-00000.npz ... completed chunks, each written atomically (tmp + rename): token ids as one compressed
                     uint16 array (uint32 for vocabularies past 65,535) with offsets, plus the records' metadata
                     (older folders hold part-*.jsonl.gz; both are read)
  manifest.json      settings, counts, skip reasons, throughput, dtype, compile mode and CPU kind (rewritten
                     after every chunk); the mask token the drafts will use (`mask_token_id`, from --mask-token-id or
                     the known table, else null) and how often the target itself wrote it in its responses
                     (`mask_token_in_responses`: tokens, `mask_token_responses`: responses holding it; both should
                     stay 0, a token the target writes is a bad mask)

A record: {"id", "source", "prompt_ids", "response_ids", "temperature", "finish_reason"}. Multi-turn items
(`followups`, e.g. ShareGPT) give one record per turn, id `ID#tK`: turn K's prompt is the conversation so far
with the target's OWN earlier replies, so later turns are what a served chat model really sees. A share of
prompts (`sample_fraction`, chosen by a hash of the id, so sharding never changes it) is sampled at
`temperature` with a per-prompt seed; the rest is greedy. Prompts that are too long, fail to render
or yield an empty response are counted under a reason and skipped, never fatal.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vllm_dflash.utils import cpu_has_bf16, default_dtype, get_logger, read_jsonl

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
    enforce_eager: bool = False  # False = vLLM's default (torch.compile): several times faster on CPU
    dtype: str | None = None  # None = default_dtype() (bf16 where the CPU has it, else fp32)
    exclude_collected: tuple[str, ...] = ()  # other collection folders: prompts they already answered are skipped
    mask_token_id: int | None = None  # the drafts' mask token: recorded, and counted in the target's responses


def resolve_collect_mask(target: str | Path, mask_token_id: int | None) -> int | None:
    """--mask-token-id of collect: as given, else the id known for the target family, else None (nothing counted)."""
    if mask_token_id is not None:
        return mask_token_id
    from vllm_dflash.config import known_mask_token_id

    cfg_file = Path(target) / "config.json"
    return known_mask_token_id(json.loads(cfg_file.read_text())) if cfg_file.is_file() else None


def count_mask(records: list[dict[str, Any]], mask_token_id: int | None) -> tuple[int, int]:
    """(mask tokens the target wrote, responses holding at least one) over `records`; (0, 0) without a mask."""
    if mask_token_id is None:
        return 0, 0
    counts = [list(r["response_ids"]).count(mask_token_id) for r in records]
    return sum(counts), sum(c > 0 for c in counts)


def warn_mask_in_responses(man: dict[str, Any], where: str | Path) -> None:
    n, n_resp = man.get("mask_token_in_responses", 0), man.get("mask_token_responses", 0)
    if n:
        logger.warning("collect: the target wrote the mask token %d %d times in %d responses (%s): a draft trained with "
                       "it cannot tell a masked position from that real token. Fix: pick a token id the target never "
                       "reads or writes (docs/MASK_TOKEN.md) and pass it as --mask-token-id to collect (to check it) "
                       "and to train", man.get("mask_token_id"), n, n_resp, where)


def _is_sampled(item_id: str, fraction: float) -> bool:
    return int(hashlib.sha1(f"sample:{item_id}".encode()).hexdigest()[:8], 16) % 10_000 < fraction * 10_000


def opt_in_to_fixes() -> None:
    """The collector's engine runs no DFlash drafter, so the plugin's vLLM bug fixes would not act in it (the walls);
    it needs one of them: seeded sampling with a chunked prefill ends vLLM's engine on CPU ('CPU Generator does not
    use offset', integration/patches/generator_rewind.py), which a sampled collection of long prompts hits. So this
    process opts in (DFLASH_VLLM_EXTRAS=fixes, inherited by the engine's processes) unless the caller chose a level."""
    from vllm_dflash import settings

    if settings.raw_env("vllm_extras") is None:
        name = settings.env_name("vllm_extras")
        os.environ[name] = "fixes"
        logger.info("collect: %s=fixes for the collector's engine (the plugin's vLLM bug fixes, e.g. seeded sampling "
                    "with a chunked prefill on CPU)", name)


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


def encode_part(records: list[dict[str, Any]]) -> bytes:
    """Records -> compressed npz bytes: all prompt+response ids in one uint16 array (uint32 if any id > 65535)."""
    seqs = [list(r["prompt_ids"]) + list(r["response_ids"]) for r in records]
    flat = [t for s in seqs for t in s]
    dt = np.uint16 if (not flat or max(flat) < 65536) else np.uint32
    meta = [{k: v for k, v in r.items() if k not in ("prompt_ids", "response_ids")} for r in records]
    buf = io.BytesIO()
    np.savez_compressed(buf, tokens=np.asarray(flat, dtype=dt),  # [sum of lengths]
                        offsets=np.cumsum([0] + [len(s) for s in seqs]).astype(np.int64),  # [R+1]
                        prompt_lens=np.asarray([len(r["prompt_ids"]) for r in records], dtype=np.int32),  # [R]
                        meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
    return buf.getvalue()


def decode_part(path: Path) -> list[dict[str, Any]]:
    with np.load(path) as z:
        toks, off, plen = z["tokens"].astype(np.int64), z["offsets"], z["prompt_lens"]
        meta = json.loads(z["meta"].tobytes().decode())
    out = []
    for i, m in enumerate(meta):
        seq = toks[off[i]: off[i + 1]].tolist()
        out.append({**m, "prompt_ids": seq[: plen[i]], "response_ids": seq[plen[i]:]})
    return out


def _parts(out: Path) -> list[Path]:
    found = [p for pat in ("part-*.jsonl.gz", "part-*.npz") for p in out.glob(pat)]
    return sorted(found, key=lambda p: p.name)


def load_records(out_dir: str | Path) -> list[dict[str, Any]]:
    """All records of a collection folder (merged shards included), in part order."""
    out = Path(out_dir)
    recs: list[dict[str, Any]] = []
    for part in _parts(out) + [p for d in sorted(out.glob("shard-*")) for p in _parts(d)]:
        recs.extend(decode_part(part) if part.suffix == ".npz" else read_jsonl(part))
    return recs


def collected_ids(folders) -> set[str]:
    """Prompt ids other collection folders already answered (their manifests' done_ids, shards included): a
    collection resumed on another machine, or a GPU run that answered part of the same list, is not repeated."""
    ids: set[str] = set()
    for folder in folders:
        for man in [Path(folder) / "manifest.json", *sorted(Path(folder).glob("shard-*/manifest.json"))]:
            if not man.exists():
                raise FileNotFoundError(f"exclude_collected: {man} is missing. Fix: pass a collection folder "
                                        "(vllm-dflash collect --out)")
            m = json.loads(man.read_text())
            ids.update(m.get("done_ids", ()))
            ids.update(m.get("skipped_ids", ()))
    return ids


def _source_prompts(cfg: CollectConfig) -> list[dict[str, Any]]:
    if cfg.prompts_file:
        from vllm_dflash.data.prompts import load_prompt_file

        return load_prompt_file(cfg.prompts_file)
    from vllm_dflash.data.sources import training_prompts

    return training_prompts(list(cfg.sources), seed=cfg.seed)


def _frozen_prompts(cfg: CollectConfig) -> list[dict[str, Any]]:
    """The ordered prompt list of a collection folder, frozen at its first start. Only the ids are stored
    (prompt_ids.txt.gz, a few hundred KB instead of the prompts' text); a resume rebuilds the items from the same
    sources (pinned packages) and keeps that order, dropping ids a source no longer yields (logged). Older folders
    hold the full list (prompts.jsonl.gz) and are read as they are."""
    out = Path(cfg.out_dir)
    legacy = out / "prompts.jsonl.gz"
    if legacy.exists():
        return list(read_jsonl(legacy))
    order = out / "prompt_ids.txt.gz"
    items = _source_prompts(cfg)
    if order.exists():
        by_id = {it["id"]: it for it in items}
        with gzip.open(order, "rt") as f:
            ids = f.read().splitlines()
        missing = sum(i not in by_id for i in ids)
        if missing:
            logger.warning("collect: %d of %d frozen prompt ids are no longer produced by the sources; skipped",
                           missing, len(ids))
        return [by_id[i] for i in ids if i in by_id]
    if cfg.limit:
        items = items[: cfg.limit]
    out.mkdir(parents=True, exist_ok=True)
    _write_atomic(order, "".join(it["id"] + "\n" for it in items), gz=True)
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
        self.dtype = cfg.dtype or default_dtype()

    def _manifest_path(self) -> Path:
        return self.out / "manifest.json"

    def _load_manifest(self) -> dict[str, Any]:
        if self._manifest_path().exists():
            return json.loads(self._manifest_path().read_text())
        return {"config": {k: v for k, v in asdict(self.cfg).items()}, "done_ids": [], "skipped": {},
                "num_records": 0, "num_response_tokens": 0, "wall_time_s": 0.0, "parts": 0}

    def _engine(self):
        if self.llm is None:
            opt_in_to_fixes()
            from vllm import LLM

            self.llm = LLM(model=self.cfg.target, dtype=self.dtype, max_model_len=self.cfg.max_prompt_tokens +
                           self.cfg.max_new_tokens + 8, max_num_seqs=self.cfg.max_num_seqs,
                           enforce_eager=self.cfg.enforce_eager,
                           kv_cache_memory_bytes=int(self.cfg.kv_cache_gib * (1 << 30)), seed=self.cfg.seed,
                           disable_log_stats=True)
        return self.llm

    def _sync_mask(self, man: dict[str, Any]) -> None:
        """Record this run's mask token; a folder collected without it (or with another) is recounted once from its
        parts (a few seconds: reading parts, no generation)."""
        mask = self.cfg.mask_token_id
        if "mask_token_in_responses" in man and man.get("mask_token_id") == mask:
            return
        man["mask_token_id"] = mask
        records = [r for part in _parts(self.out)
                   for r in (decode_part(part) if part.suffix == ".npz" else read_jsonl(part))]
        man["mask_token_in_responses"], man["mask_token_responses"] = count_mask(records, mask)

    def run(self, progress: bool = True) -> dict[str, Any]:
        from tqdm import tqdm

        man = self._load_manifest()
        self._sync_mask(man)
        done = set(man["done_ids"]) | set(man.get("skipped_ids", [])) | collected_ids(self.cfg.exclude_collected)
        todo = [it for it in self.mine if it["id"] not in done]
        bar = tqdm(total=len(self.mine), initial=len(self.mine) - len(todo), desc=f"collect[{self.cfg.shard[0]}]",
                   unit="prompt", disable=not progress, dynamic_ncols=True)
        for start in range(0, len(todo), self.cfg.chunk_size):
            chunk = todo[start: start + self.cfg.chunk_size]
            t0 = time.perf_counter()
            records, skipped = self._generate(chunk)
            part = self.out / f"part-{man['parts']:05d}.npz"
            tmp = part.with_name(part.name + ".tmp")
            tmp.write_bytes(encode_part(records))
            os.replace(tmp, part)
            man["parts"] += 1
            man["done_ids"].extend(r["id"] for r in records)
            man.setdefault("skipped_ids", []).extend(i for i, _ in skipped)
            for _, reason in skipped:
                man["skipped"][reason] = man["skipped"].get(reason, 0) + 1
            man["num_records"] += len(records)
            man["num_response_tokens"] += sum(len(r["response_ids"]) for r in records)
            n_mask, n_mask_resp = count_mask(records, self.cfg.mask_token_id)
            man["mask_token_in_responses"] += n_mask
            man["mask_token_responses"] += n_mask_resp
            man["wall_time_s"] += time.perf_counter() - t0
            man["tokens_per_s"] = man["num_response_tokens"] / max(man["wall_time_s"], 1e-9)
            man["last_chunk"] = {"tokens_per_s": sum(len(r["response_ids"]) for r in records) /
                                 max(time.perf_counter() - t0, 1e-9), "dtype": self.dtype,
                                 "compiled": not self.cfg.enforce_eager, "cpu": _cpu_kind(),
                                 "omp_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")}
            _write_atomic(self._manifest_path(), json.dumps(man, indent=1))
            bar.update(len(chunk))
            bar.set_postfix(records=man["num_records"], tok_s=f"{man['tokens_per_s']:.0f}", skipped=sum(man["skipped"].values()))
        bar.close()
        warn_mask_in_responses(man, self.out)
        return man

    def _params(self, item_id: str):
        from vllm import SamplingParams

        sampled = _is_sampled(item_id, self.cfg.sample_fraction)
        return sampled, SamplingParams(max_tokens=self.cfg.max_new_tokens,
                                       temperature=self.cfg.temperature if sampled else 0.0,
                                       top_p=self.cfg.top_p if sampled else 1.0,
                                       seed=_seed_of(item_id, self.cfg.seed) if sampled else None)

    def _generate(self, chunk: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
        """One chunk, turn by turn: turn K+1 of a conversation is rendered from its messages so far plus the
        target's own turn-K reply. A prompt that fails at turn 0 skips the item; later turns are just dropped."""
        from vllm.inputs import TokensPrompt

        from vllm_dflash.data.prompts import render

        llm = self._engine()
        tok = llm.get_tokenizer()
        skipped: list[tuple[str, str]] = []
        records: list[dict[str, Any]] = []
        # active conversations: (item, messages so far, remaining followups, turn index)
        active = [(it, list(it["messages"]) if "messages" in it else None, list(it.get("followups", ())), 0)
                  for it in chunk]
        while active:
            batch, params, kept = [], [], []
            for it, msgs, rest, turn in active:
                rid = it["id"] if turn == 0 else f"{it['id']}#t{turn}"
                try:
                    ids = render(tok, it if msgs is None else {"messages": msgs})
                except Exception as e:  # noqa: BLE001 - a bad record must not stop the run
                    if turn == 0:
                        skipped.append((it["id"], f"render_error:{type(e).__name__}"))
                    continue
                if len(ids) > self.cfg.max_prompt_tokens or not ids:
                    if turn == 0:
                        skipped.append((it["id"], "prompt_too_long" if ids else "empty_prompt"))
                    continue
                sampled, sp = self._params(rid)
                params.append(sp)
                batch.append(TokensPrompt(prompt_token_ids=ids))
                kept.append((it, msgs, rest, turn, rid, ids, sampled))
            nxt = []
            if batch:
                outs = llm.generate(batch, params, use_tqdm=False)
                for (it, msgs, rest, turn, rid, ids, sampled), o in zip(kept, outs):
                    resp = list(o.outputs[0].token_ids)
                    if not resp:
                        if turn == 0:
                            skipped.append((it["id"], "empty_response"))
                        continue
                    records.append({"id": rid, "source": it.get("source", "file"), "prompt_ids": ids,
                                    "response_ids": resp, "temperature": self.cfg.temperature if sampled else 0.0,
                                    "finish_reason": o.outputs[0].finish_reason, "turn": turn})
                    if rest and msgs is not None:
                        reply = tok.decode(resp, skip_special_tokens=True)
                        nxt.append((it, msgs + [{"role": "assistant", "content": reply},
                                                {"role": "user", "content": rest[0]}], rest[1:], turn + 1))
            active = nxt
        return records, skipped


def _cpu_kind() -> str:
    return f"{platform.machine()} {'avx512_bf16' if cpu_has_bf16() else 'no-bf16 (AVX2-class)'}"


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
              "mask_token_id": cfg.mask_token_id,
              "mask_token_in_responses": sum(m.get("mask_token_in_responses", 0) for m in mans),
              "mask_token_responses": sum(m.get("mask_token_responses", 0) for m in mans),
              "shards": [f"shard-{i}" for i in range(num_workers)]}
    _write_atomic(Path(cfg.out_dir) / "manifest.json", json.dumps(merged, indent=1))
    warn_mask_in_responses(merged, cfg.out_dir)
    return merged
