# SPDX-License-Identifier: Apache-2.0
"""`DFlashConfig`: the one frozen description of a DFlash draft, parsed once.

Parsed from (and written to) the published checkpoint format, which upstream vLLM 0.32 also loads:
  {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": B,
   "num_target_layers": L, "dflash_config": {"mask_token_id": M, "target_layer_ids": [...]},
   + Qwen3 fields (hidden_size, num_hidden_layers, num_attention_heads, ...)}
and from the dict vLLM builds out of a `speculators` checkpoint (model_type "speculators": the same keys without
num_target_layers, which that layout does not record). Other layouts: integration/draft_layouts.py.

Every validation error names the field and says how to fix it (`DFlashConfigError`).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

ARCHITECTURE = "DFlashDraftModel"
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
SUPPORTED_BLOCK_SIZES = (4, 8, 16)  # what serving supports; training/reference accept any >= 2


# ------------------------------------------------------------------ known targets
# The ONE place the library knows about specific target families. A target is keyed by (model_type, vocab_size) of
# its Hugging Face config; everything else (shapes, layer ids) comes from the target's config or the draft's.
# Mask token: a token id the target never reads or writes in chat (docs/MASK_TOKEN.md). Any other target: pass
# --mask-token-id (mask_token_id= in Python); nothing falls back to these ids silently.
KNOWN_MASK_TOKEN_IDS: dict[tuple[str, int], int] = {
    ("llama", 49152): 16,  # SmolLM2 (135M / 360M / 1.7B): 16 <empty_output>
}


def _getter(cfg: Mapping[str, Any] | Any):
    get = cfg.get if isinstance(cfg, Mapping) else (lambda k, d=None: getattr(cfg, k, d))
    text = get("text_config")
    if text is not None:  # multimodal wrappers keep the LM under text_config
        return text.get if isinstance(text, Mapping) else (lambda k, d=None, t=text: getattr(t, k, d))
    return get


def target_family(target_config: Mapping[str, Any] | Any) -> tuple[str, int]:
    """(model_type, vocab_size) of a target's HF config (dict or PretrainedConfig): the key of the known tables."""
    get = _getter(target_config)
    outer = target_config.get if isinstance(target_config, Mapping) else (
        lambda k, d=None: getattr(target_config, k, d))
    return str(get("model_type") or outer("model_type")), int(get("vocab_size") or 0)


def known_mask_token_id(target_config: Mapping[str, Any] | Any) -> int | None:
    """The mask token id known for this target family, or None (then the caller must be given one)."""
    return KNOWN_MASK_TOKEN_IDS.get(target_family(target_config))


def default_mask_token_id(target_config: Mapping[str, Any] | Any) -> int:
    """The known mask token id for this target family; any other target raises, naming --mask-token-id."""
    mask = known_mask_token_id(target_config)
    if mask is None:
        model_type, vocab = target_family(target_config)
        raise ValueError(f"no known mask token for a {model_type} target with vocabulary {vocab}. Fix: pass "
                         "--mask-token-id (mask_token_id= in Python): a token id the target never reads or writes; "
                         "see docs/MASK_TOKEN.md")
    return mask


def describe_known_mask_token_ids() -> str:
    """The known table as text, for help texts (rendered from the table, never written out by hand)."""
    known = ", ".join(f"{t}/{v} -> {m}" for (t, v), m in KNOWN_MASK_TOKEN_IDS.items())
    return f"model_type/vocab_size -> id: {known}"


class DFlashConfigError(ValueError):
    """A bad draft configuration. The message names the field and the fix."""

    def __init__(self, field_name: str, problem: str, fix: str):
        self.field_name = field_name
        super().__init__(f"{field_name}: {problem}. Fix: {fix}")


