# SPDX-License-Identifier: Apache-2.0
"""Our speculative-config keys: popped from the speculative config and validated, never published as env vars
(they travel in vLLM's additional_config: tests/unit/test_settings.py, tests/vllm/test_settings_vllm.py)."""
import os

import pytest

from vllm_dflash.config import DFlashConfigError
from vllm_dflash import settings as S


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
