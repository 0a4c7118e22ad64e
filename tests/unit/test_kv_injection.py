# SPDX-License-Identifier: Apache-2.0
"""The fused KV-injection kernels (csrc/) against the PyTorch reference (vllm_dflash/ops/kv_injection.py)."""
from __future__ import annotations

import pytest
import torch

from vllm_dflash.ops import (CPU_VEC_LAYOUT, CUDA_LAYOUT, KVInjectionWeights, inject_context_kv,
                             inject_context_kv_reference, inject_context_kv_to_cache, write_cache_reference)
from vllm_dflash.ops._ext import fused_available

SENTINEL = 1234.5

needs_ext = pytest.mark.skipif(not fused_available(torch.device("cpu")),
                               reason="vllm_dflash._C not built (scripts/setup.sh builds it)")


def rope_cache(max_pos: int, hd: int, theta: float = 10000.0) -> torch.Tensor:
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2).float() / hd))
    f = torch.arange(max_pos).float()[:, None] * inv[None]
    return torch.cat([f.cos(), f.sin()], dim=-1)  # [max_pos, hd], vLLM layout


def weights(H: int, L: int, nkv: int, hd: int, dtype: torch.dtype, max_pos: int = 64, neox: bool = True,
            device: str = "cpu", seed: int = 0) -> KVInjectionWeights:
    g = torch.Generator().manual_seed(seed)
    return KVInjectionWeights(
        hidden_norm_weight=(1 + 0.1 * torch.randn(H, generator=g)).to(dtype).to(device),
        kv_weight=(torch.randn(L * 2 * nkv * hd, H, generator=g) / H ** 0.5).to(dtype).to(device),
        k_norm_weight=(1 + 0.1 * torch.randn(L, hd, generator=g)).to(dtype).to(device),
        cos_sin_cache=rope_cache(max_pos, hd).to(dtype).to(device),
        num_layers=L, num_kv_heads=nkv, head_dim=hd, eps=1e-6, is_neox=neox)


def tol(dtype: torch.dtype) -> dict:
    # fp32: the kernel's reductions sum in another order than torch's (a few ulp); bf16: fp32 epilogue vs
    # per-op bf16 rounding in the reference (1 bf16 ulp at the values' scale)
    return dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=6e-2, rtol=1.6e-2)


