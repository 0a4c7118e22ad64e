# SPDX-License-Identifier: Apache-2.0
"""Per-deployment settings reach the engine through vLLM's own config (VllmConfig.additional_config["dflash"]):
the patched create_speculative_config writes them there (never os.environ), and in a real LLM the drafter and the
draft model use them; a second LLM(...) in the same process does not inherit the first one's values."""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from vllm_dflash import settings as S
from vllm_dflash.config import DFlashConfigError

pytestmark = pytest.mark.vllm


def test_patched_create_speculative_config_writes_additional_config(monkeypatch):
    """The front-end patch on a stand-in `self` (no EngineArgs built: that would load the plugin in this process):
    our keys leave the speculative config and arrive, resolved, in additional_config; os.environ is untouched; a
    second call keeps the resolved values; the caller's dicts are never mutated; bad values name the key."""
    from vllm.engine.arg_utils import EngineArgs

    from vllm_dflash.integration.patches import speculative_config

    for name in S.all_env_names():
        monkeypatch.delenv(name, raising=False)
    seen = {}

    def orig(self, target_model_config, target_parallel_config):
        seen["spec"] = dict(self.speculative_config)
        return "spec-config"

    monkeypatch.setattr(EngineArgs, "create_speculative_config", orig)
    # applying the plugin (seam check, patches, metrics folder) is not this test's subject: the stand-in skips it
    from vllm_dflash.integration import patches

    monkeypatch.setattr(patches, "activate", lambda: [])
    monkeypatch.setattr("vllm_dflash.serve.metrics.register_collector", lambda: None)
    monkeypatch.delenv(patches.ACTIVE_ENV, raising=False)
    monkeypatch.setattr("vllm_dflash.integration.validation.validate_dflash_spec",
                        lambda spec, hf, tp_size=None: SimpleNamespace(block_size=8))
    speculative_config.apply()
    patched = EngineArgs.create_speculative_config
    target = SimpleNamespace(hf_config=None)
    before = dict(os.environ)

    user_spec = {"method": "dflash", "model": "d", "adaptive": "dflash", "diffusion-steps": 2}
    user_extra = {"gdn_prefill_backend": "auto"}
    a = SimpleNamespace(speculative_config=user_spec, additional_config=user_extra)
    assert patched(a, target, None) == "spec-config"
    assert seen["spec"] == {"method": "dflash", "model": "d", "num_speculative_tokens": 7,
                            "disable_eagle_block_drop": True}
    resolved = {**S.DFlashSettings().to_dict(), "adaptive": "dflash", "diffusion_steps": 2}
    assert a.additional_config == {"gdn_prefill_backend": "auto", "dflash": resolved}
    assert user_spec["adaptive"] == "dflash" and user_extra == {"gdn_prefill_backend": "auto"}
    patched(a, target, None)  # again (our keys already popped): the resolved values stay
    assert a.additional_config["dflash"]["diffusion_steps"] == 2

    b = SimpleNamespace(speculative_config={"method": "dflash", "model": "d"},
                        additional_config={"dflash": {"overlap": False}})
    patched(b, target, None)  # a new engine: nothing from `a`, the user's additional_config honoured
    assert b.additional_config["dflash"] == {**S.DFlashSettings().to_dict(), "overlap": False}

    monkeypatch.setenv("DFLASH_DIFFUSION_STEPS", "3")
    c = SimpleNamespace(speculative_config={"method": "dflash", "model": "d", "drafter": "vllm"}, additional_config={})
    patched(c, target, None)
    assert c.additional_config["dflash"]["diffusion_steps"] == 3 and c.additional_config["dflash"]["drafter"] == "vllm"
    assert "disable_eagle_block_drop" not in seen["spec"]  # vLLM's drafter: our validation and defaults skipped
    monkeypatch.delenv("DFLASH_DIFFUSION_STEPS")
    assert patches.ACTIVE_ENV not in os.environ  # the marker (not a setting): this process serves DFlash
    assert dict(os.environ) == before

    d = SimpleNamespace(speculative_config={"method": "dflash", "model": "d", "adaptive": 7}, additional_config={})
    with pytest.raises(DFlashConfigError, match="speculative_config.adaptive"):
        patched(d, target, None)
    e = SimpleNamespace(speculative_config={"method": "ngram", "num_speculative_tokens": 2}, additional_config={})
    patched(e, target, None)  # other methods: untouched
    assert e.additional_config == {}


