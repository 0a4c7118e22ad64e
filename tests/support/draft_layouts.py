# SPDX-License-Identifier: Apache-2.0
"""Tiny DFlash drafts written in each checkpoint layout vLLM 0.32's own `dflash` path loads, and a Hugging Face cache
folder that serves a draft by Hub id offline (tests/vllm/test_draft_layouts.py, tests/unit/test_config.py).

Every layout is built from one of our drafts (config.json + model.safetensors in our, the published, layout) so that
the drafts are the same network: the tensor names are the ones vLLM's loaders read (model_executor/models/
qwen3_dflash.py `DFlashQwen3ForCausalLM.load_weights`: names without the `model.` prefix, `lm_head` kept, `d2t` the
reduced vocabulary's offsets, `t2d` skipped; qwen3_dflash2.py: `layers.N.{attention,mlp}_conv.{base_kernel,
kernel_projection.weight}` and `candidate_selector.{predecessor,successor}_codebook`, `.hidden_projection.weight`).
The configs follow vLLM's readers: transformers_utils/configs/speculators/algos.py (`update_dflash`,
`update_dflash2`) and speculators/base.py (`speculators_config`)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

# keys of a Qwen3 config.json (transformers 5) that a published DFlash checkpoint carries beside ours
QWEN3_EXTRA = {"attention_dropout": 0.0, "initializer_range": 0.02, "max_window_layers": 28, "rope_scaling": None,
               "sliding_window": None, "use_sliding_window": False, "use_cache": True, "bos_token_id": 1,
               "eos_token_id": 2, "transformers_version": "5.19.0"}
LAYER_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "vocab_size", "rms_norm_eps", "max_position_embeddings", "attention_bias",
              "hidden_act", "rope_theta")


def _write(dst: Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst / "model.safetensors"))
    return dst


def _ours(src: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    return json.loads((src / "config.json").read_text()), load_file(str(src / "model.safetensors"))


def published(src: Path, dst: Path, *, causal: bool | None = None) -> Path:
    """The published (z-lab) layout: `DFlashDraftModel`, `auto_map`, `dflash_config` {mask_token_id,
    target_layer_ids}, top-level block_size / num_target_layers, the Qwen3 keys, `layer_types`; `causal` set:
    `dflash_config.causal` (vLLM's `_dflash_layer_causal` then applies it to every layer)."""
    cfg, tensors = _ours(src)
    dcfg = {k: cfg["dflash_config"][k] for k in ("mask_token_id", "target_layer_ids")}
    if causal is not None:
        dcfg["causal"] = causal
    out = {"architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
           "model_type": "qwen3", "block_size": cfg["block_size"], "num_target_layers": cfg["num_target_layers"],
           "dflash_config": dcfg, **{k: cfg[k] for k in LAYER_KEYS}, **QWEN3_EXTRA,
           "layer_types": ["full_attention"] * cfg["num_hidden_layers"], "tie_word_embeddings": False,
           "torch_dtype": "bfloat16"}
    return _write(dst, out, tensors)


def _speculators_config(cfg: dict, kind: str, verifier: str, draft_vocab_size: int) -> dict:
    layer = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], **{k: cfg[k] for k in LAYER_KEYS},
             "layer_types": ["full_attention"] * cfg["num_hidden_layers"], "sliding_window": None,
             "use_sliding_window": False, "tie_word_embeddings": False}
    return {
        "architectures": ["DFlashSpeculator"], "speculators_model_type": kind, "speculators_version": "0.5.0",
        "speculators_config": {
            "algorithm": kind, "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": cfg["block_size"] - 1}],
            "verifier": {"name_or_path": verifier, "architectures": ["Qwen3ForCausalLM"]}},
        "transformer_layer_config": layer, "draft_vocab_size": draft_vocab_size, "block_size": cfg["block_size"],
        # speculators counts target layers from the embedding (vLLM subtracts 1: algos.py, #40727)
        "aux_hidden_state_layer_ids": [i + 1 for i in cfg["dflash_config"]["target_layer_ids"]],
        "mask_token_id": cfg["dflash_config"]["mask_token_id"], "target_hidden_size": None,
        "sample_from_anchor": False, "sliding_window_non_causal": False, "torch_dtype": "bfloat16"}


