# SPDX-License-Identifier: Apache-2.0
"""The benchmark's --spec-extra routing against the installed vLLM: a key of vLLM's own SpeculativeConfig reaches
vLLM, an unknown key makes the configuration unavailable before any server starts (vllm_dflash/bench/configs.py)."""
from vllm_dflash.bench import configs


def test_spec_extra_keys_of_vllm_go_to_vllm_and_unknown_keys_are_refused():
    """`--spec-extra ngram:prompt_lookup_min=48` is a key of vLLM's own SpeculativeConfig: it must reach vLLM, not be
    refused as an unknown plugin key; a key neither vLLM nor the plugin knows still makes the configuration
    unavailable (vLLM would reject it mid-benchmark)."""
    none, ngram = configs.select(["none", "ngram"], ["ngram:prompt_lookup_min=48", "ngram:adaptive=true"])
    assert ngram.spec["prompt_lookup_min"] == 48 and "prompt_lookup_min" not in ngram.spec_extra
    assert ngram.spec_extra == {"adaptive": True} and ngram.unavailable_reason() is None
    spec = ngram.speculative_config(None, None)
    assert spec["method"] == "ngram" and spec["prompt_lookup_min"] == 48
    (_, bad) = configs.select(["none", "ours"], ["ours:no_such_key=1"])
    assert bad.spec_extra["no_such_key"] == 1 and "no_such_key" in bad.unavailable_reason()
