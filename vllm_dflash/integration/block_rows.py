# SPDX-License-Identifier: Apache-2.0
"""The draft forward over the requests that use it (adaptive drafting, synchronous scheduling).

vLLM's `set_inputs_first_pass` lays out every request of the batch for the draft forward: q = 1 + K query slots each
([anchor, MASK x K]), request-major, with its attention metadata. A step's plan often verifies DFlash tokens for only
a few of its requests (the rest take a prompt-lookup proposal or none): at concurrency 8 on HumanEval (2-core AMD
EPYC, AVX2, float32) about 1.8 of 8 requests a block step, whose 8-request forward took 11.4 ms of an 82 ms step.
The block of a request depends only on its own query slots and its own context (the attention is per request; the
GEMMs of the draft layer are row-wise), so the forward may run over the selected requests alone:

    block_subset(cad, [1, 4], q)  ->  metadata of requests 1 and 4 (2 * q query slots), and their slots in the full
                                      layout ([q*1 .. q*1+q-1, q*4 .. q*4+q-1])

`subset_sample_idx` maps the sampled (MASK) positions likewise. Greedy one-pass drafting only (the drafter's hot
path): multi-pass denoising re-masks the full layout in place, and probabilistic drafts take the batch's sampling
metadata, so both keep the full forward.

Inside the forward, only the positions a request verifies need the projection onto the draft vocabulary and its
argmax (`verified_positions`): the block is drafted over all its slots (non-causal: every slot reads every other),
but a request that verifies 2 of its 7 DFlash tokens, or a merged proposal whose first slots hold prompt-lookup
tokens, reads only those. That projection is a GEMM of [positions, H] x [H, draft vocabulary]: 3.6 ms of an 8.3 ms
forward over 8 requests (56 positions) on a 2-core EPYC in float32, and a DFlash proposal at HumanEval c8 verified
1.25 of its 7 slots on average. Served there, the forward of a step fell from 9.3 to 7.0 ms (median; 2.4 to 2.0 ms a
drafting request, `ab_argmax_slots_avx2` in docs/BENCHMARKS.md).
"""
from __future__ import annotations

import dataclasses

import torch

# per-request fields of CommonAttentionMetadata this subset does not rewrite: any of them set, the full forward runs
_UNHANDLED = ("logits_indices_padded", "encoder_seq_lens", "dcp_local_seq_lens", "is_prefilling", "req_idx",
              "mm_req_doc_ranges", "rswa_prefix_lens", "positions")


def block_subset(cad, select: list[int], q: int):
    """cad: the drafter's query metadata (`set_inputs_first_pass`: num_reqs requests, q query slots each, packed);
    select: batch rows, increasing. -> (metadata of the selected requests alone, idx [len(select) * q] int64: their
    query slots in the full layout), or None where the subset cannot be built (then the full forward runs)."""
    n, B = len(select), int(cad.num_reqs)
    if n == 0 or n >= B or int(cad.num_actual_tokens) != B * q or int(cad.max_query_len) != q:
        return None
    if any(getattr(cad, f, None) is not None for f in _UNHANDLED) or isinstance(cad.causal, torch.Tensor):
        return None
    dev = cad.query_start_loc.device
    sel = torch.tensor(select, dtype=torch.long, device=dev)  # [n]
    idx = (sel[:, None] * q + torch.arange(q, device=dev)[None, :]).reshape(-1)  # [n * q]
    qsl = torch.arange(n + 1, dtype=cad.query_start_loc.dtype, device=dev) * q  # [n + 1]
    upper = cad.seq_lens_cpu_upper_bound
    sub = dataclasses.replace(
        cad, query_start_loc=qsl, query_start_loc_cpu=qsl.to("cpu"), seq_lens=cad.seq_lens[sel], num_reqs=n,
        num_actual_tokens=n * q, max_query_len=q, block_table_tensor=cad.block_table_tensor[sel],
        slot_mapping=cad.slot_mapping[idx],
        seq_lens_cpu_upper_bound=None if upper is None else upper[sel.to(upper.device)])
    return sub, idx


def subset_sample_idx(sample_idx: torch.Tensor, select: list[int], q: int, k: int) -> torch.Tensor:
    """The sampled positions of the selected requests in the subset's layout. sample_idx: [B * k] positions in the full
    layout, request-major (request r's inside r * q .. r * q + q - 1). -> [len(select) * k]."""
    sel = torch.tensor(select, dtype=torch.long, device=sample_idx.device)  # [n]
    mine = sample_idx.view(-1, k)[sel].to(torch.long)  # [n, k]
    shift = (torch.arange(len(select), device=sample_idx.device) - sel) * q  # [n]: new start - old start
    return (mine + shift[:, None]).reshape(-1).to(sample_idx.dtype)


def verified_positions(rows: list[int], spans: dict[int, tuple[int, int]], k: int,
                       device: torch.device | str = "cpu") -> torch.Tensor | None:
    """The sampled positions whose drafts the plan verifies, so the draft vocabulary's projection and argmax run
    there alone. rows: the batch rows of the forward's layout, in order (the selected ones, or every row); spans:
    batch row -> (lo, hi), the block slots lo..hi-1 that row verifies (a merged proposal verifies the block after its
    lookup tokens); a row without a span verifies none. -> [n] int64 positions in the request-major [len(rows) * k]
    sampled layout, or None where every position is verified (nothing to leave out)."""
    idx = [j * k + s for j, r in enumerate(rows) for s in range(*spans.get(r, (0, 0)))]
    if len(idx) == len(rows) * k:
        return None
    return torch.tensor(idx, dtype=torch.long, device=device)
