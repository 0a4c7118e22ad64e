# SPDX-License-Identifier: Apache-2.0
"""`DFlashDraftModel`: the DFlash block-diffusion draft in plain PyTorch (the reference implementation).

Written from the paper's description (arXiv 2602.06036):
  * target features: hidden states (layer OUTPUTS) of `target_layer_ids`, concatenated per token,
    fused as ctx = hidden_norm(fc(concat)) -> [T, H];
  * KV injection: every draft layer projects ctx with its OWN k_proj / k_norm / RoPE and v_proj and
    prepends the result to the block's K/V; context tokens issue no queries;
  * the block [anchor, MASK x (B-1)] is embedded with the target's frozen embedding, attends
    non-causally to all context K/V and to the whole block, and block position k predicts the token
    AT position anchor+k (same-position prediction) through the target's frozen lm_head.

The layer arithmetic mirrors vLLM's `DFlashQwen3ForCausalLM` (fp32 RMSNorm, neox RoPE, residual
stream) so that a checkpoint behaves the same here and inside vLLM. Weight names follow the
published checkpoint format: `layers.{i}.self_attn.{q,k,v,o}_proj`, `...{q,k}_norm`,
`layers.{i}.mlp.{gate,up,down}_proj`, `layers.{i}.{input,post_attention}_layernorm`, `fc`,
`hidden_norm`, `norm`; no embedding / lm_head (shared with the target) unless the draft uses a
reduced vocabulary, in which case `lm_head.weight` [draft_vocab, H] (the target's rows) and `d2t`
(vLLM's offset convention: target_id = draft_id + d2t[draft_id]) are saved too.
"""
from __future__ import annotations

import math
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from vllm_dflash.config import WEIGHTS_NAME, DFlashConfig, DFlashConfigError, build_target_layer_ids

