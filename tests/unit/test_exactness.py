# SPDX-License-Identifier: Apache-2.0
"""Greedy exactness and its explanation (vllm_dflash.exactness): where outputs differ, the first differing token and
the target's top-2 logprob margin there. float32 must be identical; bf16 may differ only at numerical near-ties.
The helpers without vLLM; the served bf16 check is tests/e2e/test_exactness_served.py."""
import pytest

from vllm_dflash import exactness as ex
from vllm_dflash.exactness import Divergence, first_difference, summarize, verdict_line


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2  # a prefix differs at the shorter length
    assert first_difference([], [4]) == 0


def test_tolerance_per_dtype():
    assert ex.near_tie_nats("float32") == 0.0 and ex.is_exact_dtype("float32")
    assert ex.near_tie_nats("bfloat16") > 0 and ex.near_tie_nats("torch.bfloat16") == ex.near_tie_nats("bfloat16")


def test_near_tie_at_the_tolerance_survives_float32_rounding():
    """bench_v7 judged a bf16 divergence at margin 0.5000000596 (4/8 nat, the tolerance, read through float32
    logprobs) as real; a margin on the tolerance is a near-tie, one bf16 step above it is not, and float32 has none."""
    assert ex.is_near_tie(0.5000000596046448, "bfloat16")
    assert ex.is_near_tie(0.5, "bfloat16") and ex.is_near_tie(0.0, "bfloat16")
    assert not ex.is_near_tie(0.625, "bfloat16") and not ex.is_near_tie(0.5002, "bfloat16")
    assert not ex.is_near_tie(None, "bfloat16")  # a chosen token outside the target's top tokens
    assert not ex.is_near_tie(0.0, "float32")


def _div(margin, near):
    return Divergence(index=7, base_token=" a", other_token=" b", margin=margin, top2=(" a", " b"), near_tie=near)


def test_summary_and_verdict():
    ok32 = summarize(4, [], "float32")
    assert ok32["passed"] and ok32["identical"] == 4 and "4/4" in verdict_line(ok32) and "exact" in verdict_line(ok32)
    near = summarize(4, [_div(0.03, True)], "bfloat16")
    line = verdict_line(near)
    assert near["passed"] and near["near_ties"] == 1 and "3/4" in line and "0.030" in line and "near-tie" in line
    real = summarize(4, [_div(0.03, True), _div(4.2, False)], "bfloat16")
    assert not real["passed"] and real["real"] == 1 and "REAL" in verdict_line(real) and "4.200" in verdict_line(real)


class _Tok:
    """A tokenizer whose encoding of "ou" is one token (4) though the target generated "o" (2) then "u" (3)."""

    eos_token_id = 0
    vocab = {1: " x", 2: "o", 3: "u", 4: "ou", 5: "t", 6: "y"}

    def encode(self, text, add_special_tokens=False):
        out, i = [], 0
        while i < len(text):
            for tid, piece in sorted(self.vocab.items(), key=lambda kv: -len(kv[1])):
                if text.startswith(piece, i):
                    out.append(tid)
                    i += len(piece)
                    break
            else:
                raise ValueError(text[i:])
        return out

    def decode(self, ids):
        return "".join(self.vocab[i] for i in ids)

    def __call__(self, text):
        return {"input_ids": self.encode(text)}


def test_a_divergence_the_text_cannot_locate_is_not_judged(monkeypatch):
    """The baseline generated "o", "u", "t" (the target's greedy choice "o" first); re-encoding its text gives "ou":
    that token is not among the target's top choices, so the position is not judged (neither a near-tie nor a real
    difference) and the check does not pass. A baseline token among them is judged as before."""
    monkeypatch.setattr(ex, "top_tokens", lambda url, ids, **k: [(2, -0.1), (6, -3.0), (1, -5.0)])
    d = ex.explain("http://x", _Tok(), {"prompt": " x"}, "out", "yy", "bfloat16")
    assert not d.judged and d.margin is None and d.base_token == "ou"
    s = summarize(2, [d], "bfloat16")
    assert not s["passed"] and s["real"] == 0 and s["unjudged"] == 1 and "NOT JUDGED" in verdict_line(s)
    d2 = ex.explain("http://x", _Tok(), {"prompt": " x"}, "ot", "yt", "bfloat16")  # "o" vs "y": judged, far apart
    assert d2.judged and d2.margin == pytest.approx(2.9) and not d2.near_tie
    assert summarize(2, [d2], "bfloat16")["real"] == 1


