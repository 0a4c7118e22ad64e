# SPDX-License-Identifier: Apache-2.0
import json

import pytest

from vllm_dflash.config import DFlashConfig, DFlashConfigError, build_target_layer_ids

BASE = dict(hidden_size=128, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
            intermediate_size=256, vocab_size=384, num_target_layers=4, target_layer_ids=(1, 2), mask_token_id=3,
            block_size=4)
TARGET = {"num_hidden_layers": 4, "hidden_size": 128, "vocab_size": 384}


def test_default_layer_rule():
    assert build_target_layer_ids(30, 5) == (1, 8, 14, 21, 27)
    assert build_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)  # Qwen3-8B published draft
    assert build_target_layer_ids(32, 5) == (1, 8, 15, 22, 29)  # Qwen3.5-4B published draft
    assert build_target_layer_ids(30, 1) == (15,)


@pytest.mark.parametrize("change, field, words", [
    (dict(mask_token_id=384), "dflash_config.mask_token_id", "outside the vocabulary"),
    (dict(mask_token_id=-1), "dflash_config.mask_token_id", "outside the vocabulary"),
    (dict(target_layer_ids=(1, 4)), "dflash_config.target_layer_ids", "outside the target"),
    (dict(target_layer_ids=(2, 1)), "dflash_config.target_layer_ids", "strictly increasing"),
    (dict(target_layer_ids=()), "dflash_config.target_layer_ids", "empty"),
    (dict(block_size=1), "block_size", "block_size >= 2"),
    (dict(num_key_value_heads=3), "num_key_value_heads", "multiple"),
    (dict(hidden_size=0), "hidden_size", "positive"),
    (dict(draft_vocab_size=1000), "draft_vocab_size", "at most"),
    (dict(diffusion_steps=0), "diffusion_steps", "got 0"),
])
def test_config_errors_name_field_and_fix(change, field, words):
    with pytest.raises(DFlashConfigError) as e:
        DFlashConfig(**{**BASE, **change})
    assert e.value.field_name == field
    assert words in str(e.value) and "Fix:" in str(e.value)


def test_check_target_errors():
    cfg = DFlashConfig(**BASE)
    cfg.check_target(TARGET)
    with pytest.raises(DFlashConfigError, match="hidden_size"):
        cfg.check_target({**TARGET, "hidden_size": 256})
    with pytest.raises(DFlashConfigError, match="vocab_size"):
        cfg.check_target({**TARGET, "vocab_size": 500})
    with pytest.raises(DFlashConfigError, match="num_target_layers"):
        cfg.check_target({**TARGET, "num_hidden_layers": 2})
    with pytest.raises(DFlashConfigError, match="num_speculative_tokens"):
        cfg.check_num_speculative_tokens(4)
    cfg.check_num_speculative_tokens(3)


def test_hf_round_trip(tmp_path):
    cfg = DFlashConfig(**BASE, draft_vocab_size=128)
    cfg.save(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["architectures"] == ["DFlashDraftModel"] and raw["model_type"] == "qwen3"
    assert raw["dflash_config"]["mask_token_id"] == 3 and raw["dflash_config"]["target_layer_ids"] == [1, 2]
    assert raw["block_size"] == 4 and raw["num_target_layers"] == 4
    assert DFlashConfig.from_pretrained(tmp_path) == cfg


def test_from_pretrained_errors(tmp_path):
    with pytest.raises(DFlashConfigError, match="does not exist"):
        DFlashConfig.from_pretrained(tmp_path / "nope")
    with pytest.raises(DFlashConfigError, match="config.json is missing"):
        DFlashConfig.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{broken")
    with pytest.raises(DFlashConfigError, match="not valid JSON"):
        DFlashConfig.from_pretrained(tmp_path)
    raw = DFlashConfig(**BASE).to_hf_config()
    del raw["dflash_config"]["mask_token_id"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(DFlashConfigError, match="mask_token_id"):
        DFlashConfig.from_pretrained(tmp_path)
    raw = DFlashConfig(**BASE).to_hf_config()
    raw["architectures"] = ["LlamaForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(DFlashConfigError, match="architectures"):
        DFlashConfig.from_pretrained(tmp_path)


def test_published_format_parses():
    """A config in the shape of z-lab/Qwen3-8B-DFlash-b16 (fields from the published card)."""
    published = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16, "num_target_layers": 36,
        "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
        "hidden_size": 4096, "num_hidden_layers": 5, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936, "rope_theta": 1000000,
        "rms_norm_eps": 1e-6, "layer_types": ["full_attention"] * 5, "use_sliding_window": False,
    }
    cfg = DFlashConfig.from_hf_config(published)
    assert cfg.num_speculative_tokens == 15 and cfg.feature_size == 5 * 4096
    assert cfg.to_hf_config()["layer_types"] == ["full_attention"] * 5  # unknown keys survive a round trip


def test_for_target_reads_nested_rope_theta():
    """transformers >= 5 keeps rope_theta under rope_parameters (SmolLM2: 1e5); the draft must use the target's."""
    from vllm_dflash.config import DFlashConfig

    t = {"hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 128, "vocab_size": 100, "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}}
    assert DFlashConfig.for_target(t, mask_token_id=1).rope_theta == 100000.0
    assert DFlashConfig.for_target({**t, "rope_theta": 5e5}, mask_token_id=1).rope_theta == 5e5
