# SPDX-License-Identifier: Apache-2.0
"""The settings layer (vllm_dflash/settings.py): parsing, validation messages naming the source and the fix,
precedence (speculative-config key > additional_config["dflash"] > DFLASH_* env > default), the deprecated
VLLM_DFLASH_* aliases, the patched create_speculative_config writing vLLM's additional_config (never os.environ),
no old name left in library code, and docs/CONFIGURATION.md equal to the rendered table."""
import logging
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from vllm_dflash import settings as S
from vllm_dflash.config import DFlashConfigError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No DFLASH_* / VLLM_DFLASH_* from the caller's shell; a fresh one-time-warning memory."""
    for name in S.all_env_names():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(S, "_WARNED", set())


def test_defaults():
    s = S.DFlashSettings()
    assert s.to_dict() == {"adaptive": True, "diffusion_steps": None, "confidence_threshold": 0.9,
                           "overlap": "auto", "kv_injection": "auto", "guard_threshold": 1.3, "guard_margin": "noise",
                           "guard_confirm": True, "reexplore_steps": 32.0, "cross_lookup": 100_000,
                           "defer_injection": True,
                           "draft_sampling": "auto", "drafter": "ours"}
    assert s.adaptive_mode == "both" and S.resolve() == s
    assert S.process_setting("log_level") == "INFO" and S.process_setting("profile") is False
    assert S.process_setting("cache") is None and S.process_setting("dtype") is None


@pytest.mark.parametrize("raw, canonical, mode", [
    (True, True, "both"), (False, False, None), ("both", True, "both"), ("true", True, "both"), ("1", True, "both"),
    ("off", False, None), ("0", False, None), (0, False, None), ("dflash", "dflash", "dflash"),
    ("NGRAM", "ngram", "ngram"), ("merged", "merged", "merged")])
def test_adaptive_values(raw, canonical, mode):
    s = S.resolve({"adaptive": raw})
    assert s.adaptive == canonical and s.adaptive_mode == mode


def test_other_values_are_canonical():
    s = S.resolve({"diffusion_steps": 3, "confidence_threshold": 1, "overlap": "1", "kv_injection": "Reference",
                   "drafter": "VLLM"})
    assert (s.diffusion_steps, s.confidence_threshold, s.overlap, s.kv_injection, s.drafter) == \
        (3, 1.0, True, "reference", "vllm")
    assert S.resolve(environ={"DFLASH_DIFFUSION_STEPS": "2", "DFLASH_CONFIDENCE_THRESHOLD": "0.5",
                              "DFLASH_OVERLAP": "false"}).to_dict() == \
        {**S.DFlashSettings().to_dict(), "diffusion_steps": 2, "confidence_threshold": 0.5, "overlap": False}
    assert S.DFlashSettings(adaptive="both").adaptive is True  # canonical in the dataclass itself
    assert S.resolve({"draft_sampling": "Probabilistic"}).draft_sampling == "probabilistic"


@pytest.mark.parametrize("key, value, fix", [
    ("diffusion_steps", 0, "integer >= 1"), ("diffusion_steps", 1.5, "integer >= 1"),
    ("diffusion_steps", True, "integer >= 1"), ("confidence_threshold", 0.0, "(0, 1]"),
    ("confidence_threshold", 2, "(0, 1]"), ("confidence_threshold", "high", "(0, 1]"),
    ("adaptive", "medusa", "'merged'"), ("adaptive", None, "'merged'"), ("overlap", "sometimes", "'auto'"),
    ("kv_injection", "fast", "'reference'"), ("defer_injection", "later", "true or false"),
    ("drafter", "theirs", "'vllm'"), ("draft_sampling", "random", "'probabilistic'")])
def test_bad_values_name_the_field_and_the_fix(key, value, fix):
    with pytest.raises(DFlashConfigError) as e:
        S.resolve({key: value})
    msg = str(e.value)
    assert msg.startswith(f"speculative_config.{key}: got {value!r}") and "Fix:" in msg and fix in msg
    assert e.value.field_name == f"speculative_config.{key}"


def test_errors_name_their_source():
    with pytest.raises(DFlashConfigError, match=r"^additional_config\.dflash\.overlap: got 'x'"):
        S.resolve(None, {"overlap": "x"})
    with pytest.raises(DFlashConfigError, match=r"^additional_config\.dflash: unknown key\(s\) \['adaptve'\]"):
        S.resolve(None, {"adaptve": True})
    with pytest.raises(DFlashConfigError, match=r"^DFLASH_ADAPTIVE: got 'maybe'"):
        S.resolve(environ={"DFLASH_ADAPTIVE": "maybe"})
    with pytest.raises(DFlashConfigError, match=r"^VLLM_DFLASH_KV_INJECTION: got 'x'"):  # the name actually set
        S.resolve(environ={"VLLM_DFLASH_KV_INJECTION": "x"})
    with pytest.raises(DFlashConfigError, match=r"^DFLASH_LOG_LEVEL: got 'loud'.*Fix: use DEBUG"):
        S.process_setting("log_level", {"DFLASH_LOG_LEVEL": "loud"})
    with pytest.raises(DFlashConfigError, match=r"^DFlashSettings\.drafter"):
        S.DFlashSettings(drafter="x")


