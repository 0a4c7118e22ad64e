# SPDX-License-Identifier: Apache-2.0
"""Baselines of the bench, the demo and `eval --engine vllm` are stock vLLM: the plugin is not loaded in their
processes (VLLM_PLUGINS excludes it); the plugin's CPU extras run under their own names (`none+extras`)."""
import pytest

from vllm_dflash.bench import configs, stats
from vllm_dflash.serve.server import PLUGIN_NAME, stock_env


def _loaded(env: dict[str, str], installed: list[str]) -> list[str]:
    """The plugins vLLM would load under `env` (vllm/plugins/__init__.py: unset = all, else the listed names)."""
    if "VLLM_PLUGINS" not in env:
        return installed
    allowed = env["VLLM_PLUGINS"].split(",")
    return [n for n in installed if n in allowed]


def test_stock_env_excludes_only_the_plugin():
    """stock_env names every other installed vLLM plugin and never ours; with ours alone it is '' (vLLM loads none);
    a VLLM_PLUGINS already set is kept less ours."""
    installed = ["lora_filesystem_resolver", PLUGIN_NAME, "other"]
    env = stock_env(installed, environ={})
    assert _loaded(env, installed) == ["lora_filesystem_resolver", "other"]
    assert stock_env([PLUGIN_NAME], environ={}) == {"VLLM_PLUGINS": ""}
    assert _loaded({"VLLM_PLUGINS": ""}, [PLUGIN_NAME]) == []
    assert stock_env(installed, environ={"VLLM_PLUGINS": f"{PLUGIN_NAME},other"}) == {"VLLM_PLUGINS": "other"}
    # the installed entry points: this checkout's plugin is installed, and excluded
    assert PLUGIN_NAME not in stock_env(environ={})["VLLM_PLUGINS"].split(",")


@pytest.mark.parametrize("name", ["none", "ngram", "none@mp", "ngram#b"])
def test_stock_baselines_exclude_the_plugin(name):
    """`none` and `ngram` (and their variants) are stock vLLM: their server env carries VLLM_PLUGINS without ours and
    none of the plugin's opt-in."""
    cfg = configs.lookup(name)
    assert cfg.stock and "VLLM_PLUGINS" in cfg.env
    assert PLUGIN_NAME not in cfg.env["VLLM_PLUGINS"].split(",")
    assert "DFLASH_VLLM_EXTRAS" not in cfg.env


def test_extras_rows_load_the_plugin_with_its_extras():
    """`none+extras` / `ngram+extras`: the plugin loaded (no VLLM_PLUGINS) with DFLASH_VLLM_EXTRAS=all; ngram's
    speculative config equals the stock row's."""
    none_x, ngram_x, ngram = configs.select(["none+extras", "ngram+extras", "ngram", "none"])[:3]
    for cfg in (none_x, ngram_x):
        assert not cfg.stock and "VLLM_PLUGINS" not in cfg.env and cfg.env["DFLASH_VLLM_EXTRAS"] == "all"
    assert ngram_x.speculative_config(None, 7) == ngram.speculative_config(None, 7) == configs.NGRAM_SPEC
    assert none_x.speculative_config(None, 7) is None
    assert "ngram-bare" not in configs.REGISTRY  # stock `ngram` replaces it


def test_default_configs_start_with_the_stock_baselines():
    """The bench's default run holds stock `none` and stock `ngram`, first, and our drafter."""
    assert configs.DEFAULT_CONFIGS[:2] == ("none", "ngram") and "ours" in configs.DEFAULT_CONFIGS
    assert all(configs.REGISTRY[n].stock for n in configs.DEFAULT_CONFIGS[:2])
    assert not any(configs.REGISTRY[n].stock for n in configs.DEFAULT_CONFIGS if n.startswith("ours"))


def test_speedup_divides_by_stock_none():
    """The report's speedup column is output tok/s over stock `none`, not over `none+extras`."""
    def run(config, tok_s):
        return {"config": config, "prompt_set": "p", "concurrency": 1, "ok": True, "output_tok_s": tok_s,
                "outputs": {"a": "x"}}

    runs = [run("none", 10.0), run("none+extras", 12.5), run("ours", 30.0)]
    stats.attach_baseline(runs)
    assert [r["speedup"] for r in runs] == [1.0, 1.25, 3.0]


def test_eval_baselines_run_in_a_stock_child(tmp_path, monkeypatch):
    """`eval --engine vllm`: a baseline runs in a child process (this module's `__main__`) whose env excludes the
    plugin; its results come back through a file, and its output stays off this process's stdout (`--json`)."""
    import json
    import sys

    from vllm_dflash.eval import vllm_engine

    seen = {}

    def runner(cmd, env, stdout):
        seen.update(cmd=cmd, env=env, stdout=stdout)
        job = json.loads(open(cmd[-2]).read())
        assert job["llm_kwargs"]["speculative_config"]["method"] == "ngram" and job["prompts"] == [[1, 2]]
        open(cmd[-1], "w").write(json.dumps([2.0, 8, {"vllm:generation_tokens_total": 8.0}]))
        return type("Proc", (), {"returncode": 0})()

    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    kwargs = {"model": "t", "speculative_config": {"method": "ngram"}}
    assert vllm_engine._run_stock(kwargs, [[1, 2]], 4, 1, runner=runner) == (2.0, 8, {
        "vllm:generation_tokens_total": 8.0})
    assert seen["cmd"][:3] == [sys.executable, "-m", "vllm_dflash.eval.vllm_engine"]
    assert PLUGIN_NAME not in seen["env"]["VLLM_PLUGINS"].split(",") and seen["stdout"] == sys.stderr.fileno()
    with pytest.raises(RuntimeError, match="stock vLLM baseline \\(ngram\\) failed"):
        vllm_engine._run_stock(kwargs, [[1, 2]], 4, 1, runner=lambda *a, **k: type("P", (), {"returncode": 1})())


def test_own_f32_gemm_only_where_the_plugin_acts(monkeypatch):
    """Which bench rows compare against stock `none` through a different float32 GEMM (our AVX2 kernel): DFlash rows
    with our drafter and the `+extras` rows, on CPUs where the kernel runs by default; never stock rows or vLLM's
    own DFlash drafter, never bf16, never with DFLASH_CPU_GEMM_F32=off (the `@onednn` variants)."""
    from vllm_dflash.bench import run as R
    from vllm_dflash.bench.configs import lookup
    from vllm_dflash.ops import gemm_f32

    monkeypatch.setattr(gemm_f32, "gemm_f32_supported", lambda: True)
    import vllm_dflash.integration.patches.cpu_gemv as G

    monkeypatch.setattr(G, "f32_rows", lambda v: 0 if v == 0 else 1 << 30)
    assert R.own_f32_gemm(lookup("ours"), "float32") and R.own_f32_gemm(lookup("none+extras"), "float32")
    assert not R.own_f32_gemm(lookup("vllm-dflash"), "float32")  # vLLM's drafter: the plugin does not act
    assert not R.own_f32_gemm(lookup("none"), "float32") and not R.own_f32_gemm(lookup("ngram"), "float32")
    assert not R.own_f32_gemm(lookup("ours"), "bfloat16")
    assert not R.own_f32_gemm(lookup("ours@onednn"), "float32")
    monkeypatch.setattr(gemm_f32, "gemm_f32_supported", lambda: False)
    assert not R.own_f32_gemm(lookup("ours"), "float32")
