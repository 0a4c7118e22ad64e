# SPDX-License-Identifier: Apache-2.0
"""Every vllm_dflash setting, defined once: name, type, default, allowed values, source, one-line doc.

Two kinds (docs/CONFIGURATION.md is rendered from the tables below by `render_markdown()`, whose page text lives
in configuration_doc.py; the value parsers the tables name live in setting_parsers.py):

* Per-deployment settings (`DFlashSettings`): one value per engine (`LLM(...)` / `vllm serve`). The front end
  resolves them once, in the patched `EngineArgs.create_speculative_config`, with the precedence
      speculative-config key  >  additional_config["dflash"][key]  >  env var DFLASH_<KEY>  >  default
  and stores the result in vLLM's own `VllmConfig.additional_config["dflash"]` (a JSON object, pickled to the
  engine core and every worker with the rest of the config). The drafter, the model, the CPU platform hook and
  the scheduler read it from the `vllm_config` they receive (`from_vllm_config`). Nothing is written to
  os.environ, so two `LLM(...)` in one process never see each other's values.
* Process settings (`ProcessSettings`): environment variables only, for what has no vLLM channel (cache dir,
  log level, metrics dir shared by the server's processes, profiling switch, version-check skip, dtype).

Environment variables use the prefix `DFLASH_` (outside vLLM's `VLLM_` namespace, which vLLM's env validation
flags as unknown). The old `VLLM_DFLASH_*` names still work for one release: read when the new name is unset,
with a one-time warning naming the new one. Every bad value raises `DFlashConfigError` naming where it came
from and the fix."""
from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Mapping

from vllm_dflash import configuration_doc
from vllm_dflash import setting_parsers as parsers
from vllm_dflash.config import DFlashConfigError

ENV_PREFIX = "DFLASH_"
DEPRECATED_ENV_PREFIX = "VLLM_DFLASH_"  # the alias table: old name = this prefix + the new name's suffix
ADDITIONAL_CONFIG_KEY = "dflash"  # VllmConfig.additional_config[ADDITIONAL_CONFIG_KEY] holds DFlashSettings
CROSS_LOOKUP_MAX = 1_000_000  # tokens: setting cross_lookup's bound (its index holds ~0.4 KB of host memory a token)


# --------------------------------------------------------------------------- the tables
def _setting(default: Any, *, type: str, allowed: str, shown_default: str, doc: str, fix: str,
             parse: Callable[[Any], Any], spec_key: bool = True) -> Any:
    return field(default=default, metadata={"type": type, "allowed": allowed, "shown_default": shown_default,
                                            "doc": doc, "fix": fix, "parse": parse, "spec_key": spec_key})