def test_precedence():
    env = {"DFLASH_DIFFUSION_STEPS": "4", "DFLASH_OVERLAP": "0", "DFLASH_DRAFTER": "vllm"}
    s = S.resolve({"diffusion_steps": 2}, {"diffusion_steps": 3, "overlap": True}, environ=env)
    assert s.diffusion_steps == 2  # speculative-config key first
    assert s.overlap is True  # additional_config["dflash"] before the environment
    assert s.drafter == "vllm"  # then the environment
    assert s.confidence_threshold == 0.9  # then the default
    assert S.resolve(environ={"DFLASH_OVERLAP": ""}).overlap == "auto"  # empty = unset


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_deprecated_alias_warns_once_naming_the_new_name():
    got = _Records()
    log = logging.getLogger("vllm_dflash.settings")
    log.addHandler(got)
    try:
        env = {"VLLM_DFLASH_OVERLAP": "0"}
        assert S.resolve(environ=env).overlap is False
        assert S.resolve(environ=env).overlap is False
        assert len(got.messages) == 1, got.messages
        msg = got.messages[0]
        assert "VLLM_DFLASH_OVERLAP is deprecated" in msg and "rename it to DFLASH_OVERLAP" in msg
        got.messages.clear()
        # both set: the new name wins; the old one is reported as ignored (once)
        env = {"VLLM_DFLASH_PROFILE": "0", "DFLASH_PROFILE": "1"}
        assert S.process_setting("profile", env) is True and S.process_setting("profile", env) is True
        assert len(got.messages) == 1 and "VLLM_DFLASH_PROFILE is deprecated and ignored" in got.messages[0]
    finally:
        log.removeHandler(got)


def test_every_old_name_is_an_alias():
    old = ["VLLM_DFLASH_ADAPTIVE", "VLLM_DFLASH_DIFFUSION_STEPS", "VLLM_DFLASH_CONFIDENCE_THRESHOLD",
           "VLLM_DFLASH_OVERLAP", "VLLM_DFLASH_KV_INJECTION", "VLLM_DFLASH_DRAFTER", "VLLM_DFLASH_CACHE",
           "VLLM_DFLASH_LOG_LEVEL", "VLLM_DFLASH_METRICS_DIR", "VLLM_DFLASH_PROFILE",
           "VLLM_DFLASH_SKIP_VERSION_CHECK", "VLLM_DFLASH_DTYPE"]
    names = S.all_env_names()
    assert set(old) <= set(names)
    assert all(n.startswith("DFLASH_") for n in S.all_env_names(deprecated=False))
    assert S.process_setting("cache", {"VLLM_DFLASH_CACHE": "/x"}) == "/x"


def test_pop_spec_keys_and_additional_config_are_new_dicts():
    spec = {"method": "dflash", "model": "d", "adaptive": "ngram", "diffusion_steps": 2, "overlap": False}
    ours = S.pop_spec_keys(spec)
    assert spec == {"method": "dflash", "model": "d"} and ours == {"adaptive": "ngram", "diffusion_steps": 2,
                                                                    "overlap": False}
    user = {"gdn_prefill_backend": "auto"}
    out = S.with_settings(user, S.resolve(ours))
    assert user == {"gdn_prefill_backend": "auto"}  # never mutated
    assert out["gdn_prefill_backend"] == "auto" and out["dflash"]["adaptive"] == "ngram"
    cfg = SimpleNamespace(additional_config=out)
    assert S.from_vllm_config(cfg) == S.resolve(ours)
    # a config that never passed through the front end: environment and defaults
    assert S.from_vllm_config(SimpleNamespace(additional_config={})) == S.DFlashSettings()
    assert S.from_vllm_config(None) == S.DFlashSettings()
    with pytest.raises(DFlashConfigError, match="^additional_config: is a object"):
        S.with_settings(object(), S.DFlashSettings())


def test_stored_settings_win_over_a_later_environment(monkeypatch):
    """Workers read what the front end resolved, whatever their own environment says."""
    cfg = SimpleNamespace(additional_config=S.with_settings({}, S.resolve({"adaptive": False})))
    monkeypatch.setenv("DFLASH_ADAPTIVE", "merged")
    assert S.from_vllm_config(cfg).adaptive is False
    from vllm_dflash.integration.drafter_select import selected_drafter

    monkeypatch.setenv("DFLASH_DRAFTER", "vllm")
    assert selected_drafter(cfg) == "ours" and selected_drafter() == "vllm"


