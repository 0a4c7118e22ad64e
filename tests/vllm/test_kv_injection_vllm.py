# SPDX-License-Identifier: Apache-2.0
"""Our fused cache write lands exactly where vLLM's own CPU cache write (cpu_attn_reshape_and_cache) puts K/V,
for both CPU ISAs this layout serves ("vec", "vec16"); and vLLM's own context-K/V precompute agrees with ours."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.vllm

SCRIPT = textwrap.dedent('''
    import torch, vllm._custom_ops as ops
    from vllm_dflash.ops import CPU_VEC_LAYOUT, KVInjectionWeights, inject_context_kv_to_cache, inject_context_kv
    from vllm_dflash.ops._ext import fused_available
    assert fused_available(torch.device("cpu"))
    torch.manual_seed(0)
    for isa, bs in (("vec", 32), ("vec16", 16)):
        for dt in (torch.float32, torch.bfloat16):
            L, nkv, hd, H, T = 2, 2, 64, 128, 40
            inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
            f = torch.arange(256).float()[:, None] * inv[None]
            w = KVInjectionWeights(torch.randn(H).to(dt), (torch.randn(L * 2 * nkv * hd, H) / H ** 0.5).to(dt),
                                   torch.randn(L, hd).to(dt), torch.cat([f.cos(), f.sin()], -1).to(dt), L, nkv, hd, 1e-6)
            ctx, pos = torch.randn(T, H).to(dt), torch.randint(0, 256, (T,))
            slots = torch.randperm(4 * bs)[:T]
            slots[::5] = -1
            ours = [torch.full((4, nkv, bs, 2 * hd), 9.0, dtype=dt) for _ in range(L)]
            theirs = [c.clone() for c in ours]
            assert inject_context_kv_to_cache(ctx, pos, slots, w, ours, CPU_VEC_LAYOUT) == "fused"
            k, v = inject_context_kv(ctx, pos, w)
            for i in range(L):
                kc, vc = theirs[i].view(4, nkv, 2 * bs, hd).chunk(2, dim=2)
                ops.cpu_attn_reshape_and_cache(k[i], v[i], kc, vc, slots, isa)
                assert torch.equal(ours[i], theirs[i]), (isa, dt, i)
    print("LAYOUT-OK")
''')


def test_fused_cache_write_matches_vllm_cpu_layout():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert "LAYOUT-OK" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]