def speculators(src: Path, dst: Path, target: Path, *, draft_vocab_size: int | None = None) -> Path:
    """The `speculators` layout (`speculators_model_type: "dflash"`), as the speculators library saves it (no
    `model_type`, no `embed_tokens`; sliding_window_non_causal false, its default for dflash). draft_vocab_size
    below the target's: the reduced vocabulary, `lm_head.weight` [Vd, H] cut from the target's LM head, `d2t`
    [Vd] (target id - draft id) and `t2d` [V] (which target ids the draft scores)."""
    cfg, tensors = _ours(src)
    vocab = cfg["vocab_size"]
    draft_vocab_size = draft_vocab_size or vocab
    if draft_vocab_size < vocab:
        g = torch.Generator().manual_seed(0)
        keep = torch.randperm(vocab, generator=g)[:draft_vocab_size].sort().values  # [Vd] target ids, increasing
        head = load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"]  # tied embeddings
        tensors["lm_head.weight"] = head[keep]
        tensors["d2t"] = keep - torch.arange(draft_vocab_size)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[keep] = True
        tensors["t2d"] = t2d
    return _write(dst, _speculators_config(cfg, "dflash", str(target), draft_vocab_size), tensors)


def _dflash2_tensors(tensors: dict, cfg: dict, taps: int, group: int, rank: int) -> dict[str, torch.Tensor]:
    """The DFlash2 extras around our layers: per layer an attention and an MLP grouped convolution (base kernel
    [2, taps, H]: identity at tap 0, so the network stays close to the draft it is built from; kernel projection
    [2 * taps * H / group, H], small random) and the candidate selector's codebooks [V, rank] and projection."""
    g = torch.Generator().manual_seed(0)
    hidden, vocab = cfg["hidden_size"], cfg["vocab_size"]
    out = dict(tensors)
    for i in range(cfg["num_hidden_layers"]):
        for conv in ("attention_conv", "mlp_conv"):
            base = torch.zeros(2, taps, hidden)
            base[:, 0] = 1.0
            out[f"layers.{i}.{conv}.base_kernel"] = base.to(torch.bfloat16)
            out[f"layers.{i}.{conv}.kernel_projection.weight"] = (
                0.01 * torch.randn(2 * taps * (hidden // group), hidden, generator=g)).to(torch.bfloat16)
    for name, shape in (("predecessor_codebook", (vocab, rank)), ("successor_codebook", (vocab, rank)),
                        ("hidden_projection.weight", (rank, hidden))):
        out[f"candidate_selector.{name}"] = (0.02 * torch.randn(*shape, generator=g)).to(torch.bfloat16)
    return out


def dflash2(src: Path, dst: Path, target: Path, *, taps: int = 2, group: int = 32, rank: int = 8,
            top_k: int = 4) -> Path:
    """A DFlash2 draft in the speculators layout (`speculators_model_type: "dflash2"`: vLLM serves it under
    method dflash as `DFlash2DraftModel`, conv_* and selector_* copied into dflash_config)."""
    cfg, tensors = _ours(src)
    out = _speculators_config(cfg, "dflash2", str(target), cfg["vocab_size"])
    out.update(conv_kernel_size=taps, conv_group_size=group, selector_rank=rank, selector_top_k=top_k,
               sliding_window_non_causal=True)  # the speculators default for dflash2
    return _write(dst, out, _dflash2_tensors(tensors, cfg, taps, group, rank))


def dflash2_published(src: Path, dst: Path, *, taps: int = 2, group: int = 32, rank: int = 8,
                      top_k: int = 4) -> Path:
    """A DFlash2 draft in the published layout (`DFlash2DraftModel`, the conv / selector keys in dflash_config)."""
    cfg, tensors = _ours(src)
    published(src, dst)
    out = json.loads((dst / "config.json").read_text())
    out["architectures"] = ["DFlash2DraftModel"]
    out["dflash_config"].update(conv_kernel_size=taps, conv_group_size=group, selector_rank=rank,
                                selector_top_k=top_k)
    return _write(dst, out, _dflash2_tensors(tensors, cfg, taps, group, rank))


def hub_cache(folder: Path, cache: Path, repo_id: str, commit: str = "0123456789abcdef" * 2 + "01234567",
              revision: str = "main") -> Path:
    """Put `folder` into a Hugging Face hub cache (HF_HUB_CACHE) as repo `repo_id` at `commit`, with the branch
    `revision` pointing at it: models--ORG--NAME/{refs/<revision>, snapshots/<commit>/<files>}. -> the snapshot."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    shutil.copytree(folder, snap, dirs_exist_ok=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    return snap