@dataclass(frozen=True)
class DFlashSettings:
    """Per-deployment settings: speculative-config key > additional_config["dflash"] > DFLASH_<KEY> > default.
    Values are canonical (validated in __post_init__; `DFlashSettings(adaptive="both").adaptive is True`)."""

    adaptive: bool | str = _setting(
        True, type="bool | str", allowed='true, false, "dflash", "ngram", "merged" ("both" = true)',
        shown_default="true", parse=parsers.adaptive,
        doc="Adaptive drafting: per request-step the DFlash block, a prompt-lookup proposal or the two merged "
            "(true), or one source only, and 0..k tokens from measured acceptance and step cost; false = the "
            "paper's fixed block (docs/ADAPTIVE.md).",
        fix="use true (DFlash, prompt lookup or the two merged), false, 'dflash', 'ngram' or 'merged'")
    diffusion_steps: int | None = _setting(
        None, type="int", allowed="integer >= 1", shown_default="the draft's config.json (1)",
        parse=parsers.pos_int_or_none,
        doc="Denoising passes per draft block (keep the confident prefix, re-mask the rest, run the draft again).",
        fix="use an integer >= 1")
    confidence_threshold: float = _setting(
        0.9, type="float", allowed="(0, 1]", shown_default="0.9", parse=parsers.unit_float,
        doc="With diffusion_steps > 1: a draft token is kept when its probability reaches this.",
        fix="use a number in (0, 1]")
    overlap: bool | str = _setting(
        "auto", type="bool | str", allowed='"auto", true, false', shown_default='"auto"', parse=parsers.overlap,
        doc="Overlap (async) scheduling of our drafter, on every platform: auto = on for the fixed block (where "
            "vLLM allows it), off with adaptive drafting (logged); true = wherever vLLM allows it (adaptive then gets "
            "our AsyncScheduler); false = never. --no-async-scheduling always wins. Engines without our drafter keep "
            "vLLM's choice.",
        fix="use 'auto', true or false")
    kv_injection: str = _setting(
        "auto", type="str", allowed='"auto", "fused", "reference"', shown_default='"auto"',
        parse=parsers.choice("auto", "fused", "reference"),
        doc="Context K/V injection path: auto = the fused csrc/ kernel when built (else the PyTorch reference, "
            "logged once; a worker's own DFLASH_KV_INJECTION may still pick the path at run time, as "
            "the kernel benchmark (vllm_dflash/bench/kernels.py) does); fused = the kernel or an error; reference = PyTorch "
            "(debugging, comparisons).",
        fix="use 'auto', 'fused' or 'reference'")
    guard_threshold: float = _setting(
        1.3, type="float", allowed="number >= 1", shown_default="1.3", parse=parsers.speedup,
        doc="Adaptive drafting's guard: while the models forecast at least this speed-up over no speculation, it "
            "keeps speculating without spending steps on measuring 'no speculation'; below it, it measures both "
            "and runs the faster (a measured loss always wins). Lower trusts the forecast more (fewer steps without "
            "speculation, less protection where the forecast is wrong); higher measures more often "
            "(docs/ADAPTIVE.md).",
        fix="use a number >= 1, e.g. 1.3")
    guard_margin: float | str = _setting(
        "noise", type="str or float", allowed='"noise" or a number >= 0', shown_default='"noise"',
        parse=parsers.margin,
        doc="Adaptive drafting's guard: how far the arm that is not the winner (speculation or none) must lead it "
            "to take over. noise = the spread between the two windows of the running arm around the comparison, "
            "at least 2 %; a number = that fixed share (0 = any lead, the behaviour before 0.2.0) (docs/ADAPTIVE.md).",
        fix="use 'noise' or a number >= 0, e.g. 0.05")
    guard_confirm: bool = _setting(
        True, type="bool", allowed="true, false", shown_default="true", parse=parsers.flag,
        doc="Adaptive drafting's guard: a comparison that would change the winner (speculation or none) is repeated "
            "at once, and the winner changes only if the mean of both says so; false = one comparison decides "
            "(the behaviour before 0.2.0) (docs/ADAPTIVE.md).",
        fix="use true or false")
    reexplore_steps: float = _setting(
        32.0, type="float", allowed="number >= 0", shown_default="32", parse=parsers.non_negative,
        doc="Adaptive drafting: a request's own acceptance record of a source (DFlash, prompt lookup, merged) "
            "halves every this many steps in which it verified no draft of that source, so a request whose drafts "
            "stopped paying drifts back to the global estimate and is tried again; 0 = its record stays until it "
            "drafts that source again, which the planner no longer lets it do (docs/ADAPTIVE.md).",
        fix="use a number >= 0, e.g. 32 (0: off)")
    cross_lookup: int = _setting(
        100_000, type="int", allowed="integer 0 .. 1000000, or off", shown_default="100000",
        parse=parsers.tokens_or_off(CROSS_LOOKUP_MAX),
        doc="Adaptive drafting: where a request's own history has no prompt-lookup match, look up its suffix in "
            "other requests' prompts and outputs (suffix-decoding style), an index of at most this many tokens "
            "(~0.4 KB of host memory each), emptied with vLLM's prefix cache (/reset_prefix_cache). Only within a "
            "tenant: a request draws on requests with the same cache_salt and LoRA adapter (vLLM's prefix-cache "
            "isolation), never on another tenant's text. Off: `\"cross_lookup\": 0` (or off), the request's own "
            "history only. Used where the drafter runs in the engine-core process (TP = 1, synchronous "
            "scheduling); else off, logged.",
        fix=f"use a whole number of tokens up to {CROSS_LOOKUP_MAX} (~0.4 GB of host memory), e.g. 100000, or off "
            "(0)")
    defer_injection: bool = _setting(
        True, type="bool", allowed="true, false", shown_default="true", parse=parsers.flag,
        doc="Adaptive drafting: the context K/V of steps that run no draft forward are injected later, all in one "
            "call before the next draft forward (or at 4,096 held rows), instead of every step; the draft sees the "
            "same cache. false = inject every step.",
        fix="use true or false")
    draft_sampling: str = _setting(
        "auto", type="str", allowed='"auto", "greedy", "probabilistic"', shown_default='"auto"',
        parse=parsers.choice("auto", "greedy", "probabilistic"),
        doc="How a sampled request (temperature > 0) drafts its DFlash tokens: auto = the block's first slot drawn "
            "from the draft's marginal at the request's temperature, top-k and top-p and that q handed to vLLM's "
            "rejection sampler (accepted with sum min(p, q) instead of p(x); lossless), later slots the argmax (their "
            "marginals ignore the sampled tokens before them); probabilistic = every slot drawn; greedy = every slot "
            "the argmax (one-hot q). Greedy requests always draft the argmax. auto falls back to greedy where q "
            "cannot be used (diffusion_steps > 1, a rejection_sample_method other than standard); probabilistic "
            "makes that an error. vLLM's own key draft_sample_method (greedy or probabilistic) sets it too; both "
            "keys given with different values: refused.",
        fix="use 'auto', 'greedy' or 'probabilistic'")
    drafter: str = _setting(
        "ours", type="str", allowed='"ours", "vllm"', shown_default='"ours"', parse=parsers.choice("ours", "vllm"),
        doc="Which drafter serves method dflash: ours, or vLLM's built-in one on the same checkpoint (side-by-side "
            "comparisons; the other per-deployment settings then do nothing). vllm is also the way to serve what "
            "ours refuses at start-up, each refusal naming its key: DFlash2 and sliding-window drafts, block sizes "
            "other than 4, 8 and 16, draft_tensor_parallel_size 1 under tensor parallelism.",
        fix="use 'ours' (vllm_dflash's drafter) or 'vllm' (vLLM's built-in one)")

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, _parse(f, getattr(self, f.name), f"DFlashSettings.{f.name}"))

    @property
    def adaptive_mode(self) -> str | None:
        """None: the fixed block; 'both' (true), 'dflash', 'ngram' or 'merged': adaptive with those sources."""
        if self.adaptive is False:
            return None
        return "both" if self.adaptive is True else str(self.adaptive)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (it is hashed into vLLM's compile-cache key and pickled to every process)."""
        return asdict(self)


@dataclass(frozen=True)
class ProcessSettings:
    """Process settings: environment variables only (read when used; no vLLM channel carries them)."""

    cache: str | None = _setting(
        None, type="path", allowed="a folder", shown_default="~/.cache/vllm_dflash", parse=parsers.text_or_none,
        spec_key=False,
        doc="Where prepared models and data sets live (`vllm-dflash prepare-target`, benchmarks, demo).",
        fix="set it to a folder path")
    log_level: str = _setting(
        "INFO", type="str", allowed="DEBUG, INFO, WARNING, ERROR, CRITICAL", shown_default="INFO",
        parse=parsers.log_level, spec_key=False, doc="Level of the vllm_dflash loggers.", fix="use DEBUG, INFO, WARNING, ERROR or CRITICAL")
    metrics_dir: str | None = _setting(
        None, type="path", allowed="a folder", shown_default="a temporary folder made by the first process",
        parse=parsers.text_or_none, spec_key=False,
        doc="The folder in which each server makes a private folder of its own (removed at exit) where its "
            "processes write their metrics snapshots for the API server's /metrics collector (default: the system's "
            "temporary folder). The server exports its folder here to the processes vLLM starts for it.",
        fix="set it to a writable folder path")
    profile: bool = _setting(
        False, type="bool", allowed="1 / 0", shown_default="0", parse=parsers.flag, spec_key=False,
        doc="Time every target forward into vllm_dflash:target_forward_seconds (CPU, eager or compiled; the serving "
            "benchmark sets it). Engines with our drafter (others: DFLASH_VLLM_EXTRAS=all).", fix="use 1 or 0")
    trace: str | None = _setting(
        None, type="path", allowed="a folder", shown_default="off", parse=parsers.text_or_none, spec_key=False,
        doc="Adaptive drafting: write one JSON line per engine step (batch, query and produced tokens, the step's "
            "measured time, the guard's arm and rates, the plan's sources and lengths) to "
            "`<folder>/trace-<pid>.jsonl`, to see what the cost model and the guard decide on (docs/ADAPTIVE.md). "
            "A write error (full disk, folder removed) turns the trace off with one warning; serving goes on.",
        fix="set it to a writable folder path")
    trace_max_mb: float = _setting(
        64.0, type="float", allowed="> 0 (MiB)", shown_default="64", parse=parsers.pos_float, spec_key=False,
        doc="With `trace`: the size at which a trace file is rotated (renamed to `trace-<pid>.jsonl.1`, replacing the "
            "one before), so a trace takes at most twice this on disk.",
        fix="use a number of MiB > 0")
    skip_version_check: bool = _setting(
        False, type="bool", allowed="1 / 0", shown_default="0", parse=parsers.flag, spec_key=False,
        doc="Apply the patches on a vLLM other than 0.32.x (at your own risk; docs/CONTRACTS.md).", fix="use 1 or 0")
    ray_pg_timeout: float = _setting(
        300.0, type="float", allowed="> 0 (seconds)", shown_default="300", parse=parsers.pos_float, spec_key=False,
        doc="`--distributed-executor-backend ray` on CPU: how long the Ray executor waits for its placement group "
            "(one CPU bundle per tensor-parallel rank) before failing with a message (docs/TP.md).",
        fix="use a number of seconds > 0")
    cpu_gemv: int | str = _setting(
        0, type="int | str", allowed="off (0), auto, or 1..16 (rows)", shown_default="off", parse=parsers.cpu_gemv,
        spec_key=False,
        doc="bf16 linear layers on CPUs with avx512_bf16 (target and draft): a call with at most this many rows "
            "runs on our skinny-GEMM kernel (csrc/gemv_cpu.cpp), larger ones on vLLM's oneDNN GEMM. `auto`: 8 rows "
            "with 2+ OpenMP threads, else 2. Costs a second copy of each such weight. Ignored elsewhere (fp32, no "
            "avx512_bf16, or a layer vLLM does not give to oneDNN). Experimental: inside vLLM on a Xeon whose L3 holds "
            "the whole model it measured slower than vLLM's own GEMM (dev/results/gemv_vllm.md), so it "
            "stays off by default. Engines with our drafter (others: DFLASH_VLLM_EXTRAS=all).",
        fix="use off, auto or a number of rows from 1 to 16")
    cpu_gemm_f32: int | str = _setting(
        "auto", type="int | str", allowed="off (0), auto, all, or a number of rows", shown_default="auto",
        parse=parsers.cpu_gemm_f32, spec_key=False,
        doc="float32 linear layers on CPU (target and draft): a call with at most this many rows runs on our AVX2 "
            "GEMM (csrc/gemm_f32_cpu.cpp), larger ones on vLLM's oneDNN GEMM; `all`: every call. Our kernel sums "
            "each output in one fixed order, so a row's result does not depend on the batch it is in. `auto`: `all` "
            "on CPUs with avx2 and fma but no avx512f (measured faster than oneDNN at every row count from 1 to "
            "2048 on a 2-core AVX2 EPYC: dev/results/gemm_f32.md), off elsewhere (not measured there). "
            "Costs nothing in memory when vLLM drops its own copy of the weight (every layer but a tied LM head). "
            "Engines with our drafter (others: DFLASH_VLLM_EXTRAS=all).",
        fix="use off, auto, all or a number of rows >= 1")
    onednn_cache: int = _setting(
        512, type="int", allowed="off (0) or 32..8192 (row counts)", shown_default="512", parse=parsers.onednn_cache,
        spec_key=False,
        doc="Row counts (M) for which vLLM's CPU oneDNN GEMM keeps a built primitive per weight shape (vLLM: 32). "
            "When a model loads, those of every decode step the engine can schedule (1 .. max_num_seqs x (1 + "
            "num_speculative_tokens), at most half of this) are built up front, so a speculative step never builds "
            "one mid-step. Engines with our drafter (others: DFLASH_VLLM_EXTRAS=all); `off` keeps vLLM's behaviour.",
        fix="use off or a number from 32 to 8192")
    vllm_extras: str = _setting(
        "off", type="str", allowed="off, fixes, all", shown_default="off", parse=parsers.choice("off", "fixes", "all"),
        spec_key=False,
        doc="Our vLLM patches for engines WITHOUT our DFlash drafter (no speculation, n-gram, EAGLE, vLLM's own "
            "drafter), process-wide. off: such engines run stock vLLM (the plugin only logs that it is inactive). "
            "fixes: also our vLLM bug fixes (seeded chunked prefill on CPU, LoRA on CPU: prompt_logprobs and base "
            "requests batched with adapter requests, the compile cache on CPU, the CPU expand kernel's "
            "temperatures, Ray on CPU, OpenMP threads after numba). all: fixes plus the CPU speed-ups (the model in the engine "
            "core, fp32 GEMM, oneDNN cache, plain sampling for draft-less steps, one-pass greedy verification, "
            "DFLASH_PROFILE). An engine with our drafter always gets all of them. A bad value is warned about and "
            "read as off.",
        fix="use off, fixes or all")
    dtype: str | None = _setting(
        None, type="str", allowed=", ".join(parsers.DTYPES),
        shown_default="bfloat16 with a GPU or native CPU bf16, else float32", parse=parsers.dtype, spec_key=False,
        doc="Model dtype of the CLI, demo, benchmarks and evaluation (not of a plain `vllm serve`).",
        fix=f"use one of {', '.join(parsers.DTYPES)}")

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, _parse(f, getattr(self, f.name), f"ProcessSettings.{f.name}"))