def test_reference_matches_the_draft_model_path():
    """The op's reference == what DFlashDraftModel computes per layer (hidden_norm, k_norm, RoPE, v), so the
    fused kernel is held to the model's own definition."""
    from vllm_dflash.config import DFlashConfig
    from vllm_dflash.model import DFlashDraftModel

    cfg = DFlashConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, vocab_size=100, num_target_layers=4,
                       target_layer_ids=(0,), block_size=4, mask_token_id=3, max_position_embeddings=64)
    torch.manual_seed(0)
    m = DFlashDraftModel(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():  # non-trivial norm weights
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
        fc_out = torch.randn(9, 64)  # [T, H] = fc(target features), as vLLM's combine_hidden_states gives it
        pos = torch.arange(3, 12)
        want = m.context_kv(m.hidden_norm(fc_out)[None], pos[None])  # per layer (k, v) [1, T, nkv, hd]
        att = [layer.self_attn for layer in m.layers]
        w = KVInjectionWeights(
            hidden_norm_weight=m.hidden_norm.weight,
            kv_weight=torch.cat([torch.cat([a.k_proj.weight, a.v_proj.weight]) for a in att]),
            k_norm_weight=torch.stack([a.k_norm.weight for a in att]),
            cos_sin_cache=rope_cache(64, 16, cfg.rope_theta), num_layers=2, num_kv_heads=2, head_dim=16,
            eps=cfg.rms_norm_eps)
        k, v = inject_context_kv_reference(fc_out, pos, w)
    for i, (wk, wv) in enumerate(want):
        torch.testing.assert_close(k[i], wk[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v[i], wv[0], atol=1e-5, rtol=1e-5)


@needs_ext
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hd,nkv,L", [(64, 3, 1), (64, 1, 2), (128, 8, 5), (128, 2, 3)])
@pytest.mark.parametrize("T", [1, 7, 64])
def test_fused_kv_equals_reference(dtype, hd, nkv, L, T):
    H = 4 * hd
    w = weights(H, L, nkv, hd, dtype, max_pos=128)
    ctx = torch.randn(T, H).to(dtype)
    pos = torch.randint(0, 128, (T,))
    k0, v0 = inject_context_kv_reference(ctx, pos, w)
    k1, v1 = inject_context_kv(ctx, pos, w)
    torch.testing.assert_close(k1, k0, **tol(dtype))
    torch.testing.assert_close(v1, v0, **tol(dtype))


@needs_ext
@pytest.mark.parametrize("neox", [True, False])
def test_fused_interleaved_and_neox_rope(neox):
    w = weights(256, 2, 2, 64, torch.float32, neox=neox)
    ctx, pos = torch.randn(11, 256), torch.randint(0, 64, (11,))
    for a, b in zip(inject_context_kv(ctx, pos, w), inject_context_kv_reference(ctx, pos, w)):
        torch.testing.assert_close(a, b, **tol(torch.float32))


def _caches(L, nb, nkv, bs, hd, dtype):
    return [torch.full((nb, nkv, bs, 2 * hd), SENTINEL, dtype=dtype) for _ in range(L)]


@needs_ext
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hd,nkv,L,bs", [(64, 3, 1, 32), (128, 8, 5, 16), (64, 2, 3, 16)])
@pytest.mark.parametrize("T", [1, 33, 4096])
def test_fused_cache_write_equals_reference(dtype, hd, nkv, L, bs, T):
    """Every written slot equals the reference; padding slots (-1) and never-addressed slots keep the sentinel."""
    H = 2 * hd
    max_pos = 256  # positions beyond it are rejected; T=4096 reuses positions (several requests' contexts)
    w = weights(H, L, nkv, hd, dtype, max_pos=max_pos)
    nb = (T + 8) // bs + 3
    g = torch.Generator().manual_seed(T)
    ctx = torch.randn(T, H, generator=g).to(dtype)
    pos = torch.randint(0, max_pos, (T,), generator=g)
    slots = torch.randperm(nb * bs, generator=g)[:T]
    pad = torch.rand(T, generator=g) < 0.2
    slots[pad] = -1
    got = _caches(L, nb, nkv, bs, hd, dtype)
    want = _caches(L, nb, nkv, bs, hd, dtype)
    assert inject_context_kv_to_cache(ctx, pos, slots, w, got, CPU_VEC_LAYOUT) == "fused"
    k, v = inject_context_kv_reference(ctx, pos, w)
    for i in range(L):
        write_cache_reference(k[i], v[i], slots, want[i], CPU_VEC_LAYOUT)
    untouched = torch.ones(nb * bs, dtype=torch.bool)
    untouched[slots[slots >= 0]] = False
    for i in range(L):
        torch.testing.assert_close(got[i], want[i], **tol(dtype))
        # [nb, nkv, 2, bs*hd] -> per slot: check the never-written slots still hold the sentinel
        kc = got[i].view(nb, nkv, 2, bs * hd)[:, :, 0].view(nb, nkv, hd, bs).permute(0, 3, 1, 2).reshape(nb * bs, -1)
        vc = got[i].view(nb, nkv, 2, bs * hd)[:, :, 1].view(nb, nkv, bs, hd).permute(0, 2, 1, 3).reshape(nb * bs, -1)
        assert bool((kc[untouched] == SENTINEL).all()) and bool((vc[untouched] == SENTINEL).all())
        assert not bool((kc[~untouched] == SENTINEL).any()), "a slot in slot_mapping was never written"


@needs_ext
def test_shorter_slot_mapping_leaves_padded_tokens_unwritten():
    """vLLM pads K/V while slot_mapping keeps the real token count: tokens past it are not written."""
    w = weights(128, 1, 2, 64, torch.float32)
    ctx, pos = torch.randn(10, 128), torch.arange(10)
    got, want = _caches(1, 2, 2, 16, 64, torch.float32), _caches(1, 2, 2, 16, 64, torch.float32)
    inject_context_kv_to_cache(ctx, pos, torch.arange(6), w, got, CPU_VEC_LAYOUT)
    k, v = inject_context_kv_reference(ctx, pos, w)
    write_cache_reference(k[0], v[0], torch.arange(6), want[0], CPU_VEC_LAYOUT)
    torch.testing.assert_close(got[0], want[0], **tol(torch.float32))


def test_positions_beyond_the_rope_cache_are_rejected():
    w = weights(128, 1, 2, 64, torch.float32, max_pos=16)
    with pytest.raises(ValueError, match="RoPE cache.*Fix: raise"):
        inject_context_kv(torch.randn(3, 128), torch.tensor([1, 2, 16]), w)


@needs_ext
def test_bad_positions_and_slots_are_rejected_before_the_cpu_kernel(monkeypatch):
    """On CPU the entry points check positions and slots in Python (no sync there), so a bad input never rests on a
    C++ exception crossing the op boundary (a CPU build on a libstdc++ other than torch's crashed on that)."""
    def kernel_not_reached(*a, **k):
        raise AssertionError("the fused kernel was called with a bad input")

    w = weights(128, 1, 2, 64, torch.float32, max_pos=16)
    monkeypatch.setattr(torch.ops.vllm_dflash, "fused_context_kv", kernel_not_reached, raising=False)
    monkeypatch.setattr(torch.ops.vllm_dflash, "fused_context_kv_to_cache", kernel_not_reached, raising=False)
    with pytest.raises(ValueError, match="positions: max 16 is beyond the RoPE cache"):
        inject_context_kv(torch.randn(3, 128), torch.tensor([1, 2, 16]), w)
    caches = _caches(1, 2, 2, 16, 64, torch.float32)  # 2 blocks of 16 slots
    with pytest.raises(ValueError, match="slot_mapping: slot 32 beyond the cache of layer 0"):
        inject_context_kv_to_cache(torch.randn(2, 128), torch.tensor([0, 1]), torch.tensor([3, 32]), w, caches,
                                   CPU_VEC_LAYOUT)


@needs_ext
def test_positions_beyond_the_rope_cache_rejected_by_the_kernel():
    """The kernel checks positions itself (the Python check is skipped on GPU to avoid a host sync)."""
    w = weights(128, 1, 2, 64, torch.float32, max_pos=16)
    with pytest.raises(RuntimeError, match="RoPE cache"):
        torch.ops.vllm_dflash.fused_context_kv(torch.randn(2, 128), torch.tensor([3, 40]), w.hidden_norm_weight,
                                               w.kv_weight, w.k_norm_weight, w.cos_sin_cache, 2, 64, 1e-6, True)


@needs_ext
def test_non_contiguous_inputs_are_handled():
    w = weights(128, 2, 2, 64, torch.float32)
    big = torch.randn(9, 256)
    ctx = big[:, ::2]  # non-contiguous view [9, 128]
    pos = torch.arange(0, 18, 2)
    for a, b in zip(inject_context_kv(ctx, pos, w), inject_context_kv_reference(ctx.contiguous(), pos, w)):
        torch.testing.assert_close(a, b, **tol(torch.float32))


@needs_ext
def test_non_contiguous_cache_falls_back_and_stays_correct():
    """A cache whose block interior is not contiguous is not written by the kernel (fallback path instead)."""
    w = weights(128, 1, 2, 64, torch.float32)
    ctx, pos, slots = torch.randn(5, 128), torch.arange(5), torch.tensor([0, 1, 2, 3, 4])
    base = torch.full((2, 2, 16, 2 * 2 * 64), SENTINEL)
    odd = base[..., ::2]  # [2, 2, 16, 128] with stride(-1) == 2
    assert inject_context_kv_to_cache(ctx, pos, slots, w, [odd], CPU_VEC_LAYOUT) == "fused-compute"


def test_bad_shapes_name_the_field():
    w = weights(128, 1, 2, 64, torch.float32)
    with pytest.raises(ValueError, match="ctx"):
        inject_context_kv(torch.randn(3, 64), torch.arange(3), w)
    with pytest.raises(ValueError, match="positions"):
        inject_context_kv(torch.randn(3, 128), torch.arange(4), w)
    with pytest.raises(ValueError, match="caches"):
        inject_context_kv_to_cache(torch.randn(3, 128), torch.arange(3), torch.arange(3), w, [], CPU_VEC_LAYOUT)
    with pytest.raises(ValueError, match="kv_weight"):
        KVInjectionWeights(w.hidden_norm_weight, w.kv_weight[:10], w.k_norm_weight, w.cos_sin_cache, 1, 2, 64, 1e-6)


def test_reference_mode_env_forces_pytorch(monkeypatch):
    monkeypatch.setenv("VLLM_DFLASH_KV_INJECTION", "reference")
    w = weights(128, 1, 2, 64, torch.float32)
    caches = _caches(1, 2, 2, 16, 64, torch.float32)
    assert inject_context_kv_to_cache(torch.randn(3, 128), torch.arange(3), torch.arange(3), w, caches,
                                      CPU_VEC_LAYOUT) == "reference"


def test_cuda_layout_reference_writes_k_then_v():
    cache = torch.full((2, 2, 4, 2 * 8), SENTINEL)
    k, v = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    write_cache_reference(k, v, torch.tensor([5, -1, 0]), cache, CUDA_LAYOUT)
    torch.testing.assert_close(cache[1, :, 1, :8], k[0])
    torch.testing.assert_close(cache[1, :, 1, 8:], v[0])
    torch.testing.assert_close(cache[0, :, 0, 8:], v[2])
    assert int((cache != SENTINEL).sum()) == 2 * 2 * 16


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_kernel_equals_reference(dtype):
    w = weights(512, 5, 8, 128, dtype, max_pos=4096, device="cuda")
    T, bs = 4096, 16
    ctx, pos = torch.randn(T, 512, device="cuda").to(dtype), torch.randint(0, 4096, (T,), device="cuda")
    slots = torch.randperm(T + 64, device="cuda")[:T]
    slots[::7] = -1
    got = [torch.full(((T + 64) // bs, 8, bs, 256), SENTINEL, dtype=dtype, device="cuda") for _ in range(5)]
    want = [c.clone() for c in got]
    assert inject_context_kv_to_cache(ctx, pos, slots, w, got, CUDA_LAYOUT) == "fused"
    k, v = inject_context_kv_reference(ctx, pos, w)
    for i in range(5):
        write_cache_reference(k[i], v[i], slots, want[i], CUDA_LAYOUT)
        torch.testing.assert_close(got[i], want[i], **tol(dtype))


def test_more_than_8_layers_route_to_the_reference_on_cuda(monkeypatch):
    """The CUDA kernel writes at most 8 draft layers per launch (CacheView): with the fused op reported available for
    CUDA, `_prepared` gives None (the PyTorch reference path) for a 9-layer draft and the kernel's weights for 8."""
    from vllm_dflash.ops import kv_injection as kvi

    monkeypatch.setattr(kvi, "fused_available", lambda device: True)
    kvi._prepared.cache_clear()
    try:
        cuda = torch.device("cuda")
        assert kvi._prepared(weights(64, 9, 1, 16, torch.float32), torch.float32, cuda) is None
        assert kvi._prepared(weights(64, 8, 1, 16, torch.float32), torch.float32, cuda) is not None
        assert kvi._prepared(weights(64, 9, 1, 16, torch.float32), torch.float32, torch.device("cpu")) is not None
    finally:
        kvi._prepared.cache_clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nine_layer_draft_injection_equals_reference(dtype):
    """A 9-layer draft (past the CUDA kernel's 8): K/V and the cache writes of the injection == the reference."""
    w = weights(64, 9, 2, 16, dtype, max_pos=128)
    ctx, pos = torch.randn(37, 64).to(dtype), torch.randint(0, 128, (37,))
    k, v = inject_context_kv(ctx, pos, w)
    rk, rv = inject_context_kv_reference(ctx, pos, w)
    torch.testing.assert_close(k, rk, **tol(dtype))
    torch.testing.assert_close(v, rv, **tol(dtype))
    slots = torch.randperm(48)[:37]
    got = [torch.full((6, 2, 8, 32), SENTINEL, dtype=dtype) for _ in range(9)]
    want = [c.clone() for c in got]
    inject_context_kv_to_cache(ctx, pos, slots, w, got, CPU_VEC_LAYOUT)
    for i in range(9):
        write_cache_reference(rk[i], rv[i], slots, want[i], CPU_VEC_LAYOUT)
        torch.testing.assert_close(got[i], want[i], **tol(dtype))


def test_positions_slots_and_weight_devices_are_checked():
    """The wrapper's input checks (mirroring the kernels' TORCH_CHECKs, testable here with meta tensors standing in
    for another device): positions' dtype and device, slot_mapping's shape, dtype and device, one device for every
    weight, nkv > 0, the kv_weight's width; each a ValueError naming the argument."""
    w = weights(64, 2, 1, 16, torch.float32)
    ctx, pos, slots = torch.randn(5, 64), torch.arange(5), torch.arange(5)
    cache = [torch.zeros(2, 1, 8, 32) for _ in range(2)]
    with pytest.raises(ValueError, match="positions: expected int64"):
        inject_context_kv(ctx, pos.float(), w)
    with pytest.raises(ValueError, match="positions: on meta"):
        inject_context_kv(ctx, pos.to("meta"), w)
    with pytest.raises(ValueError, match="slot_mapping: on meta"):
        inject_context_kv_to_cache(ctx, pos, slots.to("meta"), w, cache, CPU_VEC_LAYOUT)
    with pytest.raises(ValueError, match="slot_mapping: expected int64"):
        inject_context_kv_to_cache(ctx, pos, slots.float(), w, cache, CPU_VEC_LAYOUT)
    with pytest.raises(ValueError, match=r"slot_mapping: expected \[<= 5\]"):
        inject_context_kv_to_cache(ctx, pos, torch.arange(6), w, cache, CPU_VEC_LAYOUT)
    with pytest.raises(ValueError, match=r"slot_mapping: expected \[<= 5\]"):
        inject_context_kv_to_cache(ctx, pos, slots[None], w, cache, CPU_VEC_LAYOUT)
    with pytest.raises(ValueError, match="k_norm_weight: on meta"):
        KVInjectionWeights(w.hidden_norm_weight, w.kv_weight, w.k_norm_weight.to("meta"), w.cos_sin_cache, 2, 1, 16,
                           1e-6)
    with pytest.raises(ValueError, match="num_kv_heads"):
        KVInjectionWeights(w.hidden_norm_weight, w.kv_weight, w.k_norm_weight, w.cos_sin_cache, 2, 0, 16, 1e-6)
    with pytest.raises(ValueError, match="kv_weight"):
        KVInjectionWeights(w.hidden_norm_weight, w.kv_weight[:, :32], w.k_norm_weight, w.cos_sin_cache, 2, 1, 16, 1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_op_checks_its_inputs():
    """The CUDA op's own checks (the op called directly, past the Python wrapper): positions on the CPU, int32 slots,
    fewer positions than rows, a cos/sin cache of the wrong width, nkv 0, 9 layers: each a RuntimeError naming the
    argument, never an illegal memory access (the device is still usable afterwards)."""
    from vllm_dflash.ops._ext import fused_available as avail

    if not avail(torch.device("cuda")):
        pytest.skip("vllm_dflash._C_cuda not built")
    op = torch.ops.vllm_dflash.fused_context_kv_to_cache
    w = weights(64, 2, 1, 16, torch.float32, device="cuda")
    ws = (w.hidden_norm_weight, w.kv_weight, w.k_norm_weight, w.cos_sin_cache)
    ctx, pos, slots = torch.randn(5, 64, device="cuda"), torch.arange(5, device="cuda"), torch.arange(5, device="cuda")
    cache = [torch.zeros(2, 1, 8, 32, device="cuda") for _ in range(2)]
    bad = {
        "positions: must be on": (ctx, pos.cpu(), slots, *ws),
        "positions: int64": (ctx, pos[:4], slots[:4], *ws),
        "slot_mapping: int64": (ctx, pos, slots.int(), *ws),
        "slot_mapping: must be on": (ctx, pos, slots.cpu(), *ws),
        "cos_sin_cache": (ctx, pos, slots, *ws[:3], w.cos_sin_cache[:, :8].contiguous()),
        "weights: must be on": (ctx, pos, slots, ws[0].cpu(), *ws[1:]),
    }
    for msg, args in bad.items():
        with pytest.raises(RuntimeError, match=msg):
            op(*args, cache, 1, 16, 1e-6, True)
    with pytest.raises(RuntimeError, match="num_kv_heads"):
        op(ctx, pos, slots, *ws, cache, 0, 16, 1e-6, True)
    w9 = weights(64, 9, 1, 16, torch.float32, device="cuda")
    with pytest.raises(RuntimeError, match="at most 8"):
        torch.ops.vllm_dflash.fused_context_kv(ctx, pos, w9.hidden_norm_weight, w9.kv_weight, w9.k_norm_weight,
                                               w9.cos_sin_cache, 1, 16, 1e-6, True)
    torch.cuda.synchronize()
    # a 9-layer draft through the checked entry point: the reference path, equal to the reference
    got = [torch.full((2, 1, 8, 32), SENTINEL, device="cuda") for _ in range(9)]
    assert inject_context_kv_to_cache(ctx, pos, slots, w9, got, CUDA_LAYOUT) == "reference"
    k, v = inject_context_kv_reference(ctx, pos, w9)
    for i in range(9):
        want = torch.full_like(got[i], SENTINEL)
        write_cache_reference(k[i], v[i], slots, want, CUDA_LAYOUT)
        torch.testing.assert_close(got[i], want, **tol(torch.float32))