KV = tuple[torch.Tensor, torch.Tensor]  # (k, v), each [N, T, num_kv_heads, head_dim]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, computed in fp32 and cast back (vLLM's arithmetic); weight broadcasts."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x.to(dtype) * weight.to(dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [...] -> cos, sin [..., head_dim // 2] (neox layout, full head_dim rotated)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.to(torch.float32)[..., None] * inv_freq
    return freqs.cos().to(dtype), freqs.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., T, heads, head_dim]; cos/sin [..., T, head_dim // 2] (neox: rotate the two halves)."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class DFlashAttention(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.cfg = cfg
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        H, bias = cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(H, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(H, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(H, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, H, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def project_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> KV:
        """x [N, T, H] -> k, v [N, T, nkv, hd]: k = RoPE(k_norm(W_k x)), v = W_v x.

        This is the KV injection for context features and the block's own K/V alike."""
        N, T, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(N, T, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(N, T, self.num_kv_heads, self.head_dim)
        return apply_rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx_kv: KV | None,
                attn_mask: torch.Tensor | None) -> torch.Tensor:
        """x [N, Q, H] block tokens; ctx_kv: k, v [N, C, nkv, hd]; attn_mask [N|1, Q, C + Q] bool or None."""
        N, Q, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(N, Q, self.num_heads, self.head_dim))
        q = apply_rope(q, cos, sin)
        k, v = self.project_kv(x, cos, sin)
        if ctx_kv is not None:
            k = torch.cat((ctx_kv[0].to(k.dtype), k), dim=1)
            v = torch.cat((ctx_kv[1].to(v.dtype), v), dim=1)
        # [N, heads, T, hd]; GQA via enable_gqa
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        mask = attn_mask.unsqueeze(1) if attn_mask is not None else None
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False,
                                             enable_gqa=self.num_heads != self.num_kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(N, Q, self.num_heads * self.head_dim))


class DFlashMLP(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.self_attn = DFlashAttention(cfg)
        self.mlp = DFlashMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, ctx_kv, attn_mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_kv, attn_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


# Article-style keyword aliases accepted by DFlashDraftModel(**kwargs).
_ALIASES = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads"}
# DFlashConfig.for_target's builder arguments (the rest of the keywords override its result).
_FOR_TARGET_ARGS = ("block_size", "mask_token_id", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                    "draft_vocab_size", "rope_theta")


def _config_from_kwargs(kwargs: dict[str, Any], target_config: Any) -> DFlashConfig:
    """DFlashDraftModel(**kwargs) / DFlashDraftModel(target_config=..., **kwargs) -> DFlashConfig. No field is
    filled from a particular target: the shape comes from `target_config` or from the keywords themselves."""
    known = {f.name for f in fields(DFlashConfig)}
    args: dict[str, Any] = {}
    num_features = kwargs.pop("num_features", None)
    for k, v in kwargs.items():
        k = _ALIASES.get(k, k)
        if k not in known:
            raise TypeError(f"DFlashDraftModel: unknown argument {k!r}; valid: "
                            f"{sorted(known | set(_ALIASES) | {'num_features', 'target_config'})}")
        args[k] = v
    if target_config is not None:
        build = {k: args.pop(k) for k in _FOR_TARGET_ARGS if k in args}
        cfg = DFlashConfig.for_target(target_config, num_layers=args.pop("num_hidden_layers", 1),
                                      num_features=num_features or 5, **build)
        return cfg.with_(**args) if args else cfg
    if "target_layer_ids" not in args and "num_target_layers" in args:
        args["target_layer_ids"] = build_target_layer_ids(int(args["num_target_layers"]),
                                                          min(num_features or 5, int(args["num_target_layers"])))
    if "num_attention_heads" in args:  # the usual HF derivations (no target-specific values)
        args.setdefault("num_key_value_heads", args["num_attention_heads"])
        if "hidden_size" in args:
            args.setdefault("head_dim", int(args["hidden_size"]) // int(args["num_attention_heads"]))
    required = [f.name for f in fields(DFlashConfig) if f.default is MISSING and f.default_factory is MISSING]
    missing = [k for k in required if k not in args]
    if missing:
        raise TypeError(f"DFlashDraftModel: missing {', '.join(missing)}. Fix: pass a DFlashConfig "
                        "(DFlashConfig.from_pretrained / for_target), or target_config=<the target's HF config> "
                        "(with mask_token_id= for a target not in KNOWN_MASK_TOKEN_IDS) to derive the shape, or "
                        "every shape field as a keyword")
    return DFlashConfig(**args)


class DFlashDraftModel(nn.Module):
    """DFlash draft. `DFlashDraftModel(config)`, `DFlashDraftModel(target_config=hf_config, num_layers=2,
    block_size=8, mask_token_id=M)` (shape derived from the target: DFlashConfig.for_target) or
    `DFlashDraftModel(hidden_size=..., num_layers=..., vocab_size=..., mask_token_id=..., ...)` (every shape field
    given). Nothing defaults to a particular target.

    Call `bind_target(embed_weight, lm_head_weight)` (or `from_pretrained(..., target=model)`) before
    drafting: the embedding and lm_head are the target's, frozen, and never saved (except the rows of
    a reduced draft vocabulary, which vLLM needs as the draft's own lm_head)."""

    def __init__(self, config: DFlashConfig | None = None, *, target_config: Any = None, **kwargs: Any):
        super().__init__()
        if config is None:
            config = _config_from_kwargs(kwargs, target_config)
        elif target_config is not None:
            raise TypeError("DFlashDraftModel: pass a DFlashConfig or target_config=, not both")
        elif kwargs:
            config = config.with_(**{_ALIASES.get(k, k): v for k, v in kwargs.items()})
        self.config = config
        cfg = config
        self.fc = nn.Linear(cfg.feature_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        draft_vocab = cfg.draft_vocab_size or cfg.vocab_size
        # Target-shared tensors: frozen, not part of the trainable state; set by bind_target().
        self.register_buffer("embed_weight", torch.empty(0), persistent=False)   # [V, H]
        self.register_buffer("lm_head_weight", torch.empty(0), persistent=False)  # [V_draft, H]
        # draft id -> target id (identity for the full vocabulary).
        self.register_buffer("draft_to_target", torch.arange(draft_vocab), persistent=False)  # [V_draft]
        # Training-time input standardisation of the target features (fc sees x * inv_scale): the targets' residual
        # streams carry a few massive dimensions (SmolLM2: RMS ~1,240 in one dim vs a median of 4-15), which a plain
        # fc learns to ignore only slowly. Folded into fc.weight by save_pretrained, so checkpoints keep the
        # published format (vLLM's fc sees raw features). [n_feat * H_t]
        self.register_buffer("feature_inv_scale", torch.ones(cfg.feature_size), persistent=False)
        self.init_weights()

    # ---------------------------------------------------------------- set-up
    def init_weights(self, std: float = 0.02) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, RMSNorm):
                nn.init.ones_(m.weight)

    def bind_target(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor,
                    vocab_ids: torch.Tensor | None = None) -> "DFlashDraftModel":
        """Share the target's embedding [V, H] and lm_head [V, H] (frozen). `vocab_ids` [V_draft]: the
        target ids of a reduced draft vocabulary (must match config.draft_vocab_size)."""
        cfg = self.config
        if embed_weight.shape != (cfg.vocab_size, cfg.hidden_size):
            raise DFlashConfigError("hidden_size", f"target embedding is {tuple(embed_weight.shape)}, draft expects "
                                    f"({cfg.vocab_size}, {cfg.hidden_size})", "use a draft built for this target")
        if vocab_ids is None and cfg.uses_reduced_vocab:
            vocab_ids = self.draft_to_target
        if vocab_ids is not None:
            vocab_ids = vocab_ids.to(torch.long)
            if len(vocab_ids) != (cfg.draft_vocab_size or cfg.vocab_size):
                raise DFlashConfigError("draft_vocab_size", f"{len(vocab_ids)} vocab ids for draft_vocab_size "
                                        f"{cfg.draft_vocab_size}", "pass exactly draft_vocab_size target ids")
            self.draft_to_target = vocab_ids.to(self.fc.weight.device)
            lm_head_weight = lm_head_weight[vocab_ids]
        self.embed_weight = embed_weight.detach()
        self.lm_head_weight = lm_head_weight.detach()
        return self

    @property
    def is_bound(self) -> bool:
        return self.embed_weight.numel() > 0

    # --------------------------------------------------------------- compute
    def fuse(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """target_hidden [..., n_feat * H_t] (layer outputs concatenated) -> ctx [..., H]."""
        if not self.config.use_target_features:  # ablation baseline: the context carries no target information
            return target_hidden.new_zeros(*target_hidden.shape[:-1], self.config.hidden_size)
        return self.hidden_norm(self.fc(target_hidden * self.feature_inv_scale.to(target_hidden.dtype)))

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor) -> list[KV]:
        """KV injection (reference path). ctx [N, C, H] fused features, positions [N, C] -> per layer (k, v)."""
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, ctx.dtype)
        return [layer.self_attn.project_kv(ctx, cos, sin) for layer in self.layers]

    def forward(self, block_embeds: torch.Tensor, positions: torch.Tensor, ctx_kv: Sequence[KV | None] | None,
                attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """block_embeds [N, Q, H], positions [N, Q], ctx_kv per layer -> final hidden [N, Q, H] (after `norm`)."""
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, block_embeds.dtype)
        x = block_embeds
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, ctx_kv[i] if ctx_kv is not None else None, attn_mask)
        return self.norm(x)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embed_weight).to(self.fc.weight.dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> logits over the draft vocabulary [..., V_draft].

        F.linear on a contiguous 2-D view: `hidden @ W.t()` on the strided slices callers pass (block positions
        1..B-1) runs as a broadcast bmm in fp32, ~3x slower."""
        flat = hidden.reshape(-1, hidden.shape[-1]).contiguous()
        return F.linear(flat, self.lm_head_weight.to(hidden.dtype)).view(*hidden.shape[:-1], -1)

    @torch.no_grad()
    def draft_block(self, anchor: torch.Tensor, start_pos: torch.Tensor, ctx_kv: Sequence[KV], *,
                    block_size: int | None = None, diffusion_steps: int | None = None,
                    confidence_threshold: float = 0.9) -> torch.Tensor:
        """Propose B-1 tokens after each anchor.

        anchor [N] last committed token ids, start_pos [N] their positions, ctx_kv per layer over the
        committed context (positions < start_pos). Returns target token ids [N, B-1].

        diffusion_steps > 1: after each pass keep the confident prefix of the block (leading tokens
        with probability >= confidence_threshold, and at least a proportional share of the block),
        re-mask the rest and run the draft again; the last pass fills every still-masked position.
        """
        cfg = self.config
        B = block_size or cfg.block_size
        steps = diffusion_steps or cfg.diffusion_steps
        N = anchor.shape[0]
        device = anchor.device
        offs = torch.arange(B, device=device)
        positions = start_pos[:, None] + offs  # [N, B]
        ids = torch.full((N, B), cfg.mask_token_id, dtype=torch.long, device=device)
        ids[:, 0] = anchor
        drafts = torch.zeros(N, B - 1, dtype=torch.long, device=device)  # target ids
        kept = torch.zeros(N, dtype=torch.long, device=device)  # leading draft positions already fixed
        j = offs[: B - 1]
        for s in range(steps):
            hidden = self.forward(self.embed(ids), positions, ctx_kv)  # [N, B, H]
            probs = torch.softmax(self.logits(hidden[:, 1:]).float(), dim=-1)  # [N, B-1, V_draft]
            conf, tok = probs.max(-1)
            tok = self.draft_to_target[tok]
            free = j[None, :] >= kept[:, None]  # [N, B-1] positions still masked
            drafts = torch.where(free, tok, drafts)
            if s == steps - 1:
                break
            # leading run of confident free positions, counted from `kept`
            ok = (conf >= confidence_threshold) | ~free
            run = torch.cumprod(ok.long(), dim=1).sum(1)  # includes the already-kept prefix
            quota = math.ceil((B - 1) * (s + 1) / steps)
            kept = torch.clamp(torch.maximum(run, torch.full_like(run, quota)), max=B - 1)
            fixed = j[None, :] < kept[:, None]
            ids[:, 1:] = torch.where(fixed, drafts, torch.full_like(drafts, cfg.mask_token_id))
        return drafts

    # --------------------------------------------------------- save / load
    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items()}

    def save_pretrained(self, path: str | Path, dtype: torch.dtype = torch.bfloat16,
                        fold_feature_scale: bool = True) -> Path:
        """fold_feature_scale: write fc.weight * feature_inv_scale (the published format; loaders see raw features).
        Training checkpoints pass False and keep the scale in the trainer state."""
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.config.save(path)
        state = dict(self.trainable_state_dict())
        if fold_feature_scale:
            state["fc.weight"] = self.fc.weight * self.feature_inv_scale.to(self.fc.weight.dtype)[None, :]
        state = {k: v.detach().to(dtype).contiguous().cpu() for k, v in state.items()}
        if self.config.uses_reduced_vocab:
            if not self.is_bound:
                raise RuntimeError("a reduced-vocabulary draft must be bound to its target before saving "
                                   "(its lm_head rows are saved with it)")
            ids = self.draft_to_target.cpu()
            state["lm_head.weight"] = self.lm_head_weight.detach().to(dtype).contiguous().cpu()
            state["d2t"] = (ids - torch.arange(len(ids))).to(torch.long)  # vLLM: target = draft + d2t[draft]
        save_file(state, str(path / WEIGHTS_NAME), metadata={"format": "pt"})
        return path

    @classmethod
    def from_pretrained(cls, path: str | Path, target: nn.Module | None = None, dtype: torch.dtype | None = None,
                        device: str | torch.device = "cpu") -> "DFlashDraftModel":
        """Load a DFlash checkpoint (ours or published). `target`: a HF causal LM to bind to (checked)."""
        from safetensors.torch import load_file

        path = Path(path)
        cfg = DFlashConfig.from_pretrained(path)
        weights = path / WEIGHTS_NAME
        if not weights.is_file():
            raise DFlashConfigError("model", f"{weights} is missing", "save the draft with save_pretrained() "
                                    "or pass the folder holding model.safetensors")
        state = load_file(str(weights), device="cpu")
        model = cls(cfg)
        lm_head = state.pop("lm_head.weight", None)
        d2t = state.pop("d2t", None)
        state.pop("t2d", None)
        state = {k: v for k, v in state.items() if not k.startswith(("embed_tokens", "model.embed_tokens"))}
        state = {k[len("model."):] if k.startswith("model.") else k: v for k, v in state.items()}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise DFlashConfigError("model.safetensors", f"weights do not match config.json (missing {missing[:4]}, "
                                    f"unexpected {unexpected[:4]})", "re-save the draft or fix config.json")
        if d2t is not None:
            model.draft_to_target = torch.arange(len(d2t)) + d2t.to(torch.long)
        model = model.to(device=device, dtype=dtype or torch.float32)
        if target is not None:
            cfg.check_target(target.config)
            emb = target.get_input_embeddings().weight
            head = target.get_output_embeddings().weight
            model.bind_target(emb.to(model.fc.weight.dtype), head.to(model.fc.weight.dtype),
                              vocab_ids=model.draft_to_target if cfg.uses_reduced_vocab else None)
        elif lm_head is not None:
            model.lm_head_weight = lm_head.to(device=device, dtype=model.fc.weight.dtype)
        return model

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