DEPLOYMENT_FIELDS = {f.name: f for f in fields(DFlashSettings)}
PROCESS_FIELDS = {f.name: f for f in fields(ProcessSettings)}


def env_name(name: str) -> str:
    """The environment variable of a setting (per-deployment default or process setting)."""
    if name not in DEPLOYMENT_FIELDS and name not in PROCESS_FIELDS:
        raise KeyError(f"vllm_dflash: no setting {name!r}")
    return ENV_PREFIX + name.upper()


# our speculative-config keys -> their env var (vLLM's SpeculativeConfig forbids unknown keys: we pop these)
SPEC_KEYS = {name: env_name(name) for name, f in DEPLOYMENT_FIELDS.items() if f.metadata["spec_key"]}


def deprecated_env_name(name: str) -> str:
    return DEPRECATED_ENV_PREFIX + name.upper()


def all_env_names(deprecated: bool = True) -> list[str]:
    """Every environment variable the package reads (e.g. to clear them for an isolated server)."""
    names = [*DEPLOYMENT_FIELDS, *PROCESS_FIELDS]
    return [env_name(n) for n in names] + ([deprecated_env_name(n) for n in names] if deprecated else [])


def _parse(f, raw: Any, where: str) -> Any:
    try:
        return f.metadata["parse"](raw)
    except ValueError:
        raise DFlashConfigError(where, f"got {raw!r}", f.metadata["fix"]) from None


