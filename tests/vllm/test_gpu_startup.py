# SPDX-License-Identifier: Apache-2.0
"""The engine config vLLM builds on a GPU, built here on CPU with the platform reported as CUDA and Triton present:
our DFlash drafter's default configuration must end with a scheduler it can run and with the V1 model runner (the
one whose DFlashProposer we replace). patches/engine_config.py; issue 51 items 1 and 2."""
import logging

import pytest

pytestmark = pytest.mark.vllm

TARGET = "tests/assets/tiny-pair/target"
DRAFT = "tests/assets/tiny-pair/draft-b8"


def _fake_cuda():
    """The CPU platform (so the config still builds on this machine) reporting CUDA, whose config hook, like CUDA's,
    leaves vLLM's async-scheduling and executor decisions as they are (the CPU hook forces them)."""
    from vllm.platforms.cpu import CpuPlatform

    class FakeCuda(CpuPlatform):
        def is_cuda(self) -> bool:
            return True

        @classmethod
        def check_and_update_config(cls, vllm_config) -> None:
            decided = vllm_config.scheduler_config.async_scheduling
            backend = vllm_config.parallel_config.distributed_executor_backend
            super().check_and_update_config(vllm_config)
            vllm_config.scheduler_config.async_scheduling = decided
            vllm_config.parallel_config.distributed_executor_backend = backend

    return FakeCuda()


@pytest.fixture
def cuda_config(monkeypatch):
    """Build `EngineArgs(...).create_engine_config()` as on a CUDA machine with Triton installed."""
    import vllm.config.vllm as config_mod
    import vllm.platforms
    from vllm.engine.arg_utils import EngineArgs
    from vllm.plugins import load_general_plugins

    from vllm_dflash.integration.patches import activate

    load_general_plugins()
    assert activate() == []  # the seam check imports vLLM's modules now, with the real (CPU) platform
    monkeypatch.setattr(vllm.platforms, "current_platform", _fake_cuda(), raising=False)
    monkeypatch.setattr(config_mod, "HAS_TRITON", True)
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    for k in ("DFLASH_OVERLAP", "DFLASH_ADAPTIVE", "DFLASH_DRAFTER"):
        monkeypatch.delenv(k, raising=False)

    def build(spec: dict | None, **kwargs):
        from vllm.platforms import current_platform

        assert current_platform.is_cuda()
        return EngineArgs(model=TARGET, dtype="float32", max_model_len=256, speculative_config=spec,
                          **kwargs).create_engine_config()

    return build


def test_default_dflash_config_starts_on_cuda(cuda_config, caplog):
    """The default config (adaptive drafting, overlap auto): vLLM would turn async scheduling on and leave no
    scheduler class, which our drafter refuses; it ends synchronous, says so in one log line, and the drafter's
    scheduling check passes. The V1 runner is chosen although Triton is present, with vLLM's reason naming us."""
    from vllm_dflash.integration.patches.engine_config import V2_UNSUPPORTED
    from vllm_dflash.integration.proposer import adaptive_overlap

    with caplog.at_level(logging.INFO):
        cfg = cuda_config({"method": "dflash", "model": DRAFT})
    assert cfg.scheduler_config.async_scheduling is False
    assert adaptive_overlap(cfg) is False  # DFlashDrafter.__init__'s check: no raise
    assert "async scheduling OFF for our DFlash drafter" in caplog.text
    assert cfg.use_v2_model_runner is False
    assert V2_UNSUPPORTED in cfg._get_v2_model_runner_unsupported_features()


def test_overlap_true_gets_our_scheduler_on_cuda(cuda_config):
    """`overlap: true` keeps vLLM's async scheduling and installs our AsyncScheduler subclass (as on CPU)."""
    from vllm_dflash.integration.async_scheduler import QUALNAME
    from vllm_dflash.integration.proposer import adaptive_overlap

    cfg = cuda_config({"method": "dflash", "model": DRAFT, "overlap": True})
    assert cfg.scheduler_config.async_scheduling is True
    assert cfg.scheduler_config.scheduler_cls == QUALNAME
    assert adaptive_overlap(cfg) is True


def test_fixed_block_keeps_vllm_async_scheduling_on_cuda(cuda_config):
    """The fixed block (adaptive false) keeps vLLM's async scheduler; `overlap: false` turns it off."""
    on = cuda_config({"method": "dflash", "model": DRAFT, "adaptive": False})
    assert on.scheduler_config.async_scheduling is True and on.scheduler_config.scheduler_cls is None
    off = cuda_config({"method": "dflash", "model": DRAFT, "adaptive": False, "overlap": False})
    assert off.scheduler_config.async_scheduling is False


def test_forced_model_runner_v2_is_refused(cuda_config, monkeypatch):
    """VLLM_USE_V2_MODEL_RUNNER=1 with our drafter: a clear start-up error naming the variable and the fixes, not
    an engine that silently serves without our drafter. vLLM's own drafter (drafter: vllm) may use V2."""
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(ValueError, match="VLLM_USE_V2_MODEL_RUNNER") as e:
        cuda_config({"method": "dflash", "model": DRAFT})
    assert "drafter to 'vllm'" in str(e.value)


def test_other_methods_untouched_on_cuda(cuda_config):
    """No speculation and n-gram: vLLM's own choices (Model Runner V2 with Triton, async scheduling) stand."""
    plain = cuda_config(None)
    assert plain.use_v2_model_runner is True and plain.scheduler_config.async_scheduling is True
    ngram = cuda_config({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})
    assert ngram.scheduler_config.scheduler_cls is None
