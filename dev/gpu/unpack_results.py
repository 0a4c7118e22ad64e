# SPDX-License-Identifier: Apache-2.0
"""Reassemble what `job.py` brought back: `python dev/gpu/unpack_results.py FILES_DIR DEST`.

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


def main() -> None:
    src, dest = Path(sys.argv[1]), Path(sys.argv[2])
    dest.mkdir(parents=True, exist_ok=True)
    print("data:", join(src, "data", dest), "runs:", join(src, "runs", dest))
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