# --------------------------------------------------------------------------- environment (with the aliases)
_WARNED: set[str] = set()


def _warn_deprecated(old: str, new: str, ignored: bool) -> None:
    if old in _WARNED:
        return
    _WARNED.add(old)
    log = logging.getLogger(__name__)  # not utils.get_logger: utils reads settings (no import circle)
    if ignored:
        log.warning("vllm_dflash: %s is deprecated and ignored because %s is set; unset %s", old, new, old)
    else:
        log.warning("vllm_dflash: %s is deprecated (VLLM_* names belong to vLLM); rename it to %s "
                    "(the old name is still read in this release)", old, new)


def raw_env(name: str, environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(variable name, value) of a setting from the environment: DFLASH_<NAME>, else the deprecated
    VLLM_DFLASH_<NAME> (warned once). None when neither is set (an empty value counts as unset)."""
    env = os.environ if environ is None else environ
    new, old = env_name(name), deprecated_env_name(name)
    if env.get(new, "").strip():
        if env.get(old, "").strip():
            _warn_deprecated(old, new, ignored=True)
        return new, env[new]
    if env.get(old, "").strip():
        _warn_deprecated(old, new, ignored=False)
        return old, env[old]
    return None


def parse_value(name: str, raw: Any, where: str | None = None) -> Any:
    """One setting's canonical value from a raw one (DFlashConfigError naming `where` when invalid)."""
    f = DEPLOYMENT_FIELDS.get(name) or PROCESS_FIELDS[name]
    return _parse(f, raw, where or name)


def env_default(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """A per-deployment setting outside any engine (tests, benchmarks, standalone ops): env var, else default."""
    f = DEPLOYMENT_FIELDS[name]
    got = raw_env(name, environ)
    return f.default if got is None else _parse(f, got[1], got[0])


def process_setting(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """A process setting from the environment (read on each call: the environment can change), else its default."""
    f = PROCESS_FIELDS[name]
    got = raw_env(name, environ)
    return f.default if got is None else _parse(f, got[1], got[0])


# --------------------------------------------------------------------------- per-deployment resolution
# vLLM's own speculative-config keys that say what one of our settings says -> (our setting, vLLM's values). Honoured,
# never ignored: the value sets ours as our key would (and stays in the config for vLLM); both keys given with
# different values is refused. (vLLM's draft_tensor_parallel_size has no setting of ours: integration/validation.py
# accepts the target's TP size and refuses the rest.)
VLLM_SPEC_KEYS: dict[str, tuple[str, tuple[str, ...]]] = {
    "draft_sample_method": ("draft_sampling", ("greedy", "probabilistic")),
}


def pop_spec_keys(spec: dict[str, Any]) -> dict[str, Any]:
    """Remove our keys from a speculative-config dict (vLLM rejects unknown keys); returns them, raw, with the
    values of vLLM's keys that map onto ours (VLLM_SPEC_KEYS; those stay in `spec`)."""
    ours = {k: spec.pop(k) for k in list(spec) if k in SPEC_KEYS}
    for key, (name, values) in VLLM_SPEC_KEYS.items():
        if key not in spec:
            continue
        value = spec[key]
        if value not in values:
            raise DFlashConfigError(f"speculative_config.{key}", f"got {value!r}",
                                    f"use one of {', '.join(map(repr, values))} (vLLM's values)")
        if name in ours and parse_value(name, ours[name], f"speculative_config.{name}") != value:
            raise DFlashConfigError(f"speculative_config.{key}", f"{value!r} contradicts speculative_config.{name} "
                                    f"= {ours[name]!r} (both say how drafts are sampled)", "give one of the two keys")
        ours.setdefault(name, value)
    return ours


def resolve(spec_keys: Mapping[str, Any] | None = None, additional: Mapping[str, Any] | None = None,
            environ: Mapping[str, str] | None = None) -> DFlashSettings:
    """Per-deployment settings: speculative-config key > additional_config["dflash"] > env var > default."""
    spec_keys, additional = spec_keys or {}, additional or {}
    if not isinstance(additional, Mapping):
        raise DFlashConfigError(f"additional_config.{ADDITIONAL_CONFIG_KEY}", f"is {type(additional).__name__}",
                                f"pass a JSON object with keys among {sorted(DEPLOYMENT_FIELDS)}")
    unknown = sorted(set(additional) - set(DEPLOYMENT_FIELDS))
    if unknown:
        raise DFlashConfigError(f"additional_config.{ADDITIONAL_CONFIG_KEY}", f"unknown key(s) {unknown}",
                                f"use keys among {sorted(DEPLOYMENT_FIELDS)}")
    values = {}
    for name, f in DEPLOYMENT_FIELDS.items():
        if name in spec_keys:
            values[name] = _parse(f, spec_keys[name], f"speculative_config.{name}")
        elif name in additional:
            values[name] = _parse(f, additional[name], f"additional_config.{ADDITIONAL_CONFIG_KEY}.{name}")
        elif (got := raw_env(name, environ)) is not None:
            values[name] = _parse(f, got[1], got[0])
    return DFlashSettings(**values)


def additional_config_section(additional_config: Any) -> Mapping[str, Any] | None:
    """additional_config["dflash"] of an EngineArgs / VllmConfig value (None when absent)."""
    if isinstance(additional_config, Mapping):
        return additional_config.get(ADDITIONAL_CONFIG_KEY)
    return None


def with_settings(additional_config: Any, settings: DFlashSettings) -> dict[str, Any]:
    """A NEW additional_config dict with settings under "dflash" (the caller's dict is never mutated)."""
    if additional_config is None:
        additional_config = {}
    if not isinstance(additional_config, Mapping):
        raise DFlashConfigError("additional_config", f"is a {type(additional_config).__name__}, not a dict, so "
                                "vllm_dflash cannot add its settings", "pass additional_config as a JSON object")
    return {**additional_config, ADDITIONAL_CONFIG_KEY: settings.to_dict()}


def from_vllm_config(vllm_config: Any) -> DFlashSettings:
    """The settings of the engine this config belongs to (engine core / worker side). The front end stored them
    complete in additional_config["dflash"]; a config that never passed there (no dflash speculative config)
    resolves from the environment and the defaults."""
    return resolve(None, additional_config_section(getattr(vllm_config, "additional_config", None)))


# --------------------------------------------------------------------------- docs/CONFIGURATION.md
def render_markdown() -> str:
    """docs/CONFIGURATION.md (tests/unit/test_settings.py checks the committed file equals this)."""
    return configuration_doc.render_markdown(DEPLOYMENT_FIELDS, PROCESS_FIELDS, env_name=env_name,
                                             additional_key=ADDITIONAL_CONFIG_KEY,
                                             deprecated_prefix=DEPRECATED_ENV_PREFIX)
