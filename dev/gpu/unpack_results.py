# SPDX-License-Identifier: Apache-2.0
"""Reassemble what `job.py` brought back: `python dev/gpu/unpack_results.py FILES_DIR DEST [SOURCE_COLLECTION]`.

data.N pieces -> DEST/gen (a collection folder); runs.N pieces -> DEST/runs/<variant>/... with each `best` draft's
reduced lm_head restored from the target (job.py strips it to halve the transfer) and checked to load."""
import shutil
import sys
import tarfile
from pathlib import Path


def join(src: Path, name: str, dest: Path) -> bool:
    pieces = sorted(src.glob(f"{name}.*"), key=lambda p: int(p.suffix[1:]))
    if not pieces:
        return False
    tar = dest / f"{name}.tar"
    with open(tar, "wb") as f:
        for p in pieces:
            f.write(p.read_bytes())
    with tarfile.open(tar) as t:
        t.extractall(dest, filter="data")
    tar.unlink()
    return True


def complete_manifest(folder: Path, source: str) -> None:
    """Make a GPU generation folder a full collection folder: `done_ids` (the prompt ids answered, so
    `--exclude-collected` skips them), the `config` (sources) and a note on how it was made."""
    import json

    from vllm_dflash.data.collect import decode_part

    man_path = folder / "manifest.json"
    man = json.loads(man_path.read_text())
    records = [r for p in sorted(folder.glob("part-*.npz")) for r in decode_part(p)]
    ids = sorted({r["id"].split("#t")[0] for r in records})
    srcs = sorted({r.get("source", "file") for r in records})
    man["done_ids"] = ids
    man.setdefault("config", {"sources": srcs, "prompts": f"not-yet-collected items of {source}'s frozen prompt list",
                              "temperature": 0.0, "sample_fraction": 0.0})
    man.setdefault("note", "generated on a lent GPU (no vLLM there) by dev/gpu/job.py: the target rebuilt bit-exact "
                   "from the GGUF, transformers generate, greedy, bf16, left-padded batches; multi-turn chats answered "
                   "turn by turn with the target's own replies, like vllm-dflash collect")
    man_path.write_text(json.dumps(man, indent=1))
    print(f"{folder}: {len(ids)} prompt ids, {man['num_response_tokens']} response tokens")


def main() -> None:
    src, dest = Path(sys.argv[1]), Path(sys.argv[2])
    dest.mkdir(parents=True, exist_ok=True)
    print("data:", join(src, "data", dest), "runs:", join(src, "runs", dest))
    if (dest / "gen" / "manifest.json").exists():
        complete_manifest(dest / "gen", sys.argv[3] if len(sys.argv) > 3 else "data/collect/smollm2-v2")
    if (dest / "runs").exists():
        import torch
        from transformers import AutoModelForCausalLM

        from vllm_dflash.model import DFlashDraftModel
        from vllm_dflash.target import resolve_target

        tgt = AutoModelForCausalLM.from_pretrained(str(resolve_target(None)), dtype=torch.float32)
        for best in sorted((dest / "runs").glob("*/best")):
            d = DFlashDraftModel.from_pretrained(best, target=tgt)  # binds lm_head rows from the target via d2t
            d.save_pretrained(best, dtype=torch.bfloat16, fold_feature_scale=False)  # already folded at export
            print(best, f"{(best / 'model.safetensors').stat().st_size / 1e6:.1f} MB")
    for f in src.glob("*.log"):
        shutil.copy(f, dest / f.name)


if __name__ == "__main__":
    main()