def read_config_json(path: str | Path, field_name: str = "model") -> dict[str, Any]:
    """A draft folder's config.json as a dict (DFlashConfigError naming `field_name` when the folder or the file is
    missing, or the JSON is broken)."""
    path = Path(path)
    if not path.is_dir():
        raise DFlashConfigError(field_name, f"draft folder {str(path)!r} does not exist",
                                "pass the folder that holds the draft's config.json and model.safetensors")
    cfg_file = path / CONFIG_NAME
    if not cfg_file.is_file():
        raise DFlashConfigError(field_name, f"{cfg_file} is missing",
                                "pass a DFlash checkpoint folder with config.json")
    try:
        return json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise DFlashConfigError("config.json", f"is not valid JSON ({e})", f"repair {cfg_file}") from None


def build_target_layer_ids(num_target_layers: int, num_features: int) -> tuple[int, ...]:
    """Default target layers whose OUTPUTS are fused: evenly spread from layer 1 to layer L-3.

    n == 1 -> (L // 2,); else round(1 + i * (L - 4) / (n - 1)) for i in 0..n-1, rounding halves up
    (e.g. L=30, n=5 -> 1, 8, 14, 21, 27). Id l is the output of decoder layer l, i.e. HF
    `output_hidden_states[l + 1]`.
    """
    if num_target_layers < 1:
        raise DFlashConfigError("num_target_layers", f"got {num_target_layers}", "use the target's num_hidden_layers (>= 1)")
    if num_features < 1:
        raise DFlashConfigError("num_features", f"got {num_features}", "fuse at least one target layer")
    if num_features == 1:
        return (num_target_layers // 2,)
    if num_target_layers >= 5:
        step = (num_target_layers - 4) / (num_features - 1)
        ids = tuple(int(math.floor(1 + i * step + 0.5)) for i in range(num_features))
        if len(set(ids)) == len(ids):
            return ids
    # Too shallow for n distinct layers in [1, L-3]: spread over all layers instead.
    step = (num_target_layers - 1) / (num_features - 1)
    return tuple(sorted({int(math.floor(i * step + 0.5)) for i in range(num_features)}))


@dataclass(frozen=True)
class DFlashConfig:
    """Architecture of a DFlash draft and its link to the target. Immutable; build with
    `DFlashConfig(...)`, `from_hf_config(dict)` or `from_pretrained(dir)`.

    Invariants (checked in __post_init__): block_size >= 2; target_layer_ids strictly increasing,
    each < num_target_layers; 0 <= mask_token_id < vocab_size; heads divide evenly for GQA.
    """

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the TARGET vocabulary (embedding / lm_head are the target's)
    num_target_layers: int | None  # None: not recorded (the speculators layout); the layer ids are checked alone
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    block_size: int = 8
    target_hidden_size: int | None = None  # None = hidden_size
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 8192
    attention_bias: bool = False
    hidden_act: str = "silu"
    # Reduced draft vocabulary (vLLM's `draft_vocab_size` / `d2t` convention): the draft scores only
    # `draft_vocab_size` target tokens. None = full target vocabulary.
    draft_vocab_size: int | None = None
    # Runtime default for multi-step denoising (1 = the paper's single pass).
    diffusion_steps: int = 1
    # False: an ablation baseline trained WITHOUT target features (context K/V from zeros); not servable.
    use_target_features: bool = True
    # A hinted draft (dflash_config.hint_ngram = [min_n, max_n]): its block is [anchor, h1 .. hm, MASK ..] where h is
    # the prompt-lookup continuation (adaptive/ngram.py, these n-gram sizes) of the context up to the anchor; None:
    # the plain block [anchor, MASK ..]. Trained and served with the same lookup.
    hint_ngram: tuple[int, int] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_layer_ids", tuple(int(i) for i in self.target_layer_ids))
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                     "head_dim", "intermediate_size", "vocab_size", "num_target_layers"):
            value = getattr(self, name)
            if value is None and name == "num_target_layers":
                continue
            if not isinstance(value, int) or value < 1:
                raise DFlashConfigError(name, f"must be a positive integer, got {value!r}", f"set {name} in config.json")
        if self.block_size < 2:
            raise DFlashConfigError(
                "block_size", f"got {self.block_size}; a block holds the anchor plus at least one draft token",
                "use block_size >= 2 (published drafts use 8 or 16)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise DFlashConfigError(
                "num_key_value_heads", f"{self.num_attention_heads} attention heads are not a multiple of "
                f"{self.num_key_value_heads} KV heads", "choose num_key_value_heads dividing num_attention_heads")
        if not self.target_layer_ids:
            raise DFlashConfigError("dflash_config.target_layer_ids", "is empty",
                                    "list the target layers to fuse, e.g. build_target_layer_ids(L, 5)")
        if list(self.target_layer_ids) != sorted(set(self.target_layer_ids)):
            raise DFlashConfigError("dflash_config.target_layer_ids", f"{list(self.target_layer_ids)} is not strictly "
                                    "increasing", "list each target layer once, in increasing order")
        depth = self.num_target_layers
        bad = [i for i in self.target_layer_ids if i < 0 or (depth is not None and i >= depth)]
        if bad:
            raise DFlashConfigError(
                "dflash_config.target_layer_ids", f"layer ids {bad} are outside the target's "
                + (f"{depth} layers (valid: 0..{depth - 1})" if depth is not None else "layers (negative)"),
                "use ids below num_target_layers, or retrain the draft for this target")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise DFlashConfigError(
                "dflash_config.mask_token_id", f"{self.mask_token_id} is outside the vocabulary [0, {self.vocab_size})",
                "pick an id of the target vocabulary that never occurs in real text (see docs/MASK_TOKEN.md)")
        if self.draft_vocab_size is not None and not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise DFlashConfigError("draft_vocab_size", f"{self.draft_vocab_size} not in [1, {self.vocab_size}]",
                                    "use at most the target vocabulary size, or drop the key for the full vocabulary")
        if self.diffusion_steps < 1:
            raise DFlashConfigError("diffusion_steps", f"got {self.diffusion_steps}", "use 1 (single pass) or more")
        if self.hint_ngram is not None:
            hn = tuple(int(n) for n in self.hint_ngram)
            if len(hn) != 2 or not 1 <= hn[0] <= hn[1]:
                raise DFlashConfigError("dflash_config.hint_ngram", f"{list(self.hint_ngram)} is not [min_n, max_n] "
                                        "with 1 <= min_n <= max_n", "use e.g. [2, 4], or drop it for a plain draft")
            object.__setattr__(self, "hint_ngram", hn)
        if self.hidden_act != "silu":
            raise DFlashConfigError("hidden_act", f"{self.hidden_act!r} is not supported", "use 'silu' (SwiGLU)")

    # ------------------------------------------------------------------ derived
    @property
    def num_features(self) -> int:
        return len(self.target_layer_ids)

    @property
    def feature_size(self) -> int:
        """Width of the concatenated target features that `fc` consumes."""
        return self.num_features * (self.target_hidden_size or self.hidden_size)

    @property
    def num_speculative_tokens(self) -> int:
        """Drafts per block: the anchor is committed already, so B - 1."""
        return self.block_size - 1

    @property
    def uses_reduced_vocab(self) -> bool:
        return self.draft_vocab_size is not None and self.draft_vocab_size < self.vocab_size

    def with_(self, **changes: Any) -> "DFlashConfig":
        return replace(self, **changes)

    # ------------------------------------------------------------- validation
    def check_target(self, target: Mapping[str, Any] | Any) -> None:
        """Validate against the target's HF config (dict or PretrainedConfig). Raises DFlashConfigError."""
        get = target.get if isinstance(target, Mapping) else (lambda k, d=None: getattr(target, k, d))
        text = get("text_config")
        if text is not None:  # multimodal wrappers keep the LM under text_config
            get = text.get if isinstance(text, Mapping) else (lambda k, d=None, t=text: getattr(t, k, d))
        t_layers, t_hidden, t_vocab = get("num_hidden_layers"), get("hidden_size"), get("vocab_size")
        if self.num_target_layers is not None and t_layers != self.num_target_layers:
            raise DFlashConfigError(
                "num_target_layers", f"draft was built for a {self.num_target_layers}-layer target, the target has "
                f"{t_layers} layers", "use the draft trained for this target")
        bad = [i for i in self.target_layer_ids if i >= t_layers]
        if bad:
            raise DFlashConfigError("dflash_config.target_layer_ids", f"ids {bad} >= the target's {t_layers} layers",
                                    "use the draft trained for this target")
        expected_hidden = self.target_hidden_size or self.hidden_size
        if t_hidden != expected_hidden:
            raise DFlashConfigError(
                "hidden_size", f"draft expects target hidden size {expected_hidden}, the target has {t_hidden}",
                "use a draft trained for this target (the draft shares the target's embedding and lm_head)")
        if self.hidden_size != t_hidden:
            raise DFlashConfigError("hidden_size", f"draft hidden {self.hidden_size} != target hidden {t_hidden}",
                                    "the draft's hidden size must equal the target's (shared embedding / lm_head)")
        if t_vocab != self.vocab_size:
            raise DFlashConfigError(
                "vocab_size", f"draft vocabulary {self.vocab_size} != target vocabulary {t_vocab}",
                "use a draft trained with this target's tokenizer")

    def check_num_speculative_tokens(self, num_speculative_tokens: int) -> None:
        if not 1 <= num_speculative_tokens <= self.block_size - 1:
            raise DFlashConfigError(
                "num_speculative_tokens", f"{num_speculative_tokens} does not fit a block of {self.block_size} "
                f"(anchor + at most {self.block_size - 1} drafts)",
                f"set num_speculative_tokens between 1 and {self.block_size - 1}")

    # ----------------------------------------------------------- (de)serialise
    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any]) -> "DFlashConfig":
        cfg = dict(cfg)
        dcfg = dict(cfg.get("dflash_config") or {})
        archs = cfg.get("architectures") or []
        if archs and not any("DFlash" in a for a in archs):
            raise DFlashConfigError("architectures", f"{archs} is not a DFlash draft",
                                    f'use a checkpoint with "architectures": ["{ARCHITECTURE}"]')
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
            if key not in cfg:
                raise DFlashConfigError(key, "is missing from config.json", f"add {key} (a Qwen3 field) to config.json")
        num_target_layers = cfg.get("num_target_layers", dcfg.get("num_target_layers"))
        layer_ids = dcfg.get("target_layer_ids", cfg.get("target_layer_ids"))
        if num_target_layers is None and not (cfg.get("model_type") == "speculators" and layer_ids is not None):
            raise DFlashConfigError("num_target_layers", "is missing from config.json",
                                    "add the target's num_hidden_layers as num_target_layers")
        if layer_ids is None:
            layer_ids = build_target_layer_ids(int(num_target_layers), int(cfg["num_hidden_layers"]))
        mask = dcfg.get("mask_token_id", cfg.get("mask_token_id"))
        if mask is None:
            raise DFlashConfigError("dflash_config.mask_token_id", "is missing",
                                    "add dflash_config.mask_token_id (a target token id unused in real text)")
        heads = int(cfg["num_attention_heads"])
        rope_theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta") or 1_000_000.0
        known = {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "intermediate_size", "vocab_size", "num_target_layers", "dflash_config", "block_size",
                 "target_hidden_size", "rms_norm_eps", "rope_theta", "max_position_embeddings", "attention_bias",
                 "hidden_act", "draft_vocab_size", "architectures", "model_type", "diffusion_steps"}
        return cls(
            hidden_size=int(cfg["hidden_size"]),
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            num_target_layers=None if num_target_layers is None else int(num_target_layers),
            target_layer_ids=tuple(layer_ids),
            mask_token_id=int(mask),
            block_size=int(next((b for b in (cfg.get("block_size"), dcfg.get("block_size")) if b is not None), 16)),
            target_hidden_size=cfg.get("target_hidden_size"),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 8192)),
            attention_bias=bool(cfg.get("attention_bias", False)),
            hidden_act=cfg.get("hidden_act", "silu"),
            draft_vocab_size=cfg.get("draft_vocab_size"),
            diffusion_steps=int(dcfg.get("diffusion_steps", cfg.get("diffusion_steps", 1))),
            use_target_features=bool(dcfg.get("use_target_features", True)),
            hint_ngram=tuple(dcfg["hint_ngram"]) if dcfg.get("hint_ngram") is not None else None,
            extra={k: v for k, v in cfg.items() if k not in known},
        )

    def to_hf_config(self) -> dict[str, Any]:
        """The checkpoint's config.json (published DFlash format + Qwen3 fields)."""
        out: dict[str, Any] = {
            "architectures": [ARCHITECTURE],
            "model_type": "qwen3",
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "dflash_config": {
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": list(self.target_layer_ids),
                "diffusion_steps": self.diffusion_steps,
            },
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": self.attention_bias,
            "hidden_act": self.hidden_act,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
        }
        if self.num_target_layers is None:  # not recorded by the layout it came from
            del out["num_target_layers"]
        if self.target_hidden_size is not None:
            out["target_hidden_size"] = self.target_hidden_size
        if self.draft_vocab_size is not None:
            out["draft_vocab_size"] = self.draft_vocab_size
        if not self.use_target_features:
            out["dflash_config"]["use_target_features"] = False
        if self.hint_ngram is not None:
            out["dflash_config"]["hint_ngram"] = list(self.hint_ngram)
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "DFlashConfig":
        return cls.from_hf_config(read_config_json(path))

    def save(self, path: str | Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / CONFIG_NAME).write_text(json.dumps(self.to_hf_config(), indent=2) + "\n")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["target_layer_ids"] = list(self.target_layer_ids)
        d["extra"] = dict(self.extra)
        return d

    # ---------------------------------------------------------------- builders
    @classmethod
    def for_target(cls, target: Mapping[str, Any] | Any, *, num_layers: int = 1, block_size: int = 8,
                   num_features: int = 5, mask_token_id: int | None = None, intermediate_size: int | None = None,
                   num_attention_heads: int | None = None, num_key_value_heads: int | None = None,
                   draft_vocab_size: int | None = None, rope_theta: float | None = None) -> "DFlashConfig":
        """A draft shaped for `target` (HF config): same hidden size and vocabulary, Qwen3-style layers.

        mask_token_id None: the id known for the target family (KNOWN_MASK_TOKEN_IDS); any other target raises
        ValueError naming --mask-token-id."""
        if mask_token_id is None:
            mask_token_id = default_mask_token_id(target)
        get = _getter(target)
        hidden, layers = int(get("hidden_size")), int(get("num_hidden_layers"))
        heads = num_attention_heads or int(get("num_attention_heads"))
        kv = num_key_value_heads or int(get("num_key_value_heads") or heads)
        head_dim = int(get("head_dim") or hidden // int(get("num_attention_heads")))
        return cls(
            hidden_size=hidden, num_hidden_layers=num_layers, num_attention_heads=heads, num_key_value_heads=kv,
            head_dim=head_dim, intermediate_size=intermediate_size or int(get("intermediate_size")),
            vocab_size=int(get("vocab_size")), num_target_layers=layers,
            target_layer_ids=build_target_layer_ids(layers, min(num_features, layers)),
            mask_token_id=mask_token_id, block_size=block_size, rms_norm_eps=float(get("rms_norm_eps") or 1e-6),
            rope_theta=float(rope_theta or get("rope_theta") or (get("rope_parameters") or {}).get("rope_theta")
                             or 1_000_000.0),  # transformers >= 5 nests it in rope_parameters
            max_position_embeddings=int(get("max_position_embeddings") or 8192), draft_vocab_size=draft_vocab_size,
        )