SCRIPT = r"""
import gc, json, os, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

target, draft = sys.argv[1], sys.argv[2]
prompts = [TokensPrompt(prompt_token_ids=[5 + i, 17, 33, 90, 12, 7, 250, 31]) for i in range(2)]
sp = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


def build(spec_extra):
    return LLM(model=target, dtype="float32", enforce_eager=True, max_model_len=256, seed=0, max_num_seqs=4,
               kv_cache_memory_bytes=32 << 20, disable_log_stats=False,
               speculative_config={"method": "dflash", "model": draft, "num_speculative_tokens": 7, **spec_extra})


def probe(llm):
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    d = runner.drafter
    toks = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, sp, use_tqdm=False)]
    model = d._inner()
    return {"additional": llm.llm_engine.vllm_config.additional_config.get("dflash"),
            "drafter": type(d).__name__, "diffusion_steps": d.diffusion_steps, "adaptive": d.adaptive,
            "confidence_threshold": d.confidence_threshold, "kv_injection": model.kv_injection,
            "injection_path": model.last_injection_path, "tokens": toks,
            "idle_decay": d.strategy.controller.acceptance.idle_decay,
            # not settings: the metrics folder and the marker of a DFlash engine's processes (docs/CONTRACTS.md)
            "env": sorted(k for k in os.environ if "DFLASH" in k and k not in ("DFLASH_METRICS_DIR",
                                                                               "DFLASH_PLUGIN_ACTIVE"))}


out = {}
llm = build({"adaptive": "dflash", "diffusion_steps": 2, "confidence_threshold": 0.8, "kv_injection": "reference",
             "reexplore_steps": 16})
out["first"] = probe(llm)
del llm
gc.collect()
os.environ["DFLASH_CONFIDENCE_THRESHOLD"] = "0.7"  # an env default for the engines started after it
llm = build({})
out["second"] = probe(llm)
print("RESULT " + json.dumps(out), flush=True)
"""


def test_settings_reach_the_drafter_and_do_not_leak(pair):
    env = {k: v for k, v in os.environ.items() if "DFLASH" not in k}
    env.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                "TOKENIZERS_PARALLELISM": "false"})
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(pair / "target"), str(pair / "draft-b8")], env=env,
                          capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    r = json.loads(line[len("RESULT "):])
    first, second = r["first"], r["second"]
    assert first["additional"] == {"adaptive": "dflash", "diffusion_steps": 2, "confidence_threshold": 0.8,
                                   "overlap": "auto", "kv_injection": "reference", "guard_threshold": 1.3,
                                   "guard_margin": "noise", "guard_confirm": True, "reexplore_steps": 16.0,
                                   "cross_lookup": 100_000, "defer_injection": True, "draft_sampling": "auto", "drafter": "ours"}
    assert first["drafter"] == "DFlashDrafter"
    assert (first["diffusion_steps"], first["adaptive"], first["confidence_threshold"]) == (2, "dflash", 0.8)
    assert first["kv_injection"] == "reference" and first["injection_path"] == "reference"  # behaviour, not a label
    assert first["idle_decay"] == pytest.approx(0.5 ** (1 / 16))  # reexplore_steps: the engine's own value
    assert second["idle_decay"] == pytest.approx(0.5 ** (1 / 32))  # and the default
    # the second engine: nothing of the first, the env default it was started under, the draft's own steps
    assert second["additional"] == {**S.DFlashSettings().to_dict(), "confidence_threshold": 0.7}
    assert (second["diffusion_steps"], second["adaptive"], second["confidence_threshold"]) == (1, "both", 0.7)
    assert second["kv_injection"] == "auto" and second["injection_path"] != "none"
    assert first["env"] == [] and second["env"] == ["DFLASH_CONFIDENCE_THRESHOLD"]  # nothing written by us
    assert first["tokens"] == second["tokens"]  # greedy: settings change speed, not output
    assert "Unknown vLLM environment variable detected: VLLM_DFLASH" not in log  # none of ours in VLLM_*