def test_server_token_ids_locate_and_judge_the_divergence(monkeypatch):
    """With the servers' token ids, the same texts are compared on the tokens the model produced: the baseline's "o",
    "u", "t" against "o", "y" differ at index 1 (not at 0, where the re-encoded "ou" would put it), and the judging
    prefill is the server's prompt ids plus the common prefix [2]; "u" is the target's choice there."""
    seen = []

    def top(url, ids, **k):
        seen.append(list(ids))
        return [(3, -0.2), (6, -0.4), (1, -5.0)]

    monkeypatch.setattr(ex, "top_tokens", top)
    d = ex.explain("http://x", _Tok(), {"prompt": "ignored: the server's prompt ids are used"}, "out", "oy",
                   "bfloat16", ids=([9, 1], [2, 3, 5], [2, 6]))
    assert seen == [[9, 1, 2]]
    assert d.index == 1 and d.base_token == "u" and d.other_token == "y" and d.judged
    assert d.margin == pytest.approx(0.2) and d.near_tie
    assert ex.explain("http://x", _Tok(), {}, "ou", "ou", "bfloat16", ids=([9], [4], [4])) is None
    # identical texts, different tokens ("ou" as one token vs "o", "u"): a divergence, judged at its first token
    d2 = ex.explain("http://x", _Tok(), {}, "ou", "ou", "bfloat16", ids=([9], [4], [2, 3]))
    assert d2.index == 0 and d2.base_token == "ou" and d2.other_token == "o" and not d2.judged


def test_server_ids_only_when_the_servers_returned_all_three():
    """The bench and the demo judge on ids only with a prompt and both outputs (an empty output is still an output)."""
    assert ex.server_ids([9, 1], [2, 3], []) == ([9, 1], [2, 3], [])
    assert ex.server_ids(None, [2], [2]) is None and ex.server_ids([], [2], [2]) is None
    assert ex.server_ids([9], None, [2]) is None and ex.server_ids([9], [2], None) is None


def test_default_dtype_on_both_cpu_kinds(monkeypatch):
    """The fast dtype per CPU kind (bf16 with avx512_bf16, else fp32), whichever kind runs the test."""
    import torch

    from vllm_dflash import utils

    monkeypatch.delenv("VLLM_DFLASH_DTYPE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(utils, "cpu_has_bf16", lambda: True)
    assert utils.default_dtype() == "bfloat16"
    monkeypatch.setattr(utils, "cpu_has_bf16", lambda: False)
    assert utils.default_dtype() == "float32"
    monkeypatch.setenv("VLLM_DFLASH_DTYPE", "float32")
    monkeypatch.setattr(utils, "cpu_has_bf16", lambda: True)
    assert utils.default_dtype() == "float32"


def test_float32_through_different_gemm_kernels():
    """issue 52.4: float32 DFlash on our AVX2 GEMM against stock vLLM's oneDNN sums in other orders; a divergence is
    a near-tie only within F32_KERNELS_NATS (1e-3 nats), never beyond it, and never with one kernel."""
    assert ex.near_tie_nats("float32", kernels_differ=True) == ex.F32_KERNELS_NATS == 1e-3
    assert ex.is_near_tie(4e-4, "float32", kernels_differ=True)
    assert not ex.is_near_tie(4e-4, "float32") and not ex.is_near_tie(0.002, "float32", kernels_differ=True)
    assert ex.near_tie_nats("bfloat16", kernels_differ=True) == ex.near_tie_nats("bfloat16")  # bf16 unchanged
    s = summarize(4, [_div(4e-4, True)], "float32", kernels_differ=True)
    assert s["passed"] and s["near_ties"] == 1 and s["near_tie_nats"] == 1e-3
    assert "GEMM kernels sum in different orders" in verdict_line(s)
    assert not summarize(4, [_div(4e-4, False)], "float32")["passed"]
