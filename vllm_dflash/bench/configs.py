# SPDX-License-Identifier: Apache-2.0
"""Benchmark configurations: one registry entry per way of serving the target.

A configuration is a speculative method plus extra speculative-config keys and extra environment
variables for the server (DFLASH_* per-deployment defaults, docs/CONFIGURATION.md). Adding one is one
`BenchConfig(...)` in `REGISTRY`. Every configuration of a run shares the engine settings (threads, dtype,
--enforce-eager, max-num-seqs, KV space); only the speculative config and these env vars differ, and, for a
`NAME@mp` variant of any entry, vLLM's own CPU process layout (`--distributed-executor-backend mp`: a worker process
beside the engine core, where the plugin otherwise runs the model in the engine core).

The baselines `none` and `ngram` are stock vLLM: the plugin is not loaded in their servers (VLLM_PLUGINS lists every
installed vLLM plugin but ours, serve/server.py: stock_env), so a speed-up over `none` answers "how much faster than
the vLLM I have". `none+extras` and `ngram+extras` load the plugin with its CPU extras opted in
(DFLASH_VLLM_EXTRAS=all), so what those extras alone give is reported on its own row."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# The process-wide opt-in that gives a non-DFlash engine the plugin's bug fixes and CPU speed-ups (settings layer)
EXTRAS_ENV = {"DFLASH_VLLM_EXTRAS": "all"}
# vLLM prompt lookup; matches the drafts-per-step range of the DFlash configs at block 8 loosely (4 vs 7).
NGRAM_SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


@dataclass
class BenchConfig:
    name: str
    description: str
    method: str | None = None  # None: no speculation
    spec: dict[str, Any] = field(default_factory=dict)  # method-specific keys (e.g. ngram's lookup sizes)
    spec_extra: dict[str, Any] = field(default_factory=dict)  # extra keys our plugin pops (adaptive drafting, ...)
    env: dict[str, str] = field(default_factory=dict)
    uses_draft: bool = False
    hinted: bool = False  # serves the hinted draft (--hinted-draft) instead of --draft
    placeholder: str | None = None  # why the entry is not wired yet (shown when it turns out unavailable)
    server_args: list[str] = field(default_factory=list)  # extra `vllm serve` arguments (the @mp variants)
    stock: bool = False  # stock vLLM: the plugin is not loaded in the server (lookup() adds stock_env() to env)

    def speculative_config(self, draft: str | None, num_speculative_tokens: int | None) -> dict[str, Any] | None:
        if self.method is None:
            return None
        spec: dict[str, Any] = {"method": self.method, **self.spec}
        if self.uses_draft:
            if draft is None:
                raise ValueError(f"bench config {self.name!r} needs a draft. Fix: pass --draft")
            spec["model"] = draft
            if num_speculative_tokens is not None:
                spec["num_speculative_tokens"] = num_speculative_tokens
        spec.update(self.spec_extra)
        return spec

    def unavailable_reason(self, known_plugin_keys: dict[str, str] | None = None) -> str | None:
        """Why this configuration cannot run with the installed plugin (None: it can).

        vLLM's SpeculativeConfig rejects unknown keys; our plugin strips only the keys it knows
        (settings.SPEC_KEYS), so any other extra key would make `vllm serve` fail."""
        if not self.spec_extra:
            return None
        if known_plugin_keys is None:
            from vllm_dflash.settings import SPEC_KEYS

            known_plugin_keys = SPEC_KEYS
        unknown = sorted(k for k in self.spec_extra if k not in known_plugin_keys)
        if not unknown:
            return None
        why = (f"speculative-config key(s) {unknown} are not known to the installed vllm_dflash "
               f"(it strips only {sorted(known_plugin_keys)}; vLLM rejects other keys)")
        return f"{why}; {self.placeholder}" if self.placeholder else why


REGISTRY: dict[str, BenchConfig] = {c.name: c for c in [
    BenchConfig("none", "no speculation, stock vLLM (vllm_dflash not loaded: VLLM_PLUGINS excludes it)", stock=True),
    BenchConfig("none+extras", "no speculation, vllm_dflash loaded with its CPU extras opted in "
                "(DFLASH_VLLM_EXTRAS=all): what the plugin's CPU speed-ups alone give", env=dict(EXTRAS_ENV)),
    BenchConfig("none-overlap", "no speculation with overlap (async) scheduling on CPU (DFLASH_OVERLAP=1, "
                "DFLASH_VLLM_EXTRAS=all; vLLM forces it off on CPU): the engine core schedules step N+1 while the "
                "worker runs step N", env={"DFLASH_OVERLAP": "1", **EXTRAS_ENV}),
    BenchConfig("ngram", "vLLM prompt lookup (n-gram), stock vLLM (vllm_dflash not loaded: VLLM_PLUGINS excludes it; "
                "on CPU its worker runs torch on one OpenMP thread after the first proposal)", method="ngram",
                spec={k: v for k, v in NGRAM_SPEC.items() if k != "method"}, stock=True),
    BenchConfig("ngram+extras", "vLLM prompt lookup (n-gram), vllm_dflash loaded with its CPU extras opted in "
                "(DFLASH_VLLM_EXTRAS=all: e.g. its worker keeps every OpenMP thread, patches/cpu_omp_threads.py)",
                method="ngram", spec={k: v for k, v in NGRAM_SPEC.items() if k != "method"}, env=dict(EXTRAS_ENV)),
    BenchConfig("vllm-dflash", "vLLM's built-in dflash drafter, same draft checkpoint", method="dflash",
                env={"DFLASH_DRAFTER": "vllm"}, uses_draft=True),
    # `ours` carries no key of ours: it is what a user deploys with {"method": "dflash", "model": DRAFT}
    BenchConfig("ours", "vllm_dflash drafter as deployed, no extra key (the default, adaptive drafting): per request "
                "DFlash block, prompt lookup or the two merged, 0..k tokens from acceptance and an online step-cost "
                "model (synchronous scheduling)", method="dflash", env={"DFLASH_DRAFTER": "ours"}, uses_draft=True),
    BenchConfig("ours-overlap", "vllm_dflash drafter, adaptive with overlap scheduling: the drafter picks the source, "
                "our AsyncScheduler subclass plans 0..k tokens per request", method="dflash",
                env={"DFLASH_DRAFTER": "ours", "DFLASH_OVERLAP": "1"}, spec_extra={"adaptive": True},
                uses_draft=True),
    BenchConfig("ours-fixed", "vllm_dflash drafter, the paper's fixed block (adaptive: false): every step verifies "
                "the whole block; overlap scheduling", method="dflash", env={"DFLASH_DRAFTER": "ours"},
                spec_extra={"adaptive": False}, uses_draft=True),
    BenchConfig("ours-fixed-no-overlap", "vllm_dflash drafter, the paper's fixed block (adaptive: false), overlap off",
                method="dflash", env={"DFLASH_DRAFTER": "ours", "DFLASH_OVERLAP": "0"},
                spec_extra={"adaptive": False}, uses_draft=True),
    BenchConfig("ours-no-reexplore", "ours without re-exploration (reexplore_steps 0): a request whose drafts of a "
                "source stopped paying keeps its record and never tries that source again",
                method="dflash", env={"DFLASH_DRAFTER": "ours"}, spec_extra={"adaptive": True, "reexplore_steps": 0},
                uses_draft=True),
    BenchConfig("ours-no-cross", "ours without cross-request lookup (cross_lookup 0): prompt lookup in the "
                "request's own history only", method="dflash", env={"DFLASH_DRAFTER": "ours"},
                spec_extra={"adaptive": True, "cross_lookup": 0}, uses_draft=True),
    BenchConfig("ours-merged", "vllm_dflash drafter, adaptive with the merged source only: prompt-lookup tokens "
                "first, the DFlash block after them; 0..k tokens per request (synchronous scheduling)", method="dflash",
                env={"DFLASH_DRAFTER": "ours"}, spec_extra={"adaptive": "merged"}, uses_draft=True),
    BenchConfig("ours-hinted", "ours with the hinted draft (--hinted-draft): its block is fed the prompt-lookup "
                "continuation, [anchor, h1 .. hm, MASK ..]",
                method="dflash", env={"DFLASH_DRAFTER": "ours"}, spec_extra={"adaptive": True}, uses_draft=True,
                hinted=True),
]}

# the baselines first: stock vLLM without and with prompt lookup (the speed-ups are over stock `none`)
DEFAULT_CONFIGS = ("none", "ngram", "vllm-dflash", "ours", "ours-overlap", "ours-fixed", "ours-fixed-no-overlap")
# Names before result schema 2 (bench/meta.py: SCHEMA): `ours` was the fixed block, `ours-adaptive` the default.
RENAMED = {"ours": "ours-fixed", "ours-no-overlap": "ours-fixed-no-overlap", "ours-adaptive": "ours",
           "ours-adaptive-overlap": "ours-overlap"}


MP_SUFFIX = "@mp"  # a variant served with vLLM's worker process: --distributed-executor-backend mp
ONEDNN_SUFFIX = "@onednn"  # a variant with vLLM's own oneDNN GEMM for every linear layer (our GEMM kernels off)
LABEL_SEP = "#"  # NAME#LABEL: a labelled copy of NAME, so one run can hold NAME twice with different overrides


def _parts(name: str) -> tuple[str, list[str], str, str]:
    """`NAME@onednn@mp#LABEL` -> (base NAME, its suffixes, the label separator or '', the label)."""
    base, label_sep, label = name.partition(LABEL_SEP)
    suffixes = []
    while base.endswith((MP_SUFFIX, ONEDNN_SUFFIX)):
        suffix = MP_SUFFIX if base.endswith(MP_SUFFIX) else ONEDNN_SUFFIX
        suffixes.append(suffix)
        base = base[:-len(suffix)]
    return base, suffixes, label_sep, label


def renamed(name: str) -> str:
    """A configuration name of a result written before schema 2 under today's name (`RENAMED`), suffixes and label
    kept: `ours-adaptive#g11` -> `ours#g11`, `ours@mp` -> `ours-fixed@mp`; other names unchanged."""
    base, suffixes, label_sep, label = _parts(name)
    if base not in RENAMED:
        return name
    return RENAMED[base] + "".join(reversed(suffixes)) + label_sep + label


def lookup(name: str) -> BenchConfig:
    """A copy of the registry entry `name` (a stock entry's env keeps the plugin out: `stock_env`), or of its
    variants: `NAME@mp` (vLLM's worker-process layout on CPU),
    `NAME@onednn` (vLLM's oneDNN GEMM for every linear layer: DFLASH_CPU_GEMM_F32=off, DFLASH_CPU_GEMV=off), or
    both (`NAME@onednn@mp`). `NAME#LABEL` (after any of those): a copy of NAME under its own name, for side-by-side
    A/Bs of `--spec-extra` / `--env-extra` overrides (e.g. `ours` against `ours#g11` with
    `ours#g11:guard_threshold=1.1`)."""
    import copy

    base, suffixes, label_sep, label = _parts(name)
    if label_sep and not label:
        raise ValueError(f"bench: configuration {name!r} has an empty label. Fix: write NAME{LABEL_SEP}LABEL")
    if base not in REGISTRY and base in RENAMED:
        raise ValueError(f"bench: configuration {base!r} was renamed: {RENAMED[base]!r} (`ours` is the default, "
                         f"adaptive drafting; `ours-fixed` the paper's fixed block). Fix: write {renamed(name)!r}")
    if base not in REGISTRY or len(set(suffixes)) != len(suffixes):
        raise ValueError(f"bench: unknown configuration {name!r}. Fix: use one of {list(REGISTRY)}, with "
                         f"{MP_SUFFIX} for vLLM's worker process and/or {ONEDNN_SUFFIX} for vLLM's oneDNN GEMM, "
                         f"then optionally {LABEL_SEP}LABEL")
    cfg = copy.deepcopy(REGISTRY[base])
    cfg.name = name
    if cfg.stock:
        from vllm_dflash.serve.server import stock_env

        cfg.env = {**stock_env(), **cfg.env}
    if MP_SUFFIX in suffixes:
        cfg.description += ("; with vLLM's own CPU process layout (--distributed-executor-backend mp): the model in a "
                            "worker process beside the engine core")
        cfg.server_args = [*cfg.server_args, "--distributed-executor-backend", "mp"]
    if ONEDNN_SUFFIX in suffixes:
        cfg.description += "; every linear layer on vLLM's oneDNN GEMM (our CPU GEMM kernels off)"
        cfg.env.update({"DFLASH_CPU_GEMM_F32": "off", "DFLASH_CPU_GEMV": "off"})
    if label:
        cfg.description += f"; labelled copy {label!r} (its overrides, if any, are listed under the run's command)"
    return cfg


def select(names: list[str], spec_extra: Sequence[str] = (), env_extra: Sequence[str] = ()) -> list[BenchConfig]:
    """Registry entries by name (in the given order; `NAME@mp`: see `lookup`), with `CONFIG:KEY=VALUE` overrides
    applied to copies.

    spec_extra values are JSON when they parse (`true`, `2`, `0.8`), strings otherwise."""
    import json

    from vllm_dflash.settings import SPEC_KEYS

    if "none" not in names:
        raise ValueError("bench: configuration 'none' is required (the speedup and losslessness baseline). "
                         "Fix: add it to --configs")
    chosen = {n: lookup(n) for n in names}
    for item, target in [(s, "spec") for s in spec_extra] + [(e, "env") for e in env_extra]:
        name, _, kv = item.partition(":")
        key, eq, value = kv.partition("=")
        if not (name and key and eq):
            raise ValueError(f"bench: bad override {item!r}. Fix: write CONFIG:KEY=VALUE")
        if name not in chosen:
            raise ValueError(f"bench: override {item!r} names a configuration not in --configs ({list(chosen)})")
        if target == "env":
            chosen[name].env[key] = value
        else:
            try:
                val = json.loads(value)
            except json.JSONDecodeError:
                val = value
            # a key of vLLM's own SpeculativeConfig (e.g. prompt_lookup_min of n-gram) goes to vLLM as is; the
            # rest are our plugin's keys, checked against what the installed plugin strips (unavailable_reason)
            ours = key in SPEC_KEYS  # checked first: vLLM is imported only for a key that is not ours
            (chosen[name].spec if not ours and key in vllm_spec_keys() else chosen[name].spec_extra)[key] = val
    return [chosen[n] for n in names]


def vllm_spec_keys() -> frozenset[str]:
    """The fields of the installed vLLM's SpeculativeConfig (empty when vLLM cannot be imported)."""
    import dataclasses

    try:
        from vllm.config import SpeculativeConfig
    except Exception:  # noqa: BLE001 - no vLLM here: every extra key is then judged as one of ours
        return frozenset()
    return frozenset(f.name for f in dataclasses.fields(SpeculativeConfig))