def test_spec_keys_are_popped_and_validated_without_touching_the_environment(monkeypatch):
    before = dict(os.environ)
    spec = {"method": "dflash", "model": "d", "diffusion_steps": 2, "adaptive": True}
    assert S.pop_spec_keys(spec) == {"diffusion_steps": 2, "adaptive": True}
    assert spec == {"method": "dflash", "model": "d"} and dict(os.environ) == before
    monkeypatch.setenv("DFLASH_DIFFUSION_STEPS", "nonsense")  # the environment is not what is validated here
    assert S.resolve(S.pop_spec_keys({"diffusion_steps": 3}), environ={}).diffusion_steps == 3
    assert set(S.SPEC_KEYS) == {"adaptive", "diffusion_steps", "confidence_threshold", "overlap", "kv_injection",
                                "guard_threshold", "guard_margin", "guard_confirm", "reexplore_steps", "cross_lookup",
                                "defer_injection",
                                "draft_sampling", "drafter"}


def test_overlap_decision_reads_the_config():
    from vllm_dflash.integration.patches import overlap_wanted

    def cfg(**kw):
        return SimpleNamespace(additional_config=S.with_settings({}, S.DFlashSettings(**kw)),
                               speculative_config=SimpleNamespace(method="dflash"))

    assert overlap_wanted(cfg(adaptive=False), True)  # auto: on for the fixed block
    assert not overlap_wanted(cfg(adaptive=True), True)  # auto: adaptive stays synchronous
    assert overlap_wanted(cfg(adaptive=True, overlap=True), True)
    assert not overlap_wanted(cfg(adaptive=False, overlap=False), True)
    assert not overlap_wanted(cfg(adaptive=False, overlap=True), False)  # --no-async-scheduling wins
    assert not overlap_wanted(cfg(adaptive=False, drafter="vllm"), True)


def test_kv_injection_mode(monkeypatch):
    from vllm_dflash.ops import _ext

    assert _ext.mode() == "auto"
    monkeypatch.setenv("DFLASH_KV_INJECTION", "reference")
    assert _ext.mode() == "reference"  # outside an engine: the environment
    with _ext.kv_injection_mode("fused"):
        assert _ext.mode() == "fused"  # inside: the engine's setting
    assert _ext.mode() == "reference"
    with pytest.raises(DFlashConfigError, match="kv_injection"):
        with _ext.kv_injection_mode("fastest"):
            pass


def test_no_old_env_name_left_in_library_code():
    """VLLM_DFLASH_* names live only in the alias table of settings.py."""
    offenders = []
    for path in sorted((ROOT / "vllm_dflash").rglob("*.py")):
        if path.name == "settings.py" and path.parent.name == "vllm_dflash":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if "VLLM_DFLASH_" in line:
                offenders.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not offenders, "old VLLM_DFLASH_* names (use vllm_dflash.settings):\n" + "\n".join(offenders)
    text = (ROOT / "vllm_dflash" / "settings.py").read_text()
    # as a string literal exactly once, the alias prefix (docstrings may name the old names in prose)
    assert text.count('"VLLM_DFLASH_') == 1 and 'DEPRECATED_ENV_PREFIX = "VLLM_DFLASH_"' in text


def test_no_environment_writes_for_deployment_settings():
    """Per-deployment settings travel in vLLM's config: of our own variables the library writes only the metrics
    folder (shared by the server's processes), the marker of a DFlash engine's processes (set by the front end
    that configured DFlash, so its engine core and workers apply the patches) and the collector's opt-in to our vLLM
    fixes (DFLASH_VLLM_EXTRAS=fixes for its own engine, data/collect.py); other writes are vLLM's / tokenizers'
    defaults (literal names)."""
    write = re.compile(r"os\.environ(?:\[(?P<k1>[^\]]+)\]\s*=(?!=)|\.(?:setdefault|update|pop)\((?P<k2>[^,)]*))|putenv")
    offenders = []
    for path in sorted((ROOT / "vllm_dflash").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        for i, line in enumerate(path.read_text().splitlines(), 1):
            for m in write.finditer(line):
                key = (m.group("k1") or m.group("k2") or "").strip()
                if (rel, key) in (("vllm_dflash/serve/metrics.py", "ENV_DIR"),
                                  ("vllm_dflash/integration/patches/speculative_config.py", "patches.ACTIVE_ENV"),
                                  ("vllm_dflash/data/collect.py", "name")):
                    continue
                if key[:1] in "'\"" and key and "DFLASH" not in key:
                    continue
                offenders.append(f"{rel}:{i}: {line.strip()}")
    assert not offenders, offenders


def test_configuration_doc_is_current():
    committed = (ROOT / "docs" / "CONFIGURATION.md").read_text()
    assert committed == S.render_markdown(), ("docs/CONFIGURATION.md is stale. Fix: python -c \"from "
                                              "vllm_dflash.settings import render_markdown; print(render_markdown(), "
                                              "end='')\" > docs/CONFIGURATION.md")
    for name in [*S.DEPLOYMENT_FIELDS, *S.PROCESS_FIELDS]:
        assert S.env_name(name) in committed
