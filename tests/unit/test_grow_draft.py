# SPDX-License-Identifier: Apache-2.0
"""Growing a trained draft (issue 54.5's 2-layer arm): `init_from_draft(..., num_layers)` with more layers than the
source keeps the source's layers and starts each new one as the identity."""
import pytest
import torch

from support.testing import load_target
from vllm_dflash.model import DFlashDraftModel
from vllm_dflash.train.run import init_from_draft


def _block_hidden(d, tgt, seed=0):
    """The draft's final hidden states for one block over a random 12-token context: [1, B, H]."""
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(1, 12, d.config.feature_size, generator=g)
    ctx_kv = d.context_kv(d.fuse(feats), torch.arange(12)[None])
    B = d.config.block_size
    ids = torch.full((1, B), d.config.mask_token_id)
    ids[0, 0] = 5
    return d(d.embed(ids), (12 + torch.arange(B))[None], ctx_kv, None)


def test_grown_draft_drafts_as_the_source(pair):
    """A 1-layer draft grown to 3 layers: the source's layer weights are copied, the new layers' output
    projections are zero, and the final hidden states equal the source's (so drafts are identical) until training
    moves them. Growing to fewer layers than the source is refused, naming --layers."""
    tgt = load_target(pair / "target")
    src = DFlashDraftModel.from_pretrained(pair / "draft-b8", target=tgt)
    assert src.config.num_hidden_layers == 1
    grown = init_from_draft(pair / "draft-b8", tgt, None, num_layers=3)
    assert grown.config.num_hidden_layers == 3 and len(grown.layers) == 3
    for k, v in src.layers[0].state_dict().items():
        assert torch.equal(v, grown.layers[0].state_dict()[k]), k
    assert all(float(layer.mlp.down_proj.weight.abs().sum()) == 0 for layer in grown.layers[1:])
    assert float(grown.layers[1].self_attn.q_proj.weight.abs().sum()) > 0  # the rest trains from a random start
    with torch.no_grad():
        torch.testing.assert_close(_block_hidden(grown, tgt), _block_hidden(src, tgt), rtol=1e-5, atol=1e-5)
    same = init_from_draft(pair / "draft-b8", tgt, None)  # default: the source's depth
    assert same.config.num_hidden_layers == 1
    with pytest.raises(ValueError, match="--layers 0: fewer than the 1 layers"):
        init_from_draft(pair / "draft-b8", tgt, None, num_layers=0)
