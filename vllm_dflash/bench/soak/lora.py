# SPDX-License-Identifier: Apache-2.0
"""A tiny LoRA adapter for the soak's target, made locally in a second (peft's on-disk format, written with torch and
safetensors: peft itself is not needed). Its weights are small random values, so requests through it give outputs
that differ from the base model's but stay deterministic; the soak checks them greedy-vs-alone like any other."""
from __future__ import annotations

import json
from pathlib import Path

LORA_NAME = "soak-lora"  # the adapter's served model name (--lora-modules)
TARGET_MODULES = ("q_proj", "v_proj")


def make_lora(target: Path, out: Path, rank: int = 4, seed: int = 0, scale: float = 0.05) -> Path:
    """Write adapter_config.json + adapter_model.safetensors for `target` (a Llama / Qwen-style HF folder) into
    `out`: rank-`rank` A and B matrices (normal, standard deviation `scale`) on every layer's q_proj and v_proj.
    -> out."""
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((target / "config.json").read_text())
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
    outs = {"q_proj": cfg["num_attention_heads"] * head_dim,
            "v_proj": cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * head_dim}
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(layers):
        for m in TARGET_MODULES:
            key = f"base_model.model.model.layers.{i}.self_attn.{m}"
            tensors[f"{key}.lora_A.weight"] = scale * torch.randn(rank, hidden, generator=g)  # [r, in]
            tensors[f"{key}.lora_B.weight"] = scale * torch.randn(outs[m], rank, generator=g)  # [out, r]
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(target), "r": rank,
        "lora_alpha": 2 * rank, "lora_dropout": 0.0, "bias": "none", "target_modules": list(TARGET_MODULES),
        "fan_in_fan_out": False, "modules_to_save": None}, indent=1))
    return out
