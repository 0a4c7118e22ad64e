# SPDX-License-Identifier: Apache-2.0
"""`TargetTail`: the frozen target's next-token distribution from the cached features, for the KL term of training
(`TrainConfig.kl_weight`).

The feature cache holds the outputs of the draft's target layers only (train/features.py), not the target's logits.
Its deepest layer's output is the input of the layers above it, so the target's final hidden state is those few
layers, the final norm and the output embedding away: for SmolLM2-135M's block-8 draft (deepest feature layer 27 of
30) about 7 % of a target forward, instead of a full forward per sequence with nothing cached. The features are
stored in bf16, so the distribution is the target's to bf16 rounding of that input."""
from __future__ import annotations

import torch


class TargetTail:
    """The layers above the deepest feature layer, the final norm, and the output embedding rows of a draft
    vocabulary. Works with Hugging Face decoder-only models that keep `model.layers`, `model.norm` and
    `model.rotary_emb` (Llama, Mistral, Qwen2/3)."""

    def __init__(self, target: torch.nn.Module, deepest_layer: int, vocab_rows: torch.Tensor):
        body = getattr(target, "model", target)
        missing = [a for a in ("layers", "norm", "rotary_emb") if not hasattr(body, a)]
        if missing:
            raise ValueError(f"kl_weight: the target ({type(target).__name__}) has no {', '.join(missing)}; the KL "
                             "term needs a Hugging Face decoder-only model. Fix: train with kl_weight 0")
        n = len(body.layers)
        if not 0 <= deepest_layer < n:
            raise ValueError(f"kl_weight: the deepest target layer {deepest_layer} is outside the target's {n} layers")
        self.body = body
        self.config = target.config
        self.layers = list(body.layers)[deepest_layer + 1:]
        self.vocab_rows = vocab_rows.to(torch.long).cpu()  # [V_draft] target ids
        self.out_all = target.get_output_embeddings().weight.detach()  # [V, H]
        self.out_rows = self.out_all[self.vocab_rows]  # [V_draft, H]: the output embedding at the draft vocabulary

    @torch.no_grad()
    def final_hidden(self, h: torch.Tensor) -> torch.Tensor:
        """h: [N, S, H] the deepest feature layer's output of right-padded sequences -> [N, S, H] the target's final
        (normed) hidden state. Causal attention: a real position never sees the padding after it."""
        from transformers.masking_utils import create_causal_mask

        pos = torch.arange(h.shape[1], device=h.device)[None].expand(h.shape[0], -1)  # [N, S]
        x = h.to(self.out_rows.dtype)
        mask = create_causal_mask(config=self.config, inputs_embeds=x, attention_mask=None, past_key_values=None,
                                  position_ids=pos)
        rope = self.body.rotary_emb(x, position_ids=pos)
        for layer in self.layers:
            x = layer(x, attention_mask=mask, position_embeddings=rope, position_ids=pos)
            x = x[0] if isinstance(x, tuple) else x
        return self.body.norm(x)

    @torch.no_grad()
    def logits(self, final: torch.Tensor) -> torch.Tensor:
        """final: [..., H] -> [..., V_draft] the target's logits over the draft vocabulary (fp32)."""
        return final.float() @ self.out_rows.to(final.device).float().T

    @torch.no_grad()
    def probs_at_draft_vocab(self, final: torch.Tensor, temperature: float) -> torch.Tensor:
        """final: [..., H] -> [..., V_draft] the target's probabilities at temperature over its WHOLE vocabulary,
        read at the draft vocabulary's tokens (they sum to at most 1: what a sampled draft can be accepted on)."""
        logits = final.float() @ self.out_all.to(final.device).float().T  # [..., V]
        logp = torch.log_softmax(logits / temperature, dim=-1)
        return logp[..., self.vocab_rows.to(final.device)].exp()


def sampled_acceptance(p: torch.Tensor, draft_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """p: [..., V_draft] the target's probabilities (`probs_at_draft_vocab`), draft_logits: [..., V_draft] -> [...]
    the probability that a draft token sampled from q = softmax(draft / T) passes rejection sampling against p:
    sum(min(p, q))."""
    q = torch.softmax(draft_logits.float() / temperature, dim=-1)
    return torch.minimum(p.float(), q).sum(-1)


def kl_to_target(target_logits: torch.Tensor, draft_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """[..., V] x2 -> [...]: KL(p || q), p = softmax(target / T), q = softmax(draft / T), both over the draft
    vocabulary (the target's distribution renormalised to the tokens the draft can propose). Under sampling at T a
    draft token sampled from q is accepted with probability sum(min(p, q)) = 1 - TV(p, q) >= 1 - sqrt(KL / 2)."""
    logp = torch.log_softmax(target_logits.float() / temperature, dim=-1)
    logq = torch.log_softmax(draft_logits.float() / temperature, dim=-1)
    return (logp.exp() * (logp - logq)).sum(-1)
