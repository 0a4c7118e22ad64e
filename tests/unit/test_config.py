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


# ------------------------------------------------------------------ other checkpoint layouts (draft_layouts.py)
@pytest.fixture
def built(pair, tmp_path):
    """Every layout of tests/support/draft_layouts.py, built from the trained tiny draft: name -> config.json dict."""
    from support import draft_layouts as L

    src, target = pair / "draft-b8", pair / "target"
    folders = {"published": L.published(src, tmp_path / "p"), "causal": L.published(src, tmp_path / "c", causal=True),
               "speculators": L.speculators(src, tmp_path / "s", target, draft_vocab_size=320),
               "dflash2": L.dflash2(src, tmp_path / "d2", target), "dflash2_published": L.dflash2_published(
                   src, tmp_path / "d2p")}
    return {name: json.loads((f / "config.json").read_text()) for name, f in folders.items()}


def test_layouts_served_read_as_vllm_reads_them(pair, built):
    """The published layout (z-lab's keys, with or without dflash_config.causal) reads as our own draft; the
    speculators layout as vLLM's algos.py reads it: target layers = aux ids - 1, no num_target_layers (the layer ids
    are checked alone), its block size and reduced vocabulary kept."""
    from vllm_dflash.integration import draft_layouts

    ours = DFlashConfig.from_pretrained(pair / "draft-b8")
    assert draft_layouts.read(built["published"]) == ours == draft_layouts.read(built["causal"])
    spec = draft_layouts.read(built["speculators"])
    assert spec.target_layer_ids == ours.target_layer_ids and spec.mask_token_id == ours.mask_token_id
    assert spec.num_target_layers is None and spec.block_size == 8 and spec.draft_vocab_size == 320
    spec.check_target(json.loads((pair / "target" / "config.json").read_text()))
    with pytest.raises(DFlashConfigError, match="target_layer_ids"):
        spec.check_target({"num_hidden_layers": 1, "hidden_size": 128, "vocab_size": 384})
    converted = draft_layouts.from_speculators(built["speculators"])
    assert converted["dflash_config"]["causal"] is True  # sliding_window_non_causal false: vLLM's causal attention
    assert DFlashConfig.from_hf_config({**converted, "block_size": None}).block_size == 16  # vLLM drops it
    assert "num_target_layers" not in spec.to_hf_config()
    assert draft_layouts.describe(built["speculators"]) == "speculators dflash layout, causal attention"
    assert draft_layouts.describe(built["published"]) == "published DFlash layout"


def test_worker_reads_vllm_speculators_dict():
    """In the worker our drafter reads vLLM's config of a speculators draft (model_type "speculators", no
    num_target_layers, no block_size); a published config without num_target_layers is still refused."""
    cfg = {**DFlashConfig(**BASE).to_hf_config(), "model_type": "speculators"}
    del cfg["num_target_layers"], cfg["block_size"]
    read = DFlashConfig.from_hf_config(cfg)
    assert read.num_target_layers is None and read.target_layer_ids == (1, 2)
    with pytest.raises(DFlashConfigError, match="num_target_layers"):
        DFlashConfig.from_hf_config({**cfg, "model_type": "qwen3"})


@pytest.mark.parametrize("name, edit, key", [
    ("dflash2", None, "speculators_model_type"),
    ("dflash2_published", None, "architectures"),
    ("published", lambda c: c.update(architectures=["MuseGlimmerAssistantModel"]), "architectures"),
    ("published", lambda c: c.update(layer_types=["sliding_attention"], sliding_window=64), "layer_types"),
    ("published", lambda c: c["dflash_config"].update(use_swa=True), "dflash_config.use_swa"),
    ("published", lambda c: c["dflash_config"].update(sample_from_anchor=True), "dflash_config.sample_from_anchor"),
    ("published", lambda c: c["dflash_config"].update(attention_sink_bias=True), "dflash_config.attention_sink_bias"),
    ("published", lambda c: c["dflash_config"].update(use_aux_hidden_state=False),
     "dflash_config.use_aux_hidden_state"),
    ("speculators", lambda c: c.update(sample_from_anchor=True), "sample_from_anchor"),
    ("speculators", lambda c: c["transformer_layer_config"].update(layer_types=["sliding_attention"]),
     "transformer_layer_config.layer_types"),
])
def test_layouts_ours_does_not_serve_are_refused_with_the_way_out(built, name, edit, key):
    from vllm_dflash.integration import draft_layouts

    raw = json.loads(json.dumps(built[name]))
    if edit is not None:
        edit(raw)
    with pytest.raises(DFlashConfigError) as e:
        draft_layouts.read(raw)
    assert e.value.field_name == key and 'Fix: serve it with vLLM\'s own DFlash drafter: add "drafter": "vllm"' in str(
        e.value), str(e.value)


