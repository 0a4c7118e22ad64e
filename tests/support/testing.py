# SPDX-License-Identifier: Apache-2.0
"""Tiny random models for tests and smoke runs (built in seconds, no hub, no downloads). Test support, not part of
the runtime package: `from support.testing import ...` (tests/ on sys.path; scripts/make_test_assets.py uses it too).

* a byte-level BPE tokenizer with a small vocabulary trained on CPython stdlib text, with ChatML
  specials and a chat template;
* a tiny target (Qwen3 or Llama, head_dim 64 so vLLM's CPU attention supports it), real random
  safetensors (vLLM's DFlash loader needs real weights, not load_format="dummy");
* a tiny DFlash draft for that target, saved in the published checkpoint format.
"""
from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import torch

from vllm_dflash.config import DFlashConfig
from vllm_dflash.model import DFlashDraftModel

CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]  # ids 0..3
MASK_ID = 3
EOS_ID = 2


def _corpus(max_files: int = 40) -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for f in sorted(stdlib.glob("*.py"))[:max_files]:
        try:
            texts.append(f.read_text(errors="ignore")[:20000])
        except OSError:
            pass
    return texts


def build_tiny_tokenizer(out: Path, vocab_size: int = 384) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", unk_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return out


def build_tiny_target(out: str | Path, *, arch: str = "qwen3", hidden_size: int = 128, num_layers: int = 4,
                      num_heads: int = 2, num_kv_heads: int = 1, intermediate_size: int = 256,
                      vocab_size: int = 384, seed: int = 0, init_std: float = 0.08,
                      predictable: float = 0.0) -> Path:
    """A random target saved as a HF folder (bf16 safetensors + tokenizer). A larger init_std than HF's
    default gives peaked, position-dependent next-token distributions (useful for sampling tests).

    predictable > 0 ties the embeddings and damps every layer's output projections by that factor's
    complement, so greedy decoding mostly repeats recent tokens with context-dependent switches: a
    language a small draft learns in seconds (high but imperfect acceptance for tests)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    out = Path(out)
    torch.manual_seed(seed)
    common = dict(hidden_size=hidden_size, num_hidden_layers=num_layers, num_attention_heads=num_heads,
                  num_key_value_heads=num_kv_heads, head_dim=64, intermediate_size=intermediate_size,
                  vocab_size=vocab_size, max_position_embeddings=2048, tie_word_embeddings=False,
                  bos_token_id=1, eos_token_id=EOS_ID, pad_token_id=0, rms_norm_eps=1e-6, initializer_range=init_std)
    if arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**common, rope_theta=10000.0))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common, rope_theta=10000.0))
    else:
        raise ValueError(f"arch: {arch!r}. Fix: use 'qwen3' or 'llama'")
    if predictable > 0:
        with torch.no_grad():
            model.lm_head.weight = model.model.embed_tokens.weight  # tie
            model.config.tie_word_embeddings = True
            model.model.embed_tokens.weight.mul_(4.0)
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.mul_(1.0 - predictable)
                layer.mlp.down_proj.weight.mul_(1.0 - predictable)
    model = model.to(torch.bfloat16)
    model.config.torch_dtype = "bfloat16"
    model.save_pretrained(str(out), safe_serialization=True)
    build_tiny_tokenizer(out, vocab_size=vocab_size)
    return out


def build_tiny_draft(out: str | Path, target_dir: str | Path, *, num_layers: int = 1, block_size: int = 4,
                     num_features: int = 2, seed: int = 0, mask_token_id: int = MASK_ID) -> Path:
    """A random DFlash draft for `target_dir`, saved in the published format (bf16)."""
    target_cfg = json.loads((Path(target_dir) / "config.json").read_text())
    cfg = DFlashConfig.for_target(target_cfg, num_layers=num_layers, block_size=block_size,
                                  num_features=num_features, mask_token_id=mask_token_id)
    torch.manual_seed(seed)
    draft = DFlashDraftModel(cfg)
    draft.init_weights(std=0.05)
    return draft.save_pretrained(out)


def load_target(path: str | Path, dtype: torch.dtype = torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()


@torch.no_grad()
def tiny_trajectories(target, n: int = 32, prompt_len: int = 12, response_len: int = 40, seed: int = 0,
                      vocab_lo: int = 4) -> list[dict]:
    """Greedy target trajectories from random prompts, in the collector's record format."""
    g = torch.Generator().manual_seed(seed)
    V = target.config.vocab_size
    prompts = torch.randint(vocab_lo, V, (n, prompt_len), generator=g)
    out = target.generate(prompts, max_new_tokens=response_len, do_sample=False, pad_token_id=0,
                          attention_mask=torch.ones_like(prompts), eos_token_id=None)
    return [{"id": f"tiny-{seed}-{i}", "prompt_ids": prompts[i].tolist(), "response_ids": out[i, prompt_len:].tolist(),
             "temperature": 0.0} for i in range(n)]
