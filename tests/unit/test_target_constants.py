# SPDX-License-Identifier: Apache-2.0
"""No target-specific constants in the library: the mask token, the target layers and the draft's shape come from
the draft's config, from arguments, or from the one table of known target families (vllm_dflash.config); the
bundled draft is resolved explicitly; nothing writes into the source tree by default. Fast, no vLLM."""
import argparse
import ast
import json
import shutil
from pathlib import Path

import pytest
import torch

import vllm_dflash
from vllm_dflash.config import (KNOWN_MASK_TOKEN_IDS, DFlashConfig, default_mask_token_id, known_mask_token_id,
                                target_family)
from vllm_dflash.model import DFlashDraftModel

PKG = Path(vllm_dflash.__file__).resolve().parent
# A small target that is in no known table (not SmolLM2): its mask must come from the draft config or an argument.
TINY = {"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 300, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "max_position_embeddings": 256}
KNOWN_KEY = next(iter(KNOWN_MASK_TOKEN_IDS))


def _known_family_config() -> dict:
    """A tiny config of a KNOWN family (same model_type / vocabulary as a table entry, small shapes)."""
    return {**TINY, "model_type": KNOWN_KEY[0], "vocab_size": KNOWN_KEY[1]}


# ----------------------------------------------------------------- the known table and the config builders
def test_known_table_is_the_only_source_of_a_default_mask():
    assert known_mask_token_id(TINY) is None
    with pytest.raises(ValueError, match="--mask-token-id"):
        default_mask_token_id(TINY)
    fam = _known_family_config()
    assert target_family(fam) == KNOWN_KEY
    assert default_mask_token_id(fam) == KNOWN_MASK_TOKEN_IDS[KNOWN_KEY]
    # the training module re-exports the same table (one place, not a copy)
    from vllm_dflash.train import run

    assert run.KNOWN_MASK_TOKEN_IDS is KNOWN_MASK_TOKEN_IDS


def test_for_target_takes_the_mask_from_the_argument_or_the_table():
    cfg = DFlashConfig.for_target(TINY, num_layers=1, block_size=4, num_features=3, mask_token_id=7)
    assert cfg.mask_token_id == 7 and cfg.vocab_size == 300 and cfg.num_target_layers == 6
    assert cfg.hidden_size == 64 and len(cfg.target_layer_ids) == 3 and max(cfg.target_layer_ids) < 6
    with pytest.raises(ValueError, match="--mask-token-id"):
        DFlashConfig.for_target(TINY)
    assert DFlashConfig.for_target(_known_family_config()).mask_token_id == KNOWN_MASK_TOKEN_IDS[KNOWN_KEY]


# ----------------------------------------------------------------- DFlashDraftModel: no SmolLM2 defaults
def test_model_has_no_default_target():
    import vllm_dflash.model as model

    assert not hasattr(model, "SMOLLM2_DEFAULTS")
    with pytest.raises(TypeError, match="missing .*vocab_size.*Fix"):
        DFlashDraftModel(hidden_size=576, num_layers=2, block_size=8)


def test_model_shape_from_keywords_or_the_target_config():
    m = DFlashDraftModel(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=96,
                         vocab_size=300, num_target_layers=6, mask_token_id=5, block_size=4)
    c = m.config
    assert (c.num_hidden_layers, c.head_dim, c.vocab_size, c.mask_token_id) == (2, 16, 300, 5)
    assert len(c.target_layer_ids) == 5 and max(c.target_layer_ids) < 6  # derived from the target's depth
    t = DFlashDraftModel(target_config=TINY, num_layers=2, block_size=4, mask_token_id=9, num_features=2,
                         diffusion_steps=2)
    assert (t.config.num_hidden_layers, t.config.block_size, t.config.mask_token_id) == (2, 4, 9)
    assert t.config.num_features == 2 and t.config.diffusion_steps == 2 and t.config.vocab_size == 300
    assert t.fc.weight.shape == (64, 2 * 64)
    with pytest.raises(ValueError, match="--mask-token-id"):
        DFlashDraftModel(target_config=TINY, num_layers=1)
    # DFlashDraftModel(config) and config + overrides keep working
    assert DFlashDraftModel(t.config).config == t.config
    assert DFlashDraftModel(t.config, num_layers=1).config.num_hidden_layers == 1
    with pytest.raises(TypeError, match="not both"):
        DFlashDraftModel(t.config, target_config=TINY)
    with pytest.raises(TypeError, match="unknown argument"):
        DFlashDraftModel(target_config=TINY, mask_token_id=1, not_a_field=3)


@pytest.mark.parametrize("mask", [5, 11])
def test_drafting_fills_the_block_with_the_configs_mask(mask):
    torch.manual_seed(0)
    d = DFlashDraftModel(target_config=TINY, block_size=4, mask_token_id=mask, num_features=2).eval()
    d.bind_target(torch.randn(300, 64) * 0.02, torch.randn(300, 64) * 0.02)
    seen = []
    embed = d.embed
    d.embed = lambda ids: seen.append(ids.clone()) or embed(ids)
    ctx = d.context_kv(d.fuse(torch.randn(1, 3, d.config.feature_size)), torch.arange(3)[None])
    d.draft_block(torch.tensor([7]), torch.tensor([3]), ctx)
    assert seen and seen[0][0, 0] == 7 and bool((seen[0][0, 1:] == mask).all())


# ----------------------------------------------------------------- train: never a silent mask
@pytest.fixture
def no_model_load(monkeypatch):
    """run_train must decide the mask before loading the target model: loading it fails the test."""
    import transformers

    class Loaded(Exception):
        pass

    def boom(*a, **k):
        raise Loaded("the target model was loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    return Loaded


def test_train_on_an_unknown_target_names_mask_token_id_before_loading(no_model_load, tmp_path, pair):
    from vllm_dflash.train.run import run_train

    with pytest.raises(ValueError, match="--mask-token-id"):
        run_train(data=str(tmp_path / "no-data"), out=str(tmp_path / "run"), target=str(pair / "target"),
                  device="cpu")
    with pytest.raises(no_model_load):  # given a mask it goes on (to the model load, stubbed here)
        run_train(data=str(tmp_path / "no-data"), out=str(tmp_path / "run"), target=str(pair / "target"),
                  device="cpu", mask_token_id=3)


def test_resume_with_another_mask_is_named(no_model_load, tmp_path, pair):
    from vllm_dflash.train.run import run_train

    ckpt = tmp_path / "run" / "checkpoint"
    ckpt.mkdir(parents=True)
    shutil.copy(pair / "draft-b8" / "config.json", ckpt / "config.json")
    saved = DFlashConfig.from_pretrained(ckpt).mask_token_id
    with pytest.raises(ValueError, match="--mask-token-id"):
        run_train(data="x", out=str(tmp_path / "run"), target=str(pair / "target"), device="cpu",
                  mask_token_id=saved + 1)
    with pytest.raises(no_model_load):  # the same mask (or none) resumes
        run_train(data="x", out=str(tmp_path / "run"), target=str(pair / "target"), device="cpu")


# ----------------------------------------------------------------- collect: the mask recorded and counted
def test_collect_mask_default_and_count(tmp_path, monkeypatch, pair):
    import vllm_dflash.data.collect as col

    fam = tmp_path / "known-target"
    fam.mkdir()
    (fam / "config.json").write_text(json.dumps(_known_family_config()))
    assert col.resolve_collect_mask(fam, None) == KNOWN_MASK_TOKEN_IDS[KNOWN_KEY]
    assert col.resolve_collect_mask(pair / "target", None) is None  # unknown: nothing to count, no guess
    assert col.resolve_collect_mask(pair / "target", 5) == 5

    out = tmp_path / "c"
    out.mkdir()
    recs = [{"id": "a", "prompt_ids": [5, 5], "response_ids": [1, 5, 5, 2]},
            {"id": "b", "prompt_ids": [1], "response_ids": [1, 2, 3]},
            {"id": "c", "prompt_ids": [1], "response_ids": [5]}]
    (out / "part-00000.npz").write_bytes(col.encode_part(recs))
    assert col.count_mask(recs, 5) == (3, 2) and col.count_mask(recs, None) == (0, 0)
    warned = []
    monkeypatch.setattr(col.logger, "warning", lambda *a: warned.append(a))
    cfg = col.CollectConfig(target=str(pair / "target"), out_dir=str(out), mask_token_id=5)
    man = col.Collector(cfg, prompts=[]).run(progress=False)  # nothing to generate: no vLLM engine
    assert man["mask_token_id"] == 5 and man["mask_token_in_responses"] == 3 and man["mask_token_responses"] == 2
    assert warned and "--mask-token-id" in warned[0][0]
    warned.clear()
    cfg = col.CollectConfig(target=str(pair / "target"), out_dir=str(tmp_path / "d"), mask_token_id=4)
    man = col.Collector(cfg, prompts=[]).run(progress=False)
    assert man["mask_token_in_responses"] == 0 and not warned


# ----------------------------------------------------------------- the bundled draft and output folders
def test_default_draft_is_resolved_explicitly(tmp_path, monkeypatch, pair):
    import vllm_dflash.drafts as demo

    monkeypatch.setattr(demo, "checkout_draft_dir", lambda: tmp_path / "no-checkout" / demo.BUNDLED_DRAFT_NAME)
    with pytest.raises(FileNotFoundError, match="--draft"):
        demo.resolve_draft_arg(None, pair / "target")
    with pytest.raises(ValueError, match="--draft"):  # another target never gets the default target's draft
        demo.resolve_draft_arg(None, pair / "target", default_target=False)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        demo.resolve_draft_arg(tmp_path / "missing", pair / "target")
    assert demo.resolve_draft_arg(pair / "draft-b8", pair / "target") == (pair / "draft-b8", False)
    bundled = tmp_path / "checkout" / demo.BUNDLED_DRAFT_NAME
    shutil.copytree(pair / "draft-b8", bundled)
    monkeypatch.setattr(demo, "checkout_draft_dir", lambda: bundled)
    assert demo.resolve_draft_arg(None, pair / "target") == (bundled, False)


def test_untrained_draft_needs_a_known_or_given_mask(tmp_path, monkeypatch, pair):
    import vllm_dflash.drafts as demo

    monkeypatch.setenv("VLLM_DFLASH_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="--mask-token-id"):
        demo.resolve_draft_arg("untrained", pair / "target")
    path = demo.untrained_draft(pair / "target", block_size=4, mask_token_id=5)
    assert path.is_relative_to(tmp_path / "cache") and DFlashConfig.from_pretrained(path).mask_token_id == 5
    assert demo.untrained_draft(pair / "target", block_size=4, mask_token_id=6) != path  # keyed by the mask too


def test_bench_writes_under_the_current_directory_by_default():
    from vllm_dflash.bench import run

    assert not hasattr(run, "REPO")
    p = argparse.ArgumentParser()
    run.add_arguments(p)
    a = p.parse_args([])
    assert a.out_dir == "bench-results" and not Path(a.out_dir).is_absolute() and a.log_dir is None


# ----------------------------------------------------------------- CLI help shows every default
def _cli_parsers(monkeypatch) -> dict[str, argparse.ArgumentParser]:
    from vllm_dflash import cli

    class Built(Exception):
        pass

    got = {}

    def capture(self, *a, **k):
        got["p"] = self
        raise Built

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    with pytest.raises(Built):
        cli.main(["--help"])
    sub = next(a for a in got["p"]._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_cli_help_shows_every_default(monkeypatch):
    from vllm_dflash.utils import HelpFormatter

    parsers = _cli_parsers(monkeypatch)
    assert {"collect", "train", "eval", "demo", "bench", "export", "prepare-target"} <= set(parsers)
    missing = []
    for name, p in parsers.items():
        assert p.formatter_class is HelpFormatter, name
        fmt = p._get_formatter()
        for act in p._actions:
            if act.option_strings and act.help != argparse.SUPPRESS and not act.required \
                    and not isinstance(act, argparse._HelpAction):
                if "default" not in fmt._get_help_string(act):
                    missing.append(f"{name} {act.option_strings[0]}")
    assert not missing, missing
    collect = {o for a in parsers["collect"]._actions for o in a.option_strings}
    assert "--mask-token-id" in collect


# ----------------------------------------------------------------- source scan: no literal mask ids
# Allowed: config.py holds the table of known targets (KNOWN_MASK_TOKEN_IDS), the one place such ids live.
_ALLOWED = {"config.py"}


def _literal_masks(tree: ast.AST) -> list[int]:
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "mask_token_id" and isinstance(node.value, ast.Constant):
            bad.append(node.value.lineno)
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value == "mask_token_id" and isinstance(v, ast.Constant):
                    bad.append(v.lineno)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and "mask" in t.id.lower() and isinstance(node.value.value, int)
                   and not isinstance(node.value.value, bool) for t in targets):
                bad.append(node.lineno)
        elif isinstance(node, ast.Name) and node.id == "SMOLLM2_DEFAULTS":
            bad.append(node.lineno)
    return bad


def test_library_source_has_no_literal_mask_id():
    found = {}
    for f in sorted(PKG.rglob("*.py")):
        rel = f.relative_to(PKG).as_posix()
        if rel in _ALLOWED:
            continue
        lines = _literal_masks(ast.parse(f.read_text(), str(f)))
        if lines:
            found[rel] = lines
    assert not found, f"literal mask token ids (use the draft config, an argument or config.KNOWN_MASK_TOKEN_IDS): {found}"


def test_the_scan_catches_a_literal_mask():
    src = ("f(mask_token_id=16)\n"
           "d = {'mask_token_id': 16}\n"
           "MASK = 16\n"
           "x = SMOLLM2_DEFAULTS\n")
    assert sorted(_literal_masks(ast.parse(src))) == [1, 2, 3, 4]
    assert _literal_masks(ast.parse("f(mask_token_id=cfg.mask_token_id)\nmask = known(cfg)\n")) == []


def test_package_code_does_not_assume_a_checkout():
    """Only drafts.checkout_draft_dir looks beside the package (and it is checked before use); nothing else builds
    paths above the package (the repository root, models/, benchmarks/, runs/)."""
    offenders = []
    for f in sorted(PKG.rglob("*.py")):
        rel = f.relative_to(PKG).as_posix()
        text = f.read_text()
        for i, line in enumerate(text.splitlines(), 1):
            if ("parents[2]" in line or "parent.parent" in line) and rel != "drafts.py":
                offenders.append(f"{rel}:{i}")
    assert not offenders, offenders