def test_speculators_of_another_kind_or_incomplete(built):
    from vllm_dflash.integration import draft_layouts

    with pytest.raises(DFlashConfigError, match="speculators_model_type: 'eagle3' is not a DFlash draft"):
        draft_layouts.read({**built["speculators"], "speculators_model_type": "eagle3"})
    incomplete = {k: v for k, v in built["speculators"].items() if k != "aux_hidden_state_layer_ids"}
    with pytest.raises(DFlashConfigError, match="aux_hidden_state_layer_ids: is missing"):
        draft_layouts.read(incomplete)


# ------------------------------------------------------------------ Hub ids (hub.py)
@pytest.fixture
def offline_cache(pair, tmp_path, monkeypatch):
    """huggingface_hub offline on a cache holding the tiny draft as test-org/draft (main) and test-org/other (v1)."""
    from huggingface_hub import constants
    from support import draft_layouts as L

    cache = tmp_path / "hub"
    L.hub_cache(pair / "draft-b8", cache, "test-org/draft")
    L.hub_cache(pair / "draft-b8", cache, "test-org/other", commit="e" * 40, revision="v1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_hub_ids_resolve_offline_from_the_cache(pair, offline_cache):
    """A Hub id resolves to its snapshot in the cache (offline), at the default branch or at a named revision."""
    from vllm_dflash.config import read_config_json
    from vllm_dflash.integration import draft_layouts, hub

    src = hub.resolve("test-org/draft")
    assert src.folder == offline_cache / "models--test-org--draft" / "snapshots" / ("0123456789abcdef" * 2 + "01234567")
    assert draft_layouts.read(read_config_json(src.folder)) == DFlashConfig.from_pretrained(pair / "draft-b8")
    assert not hub.weights_known_missing(src)
    assert hub.resolve("test-org/other", "v1").folder.name == "e" * 40
    assert hub.resolve(str(pair / "draft-b8")).repo_id is None  # a local folder is used as it is
    with pytest.raises(DFlashConfigError, match="is a file, not a draft folder"):
        hub.resolve(str(pair / "draft-b8" / "config.json"))


@pytest.mark.parametrize("model, revision, words", [
    ("test-org/missing", None, ["not in the cache", "HF_HUB_OFFLINE is set", "hf download test-org/missing"]),
    ("test-org/other", None, ["test-org/other is not in the cache"]),  # only its v1 branch is cached
    ("test-org/draft", "v9", ["at revision 'v9'", "hf download test-org/draft --revision v9"]),
    ("/no/such/draft", None, ["draft folder '/no/such/draft' does not exist", "Hugging Face Hub id"]),
    ("./relative/draft", None, ["does not exist"]),
])
def test_hub_errors_name_the_key_and_the_fix(offline_cache, model, revision, words):
    from vllm_dflash.integration import hub

    with pytest.raises(DFlashConfigError) as e:
        hub.resolve(model, revision)
    assert e.value.field_name == "speculative_config.model" and "Fix:" in str(e.value)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_hub_snapshot_without_weights_is_refused_offline(pair, offline_cache, monkeypatch):
    from vllm_dflash.integration.validation import validate_dflash_spec

    (offline_cache / "models--test-org--draft" / "snapshots" / ("0123456789abcdef" * 2 + "01234567")
     / "model.safetensors").unlink()
    target = json.loads((pair / "target" / "config.json").read_text())
    with pytest.raises(DFlashConfigError, match="HF_HUB_OFFLINE is set: nothing can be downloaded"):
        validate_dflash_spec({"model": "test-org/draft"}, target)
    monkeypatch.setenv("VLLM_USE_MODELSCOPE", "1")
    with pytest.raises(DFlashConfigError, match="VLLM_USE_MODELSCOPE"):
        validate_dflash_spec({"model": "test-org/draft"}, target)
