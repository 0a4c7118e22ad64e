# SPDX-License-Identifier: Apache-2.0
"""Every DFlash draft vLLM 0.32 serves, we serve too, or refuse at start-up naming the key and `"drafter": "vllm"`
(integration/draft_layouts.py, integration/hub.py). One process, tiny drafts, float32 greedy, 8 tokens:

* each layout ours serves (the published layout with z-lab's keys; the speculators layout, whose default is causal
  attention, with a reduced draft vocabulary) runs through ours and through vLLM's own drafter with the target's own
  greedy tokens and the same drafts accepted (the same network read the same way);
* a draft given by Hugging Face Hub id, offline (HF_HUB_OFFLINE=1, HF_HUB_CACHE a cache this test fills), at the
  default branch and at a named `revision`, serves as its local folder does;
* DFlash2 (speculators type dflash2, and the published DFlash2DraftModel) is refused by ours with the key and the way
  out; with `"drafter": "vllm"` it reaches vLLM's own code, which on CPU refuses it itself (Model Runner V1 has no
  candidate heads, Model Runner V2 needs Triton): the same outcome as without the plugin;
* vLLM's `draft_sample_method` sets our draft_sampling (never ignored)."""
import pytest
from support import draft_layouts as layouts
from support.vllm_helpers import counter, run_vllm

pytestmark = pytest.mark.vllm
PROMPTS = [list(range(5, 25)), list(range(30, 41)), list(range(100, 140))]
HUB_ID, HUB_REV_ID = "test-org/tiny-dflash-b8", "test-org/tiny-dflash-speculators"
SETTINGS = "probe['draft_sampling'] = llm.llm_engine.vllm_config.additional_config['dflash']['draft_sampling']"
# which drafter class ran, and whether it built causal attention metadata for the draft (vLLM's DFlashProposer rule)
DRAFTER = """
drafter = llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter
hf = drafter.draft_model_config.hf_config.to_dict()
probe.update(drafter=type(drafter).__name__, causal=bool(drafter.dflash_causal),
             hf={k: hf.get(k) for k in ("architectures", "dflash_config", "draft_vocab_size", "hidden_size")})
"""


@pytest.fixture(scope="module")
def results(pair, tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    src, target = pair / "draft-b8", pair / "target"
    drafts = {"published": layouts.published(src, root / "published"),
              "speculators": layouts.speculators(src, root / "speculators", target, draft_vocab_size=320),
              "dflash2": layouts.dflash2(src, root / "dflash2", target),
              "dflash2_published": layouts.dflash2_published(src, root / "dflash2-published")}
    cache = root / "hf" / "hub"
    layouts.hub_cache(drafts["published"], cache, HUB_ID)
    layouts.hub_cache(drafts["speculators"], cache, HUB_REV_ID, commit="f" * 40, revision="v1")  # no main branch

    def run(model, **spec):
        return {"model": str(target), "prompts": PROMPTS, "max_tokens": 8,
                **({} if model is None else {"speculative_config": {"method": "dflash", "model": str(model),
                                                                    "num_speculative_tokens": 7, **spec},
                                             "after": DRAFTER})}

    def refused(model, **spec):
        return {**run(model, **spec), "expect_error": True}

    runs = {"base": run(None)}
    for name in ("published", "speculators"):
        runs[f"{name}_ours"] = run(drafts[name], adaptive=False)  # the fixed block: vLLM's drafts, compared below
        runs[f"{name}_vllm"] = run(drafts[name], drafter="vllm")
    runs["hub"] = run(HUB_ID, adaptive=False)
    runs["hub_revision"] = run(HUB_REV_ID, revision="v1", adaptive=False)
    runs["sample_method"] = {**run(drafts["published"], draft_sample_method="probabilistic"), "after": SETTINGS}
    runs["dflash2_ours"] = refused(drafts["dflash2"])
    runs["dflash2_published_ours"] = refused(drafts["dflash2_published"])
    runs["dflash2_vllm"] = refused(drafts["dflash2"], drafter="vllm")
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(root / "hf"), "HF_HUB_CACHE": str(cache)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DFLASH_TEST_ZYGOTE", "0")  # huggingface_hub reads HF_* when imported: a fresh interpreter
        out = run_vllm(list(runs.values()), env=env)
    return {**dict(zip(runs, out, strict=True)), "_drafts": drafts}


@pytest.mark.parametrize("layout", ["published", "speculators"])
def test_served_by_ours_as_by_vllm(results, layout):
    """Both drafters keep the target's greedy tokens, and accept the same drafts: our reading of the layout is
    vLLM's (a wrong layer offset, mask id, causality or vocabulary map would change what is accepted)."""
    base, ours, theirs = results["base"], results[f"{layout}_ours"], results[f"{layout}_vllm"]
    assert ours["tokens"] == base["tokens"] and theirs["tokens"] == base["tokens"]
    assert ours["probe"]["drafter"] == "DFlashDrafter" and theirs["probe"]["drafter"] == "DFlashProposer"
    # the speculators layout without sliding_window_non_causal: causal attention in vLLM (algos.py), so in ours
    assert ours["probe"]["causal"] == theirs["probe"]["causal"] == (layout == "speculators")
    for name in ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens"):
        assert counter(ours, name) == counter(theirs, name) > 0, name


def test_speculators_read_as_vllm_reads_it(results):
    """Our reading of a speculators config.json (draft_layouts.from_speculators, used at start-up) is the config vLLM
    built from the same file (its SpeculatorsConfig, which our drafter reads in the worker)."""
    import json

    from vllm_dflash.integration import draft_layouts

    raw = json.loads((results["_drafts"]["speculators"] / "config.json").read_text())
    vllms = results["speculators_vllm"]["probe"]["hf"]
    assert {k: draft_layouts.from_speculators(raw).get(k) for k in vllms} == vllms


def test_hub_id_offline(results):
    """A Hub id (and a Hub id at a revision) serves from the cache as its local folder does, and says so."""
    for hub, local in (("hub", "published_ours"), ("hub_revision", "speculators_ours")):
        assert results[hub]["tokens"] == results[local]["tokens"] == results["base"]["tokens"]
        assert counter(results[hub], "vllm:spec_decode_num_accepted_tokens") == counter(
            results[local], "vllm:spec_decode_num_accepted_tokens") > 0
    log = results["hub"]["log"]
    assert f"vllm_dflash: draft {HUB_ID} at " in log and f"draft {HUB_REV_ID} (revision v1) at " in log


def test_dflash2_refused_with_the_way_out(results):
    for name, key in (("dflash2_ours", "speculators_model_type"), ("dflash2_published_ours", "architectures")):
        err = results[name]["error"]
        assert err and f"{key}: a DFlash2 draft" in err and '"drafter": "vllm"' in err, err
    err = results["dflash2_vllm"]["error"]  # vLLM's own refusal, reached untouched
    assert err and "DFlash candidate-head drafts" in err and "vllm_dflash" not in err, err


def test_vllm_draft_sample_method_sets_ours(results):
    r = results["sample_method"]
    assert r["probe"]["draft_sampling"] == "probabilistic" and r["tokens"] == results["base"]["tokens"]
