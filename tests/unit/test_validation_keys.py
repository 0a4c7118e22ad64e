# SPDX-License-Identifier: Apache-2.0
import os

import pytest

from vllm_dflash.config import DFlashConfigError
from vllm_dflash.integration import validation as v


def test_plugin_keys_do_not_leak_between_configs(monkeypatch):
    monkeypatch.setitem(v._USER_ENV, "VLLM_DFLASH_DIFFUSION_STEPS", None)
    spec = {"method": "dflash", "model": "d", "diffusion_steps": 2}
    assert v.pop_plugin_keys(spec) == {"diffusion_steps": 2} and "diffusion_steps" not in spec
    assert os.environ["VLLM_DFLASH_DIFFUSION_STEPS"] == "2"
    v.pop_plugin_keys({"method": "dflash", "model": "d"})  # a later LLM(...) without the key
    assert "VLLM_DFLASH_DIFFUSION_STEPS" not in os.environ
    monkeypatch.setitem(v._USER_ENV, "VLLM_DFLASH_DIFFUSION_STEPS", "3")  # the user's own env var wins then
    v.pop_plugin_keys({"method": "dflash", "model": "d"})
    assert os.environ.pop("VLLM_DFLASH_DIFFUSION_STEPS") == "3"


def test_adaptive_is_the_default(monkeypatch):
    """A config without `adaptive` gets adaptive drafting (measured never slower than the fixed block); an explicit
    false gives the fixed block; the user's own environment variable still wins over the default."""
    monkeypatch.setitem(v._USER_ENV, "VLLM_DFLASH_ADAPTIVE", None)
    v.pop_plugin_keys({"method": "dflash", "model": "d"})
    assert os.environ["VLLM_DFLASH_ADAPTIVE"] == "true"
    v.pop_plugin_keys({"method": "dflash", "model": "d", "adaptive": False})
    assert os.environ["VLLM_DFLASH_ADAPTIVE"] == "false"
    monkeypatch.setitem(v._USER_ENV, "VLLM_DFLASH_ADAPTIVE", "dflash")
    v.pop_plugin_keys({"method": "dflash", "model": "d"})
    assert os.environ.pop("VLLM_DFLASH_ADAPTIVE") == "dflash"
    from vllm_dflash.integration.proposer import adaptive_mode

    monkeypatch.setenv("VLLM_DFLASH_ADAPTIVE", "true")
    assert adaptive_mode() == "both"
    monkeypatch.setenv("VLLM_DFLASH_ADAPTIVE", "false")
    assert adaptive_mode() is None


@pytest.mark.parametrize("key, value", [("diffusion_steps", 0), ("diffusion_steps", 1.5), ("diffusion_steps", True),
                                        ("confidence_threshold", 0.0), ("confidence_threshold", 2)])
def test_plugin_key_validation(key, value):
    with pytest.raises(DFlashConfigError, match=key):
        v.pop_plugin_keys({key: value})
