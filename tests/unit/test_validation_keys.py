# SPDX-License-Identifier: Apache-2.0
"""Our speculative-config keys: popped from the speculative config and validated, never published as env vars
(they travel in vLLM's additional_config: tests/unit/test_settings.py, tests/vllm/test_settings_vllm.py). vLLM's own
keys where ours overlap (draft_sample_method, draft_tensor_parallel_size) are honoured or refused, never ignored."""
import os

import pytest

from vllm_dflash import settings as S
from vllm_dflash.config import DFlashConfigError


def _pop(spec: dict) -> dict:
    """What the front-end patch does with a speculative config: pop our keys, then validate them."""
    ours = S.pop_spec_keys(spec)
    S.resolve(ours, environ={})
    return ours


def test_plugin_keys_are_popped_and_not_published():
    before = dict(os.environ)
    spec = {"method": "dflash", "model": "d", "diffusion_steps": 2}
    assert _pop(spec) == {"diffusion_steps": 2} and "diffusion_steps" not in spec
    _pop({"method": "dflash", "model": "d"})  # a later LLM(...) without the key
    assert dict(os.environ) == before


@pytest.mark.parametrize("key, value", [("diffusion_steps", 0), ("diffusion_steps", 1.5), ("diffusion_steps", True),
                                        ("confidence_threshold", 0.0), ("confidence_threshold", 2)])
def test_plugin_key_validation(key, value):
    with pytest.raises(DFlashConfigError, match=key):
        _pop({key: value})


# ------------------------------------------------------------------ vLLM's own keys where ours overlap
@pytest.mark.parametrize("value", ["greedy", "probabilistic"])
def test_vllm_draft_sample_method_sets_draft_sampling(value):
    """vLLM's draft_sample_method is honoured: it sets our draft_sampling (over additional_config, as our own key
    would) and stays in the speculative config for vLLM."""
    spec = {"method": "dflash", "model": "d", "draft_sample_method": value}
    ours = S.pop_spec_keys(spec)
    assert spec["draft_sample_method"] == value and ours == {"draft_sampling": value}
    assert S.resolve(ours, {"draft_sampling": "auto"}, environ={}).draft_sampling == value
    spec = {"draft_sample_method": value, "draft_sampling": value}  # both, agreeing
    assert S.pop_spec_keys(spec) == {"draft_sampling": value}


@pytest.mark.parametrize("spec, words", [
    ({"draft_sample_method": "greedy", "draft_sampling": "probabilistic"},
     "contradicts speculative_config.draft_sampling"),
    ({"draft_sample_method": "greedy", "draft_sampling": "auto"}, "give one of the two keys"),
    ({"draft_sample_method": "auto"}, "use one of 'greedy', 'probabilistic'"),
])
def test_vllm_draft_sample_method_conflicts_are_refused(spec, words):
    with pytest.raises(DFlashConfigError) as e:
        S.pop_spec_keys(dict(spec))
    assert e.value.field_name == "speculative_config.draft_sample_method" and words in str(e.value)


def test_vllm_draft_tensor_parallel_size_is_honoured_or_refused():
    """draft_tensor_parallel_size: the target's size serves; 1 under TP 2 (which vLLM allows) is refused, naming
    the key and vLLM's own drafter as the way out (never ignored)."""
    from vllm_dflash.config import DFlashConfig
    from vllm_dflash.integration.validation import check_tensor_parallel

    cfg = DFlashConfig(hidden_size=128, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                       head_dim=64, intermediate_size=256, vocab_size=384, num_target_layers=4,
                       target_layer_ids=(1, 2), mask_token_id=3)
    check_tensor_parallel(cfg, 2, 2)
    check_tensor_parallel(cfg, 1, 1)
    with pytest.raises(DFlashConfigError) as e:
        check_tensor_parallel(cfg, 2, 1)
    assert e.value.field_name == "speculative_config.draft_tensor_parallel_size"
    assert '"drafter": "vllm"' in str(e.value) and "set it to 2" in str(e.value)


def test_unsupported_block_size_names_vllms_drafter(pair, tmp_path):
    """A block size vLLM serves and ours does not: refused with both fixes."""
    import json
    import shutil

    from vllm_dflash.integration.validation import validate_dflash_spec

    d = shutil.copytree(pair / "draft-b8", tmp_path / "b6")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "block_size": 6}))
    target = json.loads((pair / "target" / "config.json").read_text())
    with pytest.raises(DFlashConfigError, match='block_size: 6 is not supported.*"drafter": "vllm"'):
        validate_dflash_spec({"model": str(d)}, target)
