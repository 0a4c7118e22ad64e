# SPDX-License-Identifier: Apache-2.0
"""The adaptive default, down to the proposer's adaptive_mode() (importing the proposer imports vLLM; split from
tests/unit/test_validation_keys.py)."""
from types import SimpleNamespace

from vllm_dflash import settings as S


def test_adaptive_is_the_default(monkeypatch):
    """A config without `adaptive` gets adaptive drafting (measured never slower than the fixed block); an explicit
    false gives the fixed block; the user's own environment variable sets the default, the key still wins."""
    from vllm_dflash.integration.proposer import adaptive_mode

    for name in ("DFLASH_ADAPTIVE", "VLLM_DFLASH_ADAPTIVE"):
        monkeypatch.delenv(name, raising=False)

    def engine(**keys):  # what the patched create_speculative_config stores in vLLM's config
        return SimpleNamespace(additional_config=S.with_settings({}, S.resolve(keys)))

    assert adaptive_mode(engine()) == "both"
    assert adaptive_mode(engine(adaptive=False)) is None
    monkeypatch.setenv("DFLASH_ADAPTIVE", "dflash")
    assert adaptive_mode(engine()) == "dflash"
    assert adaptive_mode(engine(adaptive=True)) == "both"
    monkeypatch.setenv("DFLASH_ADAPTIVE", "false")
    assert adaptive_mode() is None  # outside an engine: the environment
