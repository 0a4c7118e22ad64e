# SPDX-License-Identifier: Apache-2.0
"""The drafting mode and the step plan of integration/drafting/ without vLLM: `drafting_mode` resolves the mode once
from the engine's frozen settings and scheduler config (fixed block, adaptive, adaptive under overlap), refuses
adaptive drafting under async scheduling without our scheduler (unless asked unchecked, as the patches read it while
the config is still being decided), and the async scheduler, the patches and the proposer's helpers name the same
scheduler; `DraftPlan` turns a controller plan into batch rows, sources, lengths and the block slots each row
verifies, for synchronous and overlap scheduling; `decode_rows` reads committed histories from a runner's batch."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_dflash import settings as S
from vllm_dflash.adaptive.controller import StepPlan
from vllm_dflash.integration.drafting.mode import ADAPTIVE_SCHEDULER, DraftingMode, drafting_mode
from vllm_dflash.integration.drafting.plan import DraftPlan, decode_rows


def engine(async_scheduling=False, scheduler_cls=None, **ours):
    return SimpleNamespace(additional_config=S.with_settings({}, S.resolve(ours)),
                           scheduler_config=SimpleNamespace(async_scheduling=async_scheduling,
                                                            scheduler_cls=scheduler_cls))


def test_mode_per_setting_and_scheduling():
    assert drafting_mode(engine(adaptive=False)) == DraftingMode(None, False)
    assert drafting_mode(engine(adaptive=False)).name == "fixed"
    fixed_async = drafting_mode(engine(True, adaptive=False))  # vLLM's async scheduler: the fixed block as is
    assert fixed_async.name == "fixed" and fixed_async.async_scheduling and not fixed_async.overlap
    sync = drafting_mode(engine(adaptive=True))
    assert sync.name == "adaptive" and sync.sources == "both" and sync.looks_up and not sync.overlap
    over = drafting_mode(engine(True, ADAPTIVE_SCHEDULER, adaptive="dflash"))
    assert over.name == "overlap" and over.overlap and not over.looks_up
    assert drafting_mode(engine(adaptive="ngram")).looks_up and drafting_mode(engine(adaptive="merged")).looks_up
    assert drafting_mode(None) == DraftingMode(S.DFlashSettings().adaptive_mode, False)  # environment / default


def test_overlap_without_our_scheduler_is_refused_unless_unchecked():
    cfg = engine(True, None, adaptive=True)
    with pytest.raises(ValueError, match="needs our scheduler.*--scheduler-cls " + ADAPTIVE_SCHEDULER):
        drafting_mode(cfg)
    assert drafting_mode(cfg, check=False).overlap  # the patches, before they set the scheduler
    assert drafting_mode(engine(True, None, adaptive=False)).name == "fixed"  # the fixed block needs no scheduler


def test_patches_read_the_same_mode():
    from vllm_dflash.integration.patches.async_scheduling import overlap_wanted, use_adaptive_scheduler

    spec = SimpleNamespace(method="dflash")
    for adaptive, scheduler in ((True, ADAPTIVE_SCHEDULER), (False, None)):
        cfg = engine(True, None, adaptive=adaptive)
        cfg.speculative_config = spec
        use_adaptive_scheduler(cfg)
        assert cfg.scheduler_config.scheduler_cls == scheduler
        assert overlap_wanted(cfg, True) is (not adaptive)  # overlap auto: on for the fixed block only


def test_draft_plan_in_batch_terms():
    look = [np.array([5, 6]), np.zeros(0, np.int64), np.array([7]), np.zeros(0, np.int64)]
    plan = StepPlan(["a", "b", "c", "d"], [0] * 4, look, ["merged", "none", "ngram", "dflash"], [4, 0, 1, 3])
    p = DraftPlan.of(plan, (0, 2, 3, 5))
    assert p.rows == (0, 2, 3, 5) and p.sources == ("merged", "none", "ngram", "dflash") and p.ks == (4, 0, 1, 3)
    assert p.spans == ((2, 4), None, None, (0, 3)) and p.needs_block
    assert p.block_spans == {0: (2, 4), 5: (0, 3)} and p.block_rows == [0, 5]
    over = DraftPlan.of(plan, (0, 2, 3, 5), k_max=7)  # full-length proposals
    assert over.spans == ((2, 7), None, None, (0, 7))
    assert p.decisions() == (("merged", "none", "ngram", "dflash"), (4, 0, 1, 3), True)
    with pytest.raises(AttributeError):
        p.ks = (0,) * 4  # frozen
    off = DraftPlan.of(StepPlan(["a"], [0], [np.zeros(0, np.int64)], ["none"], [0]), (1,))
    assert not off.needs_block and off.block_rows == []


def test_decode_rows_reads_committed_histories():
    """Two decoding requests (one with a rejected draft) and a partial prefill: histories are the committed tokens
    plus the bonus token; the prefill chunk is left out and counted."""
    K = 2
    tokens = np.zeros((3, 16), np.int64)
    tokens[0, :6] = [1, 2, 3, 4, 9, 9]  # prompt 1 2 3, output 4, this step's drafts 9 9
    tokens[1, :4] = [5, 6, 7, 8]  # prompt of 4 tokens, no drafts
    tokens[2, :10] = np.arange(10, 20)  # a prompt of 10, chunk of 3 this step
    batch = SimpleNamespace(req_ids=["a", "b", "c"], num_prompt_tokens=np.array([3, 4, 10]), token_ids_cpu=tokens)
    cad = SimpleNamespace(num_reqs=3, query_start_loc_cpu=torch.tensor([0, 3, 4, 7]))
    positions = torch.tensor([3, 4, 5, 3, 0, 1, 2])  # a: [4, 9, 9] at 3..5; b: [8] at 3; c: chunk at 0..2
    rows = decode_rows(batch, K, positions, torch.tensor([30, 31, 32]), cad, torch.tensor([1, 0, 0]))
    assert rows.req_ids == ("a", "b") and rows.rows == (0, 1) and not rows.decode_only and rows.prefill_tokens == 3
    assert rows.histories[0].tolist() == [1, 2, 3, 4, 9, 30] and rows.histories[1].tolist() == [5, 6, 7, 8, 31]


def test_decode_rows_copies_a_history_only_when_read():
    """The histories are copied out of the batch on first access (a step that plans nothing reads none): lengths
    are known without a copy, a read copies that row only, and the copy is the committed tokens plus the bonus."""
    tokens = np.arange(40, dtype=np.int64).reshape(2, 20)
    batch = SimpleNamespace(req_ids=["a", "b"], num_prompt_tokens=np.array([3, 3]), token_ids_cpu=tokens)
    cad = SimpleNamespace(num_reqs=2, query_start_loc_cpu=torch.tensor([0, 1, 2]))
    rows = decode_rows(batch, 2, torch.tensor([5, 7]), torch.tensor([90, 91]), cad, None)
    h = rows.histories
    assert len(h) == 2 and h.lengths == [7, 9] and h._built == [None, None]
    assert h[1].tolist() == list(range(20, 28)) + [91] and h._built[0] is None
    tokens[1, :] = -1  # the batch's buffer moves on: a history already read keeps its tokens
    assert h[1][0] == 20 and h[1:] == [h[1]]
