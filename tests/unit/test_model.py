# SPDX-License-Identifier: Apache-2.0
import torch

from vllm_dflash.model import DFlashDraftModel


def _bound(draft, target):
    return draft.bind_target(target.get_input_embeddings().weight.float(), target.get_output_embeddings().weight.float())


def test_article_style_constructor():
    # the shape comes from the keywords (or target_config=); no field defaults to a particular target
    m = DFlashDraftModel(hidden_size=576, num_layers=2, num_heads=9, num_kv_heads=3, intermediate_size=1536,
                         vocab_size=49152, num_target_layers=30, mask_token_id=16, block_size=8, diffusion_steps=2)
    assert m.config.num_hidden_layers == 2 and m.config.vocab_size == 49152 and m.config.diffusion_steps == 2
    assert m.fc.weight.shape == (576, 5 * 576)
    assert m.config.head_dim == 64 and m.config.target_layer_ids == (1, 8, 14, 21, 27)


def test_save_load_round_trip(tiny_dir, tiny_target, tmp_path):
    d = DFlashDraftModel.from_pretrained(tiny_dir / "draft-b8", target=tiny_target)
    d.save_pretrained(tmp_path / "copy")
    d2 = DFlashDraftModel.from_pretrained(tmp_path / "copy", target=tiny_target)
    for (k, v), (k2, v2) in zip(d.state_dict().items(), d2.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k
    names = set(__import__("safetensors.torch").torch.load_file(str(tmp_path / "copy/model.safetensors")))
    assert "fc.weight" in names and "hidden_norm.weight" in names and "layers.0.self_attn.k_norm.weight" in names
    assert not any("embed" in n or "lm_head" in n for n in names)  # shared with the target, never saved


def test_reduced_vocab_round_trip(tiny_dir, tiny_target, tmp_path):
    from vllm_dflash.config import DFlashConfig

    cfg = DFlashConfig.from_pretrained(tiny_dir / "draft-b4").with_(draft_vocab_size=64)
    d = DFlashDraftModel(cfg)
    ids = torch.randperm(384)[:64].sort().values
    d.bind_target(tiny_target.get_input_embeddings().weight.float(), tiny_target.get_output_embeddings().weight.float(), ids)
    d.save_pretrained(tmp_path / "rv")
    d2 = DFlashDraftModel.from_pretrained(tmp_path / "rv", target=tiny_target)
    assert torch.equal(d2.draft_to_target, ids)
    assert torch.allclose(d2.lm_head_weight, d.lm_head_weight.to(torch.bfloat16).float())


def _dense_draft_forward(d, ctx, ctx_pos, blk, blk_pos):
    """The draft's forward written out by hand in float64, without the model's attention code: per layer, queries
    from the block only; keys and values over the explicit concatenation [context; block] (context rows projected
    from the fused features by this layer's own k/v projections, k_norm and RoPE at the context positions; block rows
    from the layer's normed input); non-causal softmax attention over all C + Q rows; GQA by repeating K/V heads."""
    cfg = d.config
    nh, nkv, hd, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps

    def lin(x, m):
        y = x @ m.weight.detach().double().T
        return y if m.bias is None else y + m.bias.detach().double()

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.detach().double()

    def rope(x, pos):  # x [N, T, heads, hd]; rotate-half (neox) form with cos/sin over the full head_dim
        inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        ang = pos.double()[..., None] * inv_freq
        ang = torch.cat([ang, ang], -1)[:, :, None, :]
        rot = torch.cat([-x[..., hd // 2:], x[..., : hd // 2]], -1)
        return x * ang.cos() + rot * ang.sin()

    ctx, x = ctx.detach().double(), blk.detach().double()
    N, C, Q = ctx.shape[0], ctx.shape[1], x.shape[1]
    pos = torch.cat([ctx_pos, blk_pos], 1)
    for layer in d.layers:
        a = layer.self_attn
        h = norm(x, layer.input_layernorm.weight)
        seq = torch.cat([ctx, h], 1)  # [N, C + Q, H]: what the block attends over
        k = rope(norm(lin(seq, a.k_proj).view(N, C + Q, nkv, hd), a.k_norm.weight), pos)
        v = lin(seq, a.v_proj).view(N, C + Q, nkv, hd)
        q = rope(norm(lin(h, a.q_proj).view(N, Q, nh, hd), a.q_norm.weight), blk_pos)
        k, v = k.repeat_interleave(nh // nkv, dim=2), v.repeat_interleave(nh // nkv, dim=2)
        probs = (torch.einsum("nqhd,nkhd->nhqk", q, k) / hd ** 0.5).softmax(-1)  # no mask: every row sees all C + Q
        x = x + lin(torch.einsum("nhqk,nkhd->nqhd", probs, v).reshape(N, Q, nh * hd), a.o_proj)
        m, hm = layer.mlp, norm(x, layer.post_attention_layernorm.weight)
        x = x + lin(torch.nn.functional.silu(lin(hm, m.gate_proj)) * lin(hm, m.up_proj), m.down_proj)
    return norm(x, d.norm.weight)


def test_kv_injection_matches_dense_concatenation(tiny_dir, tiny_target):
    """Injected context K/V (context_kv, cached) + the block through the model == a dense computation by hand: attention
    of the block's queries over the explicit concatenation of context K/V and block K/V, every layer (2 layers, GQA
    4 q / 2 kv heads, random norm weights, two rows at different positions). The context's effect is far above the
    tolerance, so a wrong context K/V (layer, norm, positions) cannot pass."""
    from vllm_dflash.config import DFlashConfig
    from vllm_dflash.model import RMSNorm

    torch.manual_seed(0)
    cfg = DFlashConfig.from_pretrained(tiny_dir / "draft-b4").with_(num_hidden_layers=2, num_attention_heads=4,
                                                                    num_key_value_heads=2)
    d = _bound(DFlashDraftModel(cfg), tiny_target)
    d.init_weights(std=0.05)
    for m in d.modules():
        if isinstance(m, RMSNorm):
            torch.nn.init.uniform_(m.weight, 0.5, 1.5)
    C = 10
    with torch.no_grad():
        ctx = d.fuse(torch.randn(2, C, cfg.feature_size))
        ctx_pos = torch.stack([torch.arange(C), torch.arange(C) + 5])
        blk = d.embed(torch.tensor([[7, 3, 3, 3], [9, 3, 3, 3]]))
        blk_pos = ctx_pos[:, -1:] + 1 + torch.arange(4)
        out = d(blk, blk_pos, d.context_kv(ctx, ctx_pos))
    dense = _dense_draft_forward(d, ctx, ctx_pos, blk, blk_pos)
    torch.testing.assert_close(out.double(), dense, rtol=1e-4, atol=1e-4)
    no_ctx = _dense_draft_forward(d, ctx[:, :0], ctx_pos[:, :0], blk, blk_pos)
    assert (dense - no_ctx).abs().max() > 100 * 1e-4  # the context K/V really changes the output
    # non-causal block: the anchor (position 0) influences the last position
    with torch.no_grad():
        out2 = d(d.embed(torch.tensor([[8, 3, 3, 3], [9, 3, 3, 3]])), blk_pos, d.context_kv(ctx, ctx_pos))
    assert not torch.allclose(out[0, 3], out2[0, 3])
