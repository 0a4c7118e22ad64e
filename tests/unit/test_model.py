# SPDX-License-Identifier: Apache-2.0
import torch

from vllm_dflash.model import DFlashDraftModel, rope_cos_sin


def _bound(draft, target):
    return draft.bind_target(target.get_input_embeddings().weight.float(), target.get_output_embeddings().weight.float())


def test_article_style_constructor():
    m = DFlashDraftModel(hidden_size=576, num_layers=2, block_size=8, diffusion_steps=2)
    assert m.config.num_hidden_layers == 2 and m.config.vocab_size == 49152 and m.config.diffusion_steps == 2
    assert m.fc.weight.shape == (576, 5 * 576)


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


def test_kv_injection_matches_dense_concatenation(tiny_dir, tiny_target):
    """Cached context K/V + block == one attention over [context; block] with the same projections."""
    d = _bound(DFlashDraftModel.from_pretrained(tiny_dir / "draft-b4"), tiny_target)
    torch.manual_seed(0)
    ctx = d.fuse(torch.randn(1, 10, d.config.feature_size))
    ctx_pos = torch.arange(10)[None]
    blk = d.embed(torch.tensor([[7, 3, 3, 3]]))
    blk_pos = torch.arange(10, 14)[None]
    out_cached = d(blk, blk_pos, d.context_kv(ctx, ctx_pos))
    # dense: per layer, K/V of ctx and of block computed in one call over the concatenation
    attn = d.layers[0].self_attn
    cos, sin = rope_cos_sin(torch.cat([ctx_pos, blk_pos], 1), 64, d.config.rope_theta, ctx.dtype)
    k, v = attn.project_kv(torch.cat([ctx, d.layers[0].input_layernorm(blk)], 1), cos, sin)
    k_ctx, v_ctx = d.context_kv(ctx, ctx_pos)[0]
    assert torch.allclose(k[:, :10], k_ctx, atol=1e-6) and torch.allclose(v[:, :10], v_ctx, atol=1e-6)
    # block queries must not depend on block order (non-causal) except through positions: permuting
    # the masks changes nothing since all three are MASK; the anchor influences every position
    out2 = d(d.embed(torch.tensor([[8, 3, 3, 3]])), blk_pos, d.context_kv(ctx, ctx_pos))
    assert not torch.allclose(out_cached[:, 3], out2[:, 3])  # last position sees the anchor
