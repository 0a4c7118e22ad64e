# SPDX-License-Identifier: Apache-2.0
"""Greedy exactness checks, and why a greedy output differs when it does.

Speculative decoding is lossless: with greedy sampling the output equals the target's own greedy output. That is
exact in float32. In bfloat16 the target itself is not batch-invariant on CPU (a GEMM over 5 query tokens rounds
differently from one over 1), so the target's greedy choice can flip wherever its top two tokens are nearly tied,
with or without speculation (vLLM's own n-gram drafter diverges as often as ours). A divergence is therefore
judged by the target's logprobs at the first differing token:

  float32   any divergence fails the check, unless the two runs used different GEMM kernels (our AVX2 float32 GEMM
            against stock vLLM's oneDNN: they sum in different orders), where a divergence within
            F32_KERNELS_NATS of the target's best logprob is a near-tie;
  bfloat16  a divergence where both outputs took tokens within `near_tie_nats(dtype)` of the target's best logprob
            (usually its top two; three-way ties happen, bf16 logits move in 1/8-nat steps) is a numerical near-tie
            (reported, not a failure); anything else is a real failure.

The margin comes from the server under test: one prefill of prompt + the common prefix with `max_tokens` 1 and
the top TOP_K logprobs (the first token of a request is the target's own prediction, speculation plays no part)."""
from __future__ import annotations

import json
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any, Sequence

# bf16 keeps 8 mantissa bits: SmolLM2's logits (|z| ~ 10-30) carry rounding of ~0.05-0.1 each, and a forward over a
# different batch shape moves them by a few times that. 0.5 nats is well above what we measured for batch effects
# and well below a wrong token (the margin of a typical greedy choice is several nats).
NEAR_TIE_NATS = {"float32": 0.0, "bfloat16": 0.5, "float16": 0.25}


# float32 through two GEMM kernels that sum in different orders (ours on AVX2 against oneDNN): each logit moves by
# float32 rounding (~1e-6 relative per dot product, compounded over the layers), far below 1e-3 nats; a wrong token
# is several nats away.
F32_KERNELS_NATS = 1e-3


def near_tie_nats(dtype: str, kernels_differ: bool = False) -> float:
    """The largest logprob margin (below the target's best token) at which a divergence counts as numerical in
    `dtype` (0: none does). kernels_differ: the two runs' float32 GEMMs sum in different orders."""
    dtype = dtype.replace("torch.", "")
    if dtype == "float32" and kernels_differ:
        return F32_KERNELS_NATS
    return NEAR_TIE_NATS.get(dtype, 0.0)


# Logprobs come back as float32 differences of log-sum-exp terms: a margin that sits on the bf16 grid (k / 8 nats)
# reads a few float32 ulps off it (measured: 0.5000000596 for 4/8). The comparison allows that much, no more.
MARGIN_FP32_SLACK = 1e-4


def is_near_tie(margin: float | None, dtype: str, kernels_differ: bool = False) -> bool:
    """A divergence whose chosen tokens are `margin` nats apart at most (None: one is not among the target's top
    tokens) is numerical in `dtype`; never in float32 through one GEMM kernel."""
    tol = near_tie_nats(dtype, kernels_differ)
    slack = MARGIN_FP32_SLACK if tol >= 0.1 else 0.0  # the bf16 grid's slack; none for the float32 kernel tolerance
    return margin is not None and tol > 0 and margin <= tol + slack


def is_exact_dtype(dtype: str) -> bool:
    return near_tie_nats(dtype) == 0.0


@dataclass(frozen=True)
class Divergence:
    index: int  # first differing output token (tokenised with the target's tokenizer)
    base_token: str  # the baseline's token there ("" when one output is a prefix of the other)
    other_token: str
    margin: float | None  # the target's best logprob there minus that of the less likely of the two chosen tokens,
    # nats (None: one of them is not among the target's TOP_K tokens, or the server could not be asked)
    top2: tuple[str, ...]  # the target's most likely tokens there (up to three, best first)
    near_tie: bool  # margin <= the dtype's tolerance
    # False: the baseline's own token is not among the target's TOP_K there (or the server could not be asked). The
    # baseline is the target's greedy output, so its token is the target's best: re-encoding the two output texts did
    # not give back the generated tokens (a merge across a token boundary, e.g. " o" + "u" read back as " ou"), and
    # the position cannot be judged. Neither a near-tie nor a real difference; the check does not pass with one.
    judged: bool = True

    def describe(self) -> str:
        m = ("a token outside the target's top choices" if self.margin is None
             else f"logprob margin {self.margin:.3f} nats")
        if not self.judged:
            return (f"token {self.index}: {self.base_token!r} vs {self.other_token!r}, target's top "
                    f"{list(self.top2)!r}: NOT JUDGED (the baseline's own token is not among the target's top "
                    f"choices: the texts did not re-encode to the generated tokens)")
        kind = "numerical near-tie" if self.near_tie else "REAL DIFFERENCE"
        return (f"token {self.index}: {self.base_token!r} vs {self.other_token!r}, target's top {list(self.top2)!r}, "
                f"{m} ({kind})")


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing element (the shorter length if one is a prefix of the other); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def prompt_ids(tokenizer: Any, item: dict[str, Any]) -> list[int]:
    """The ids vLLM's OpenAI server feeds the target for a chat (`messages`) or completions (`prompt`) request."""
    if "messages" in item:
        ids = tokenizer.apply_chat_template(item["messages"], add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "input_ids") else ids)
    return list(tokenizer(item["prompt"])["input_ids"])


TOP_K = 5  # logprobs asked for: a near-tie between three tokens (bf16 logits are 1/8-nat steps) is still one


def top_tokens(url: str, ids: list[int], model: str = "target", timeout: float = 120.0,
         k: int = TOP_K) -> list[tuple[int, float]]:
    """The target's `k` most likely next token ids after `ids` with their logprobs, best first, from the server at
    `url`."""
    body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "logprobs": k,
            "return_tokens_as_token_ids": True}  # keys "token_id:N": no string round trip
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.loads(r.read())
    tops = out["choices"][0]["logprobs"]["top_logprobs"][0]
    return sorted(((int(k_.split(":", 1)[1]), v) for k_, v in tops.items()), key=lambda kv: -kv[1])


def server_ids(prompt: list[int] | None, base: list[int] | None,
               other: list[int] | None) -> tuple[list[int], list[int], list[int]] | None:
    """`explain`'s ids from what the servers returned: (prompt, base output, other output), or None (judge on the
    texts) unless all three are there."""
    return (prompt, base, other) if prompt and base is not None and other is not None else None


def explain(url: str, tokenizer: Any, item: dict[str, Any], base_text: str, other_text: str,
            dtype: str, ids: tuple[list[int], list[int], list[int]] | None = None,
            kernels_differ: bool = False) -> Divergence | None:
    """Where two greedy outputs for `item` first differ and the target's logprob margin there (None: identical).

    ids: (prompt, base output, other output) token ids as the servers produced them; the comparison and the judging
    prefill then use exactly the tokens the model saw. Without them the texts are re-encoded and the prompt is
    rebuilt from the chat template, which can differ from what the model generated (a text has several
    tokenisations) and put the judged token after a different prefix. kernels_differ: see `near_tie_nats`."""
    if ids is not None:
        prompt, a, b = (list(x) for x in ids)
    else:
        prompt = None
        a = tokenizer.encode(base_text, add_special_tokens=False)
        b = tokenizer.encode(other_text, add_special_tokens=False)
    i = first_difference(a, b)
    if i is None:
        return None
    # an output that ended there ended with the end-of-sequence token (or its length limit)
    tid = lambda ids: ids[i] if i < len(ids) else tokenizer.eos_token_id  # noqa: E731
    try:
        best = top_tokens(url, (prompt if prompt is not None else prompt_ids(tokenizer, item)) + a[:i])
    except (OSError, KeyError, IndexError, ValueError):
        best = []
    lp = dict(best)
    ta, tb = tid(a), tid(b)
    # margin: how far the less likely of the two chosen tokens is below the target's best token (nats); None when
    # one of them is not even among its TOP_K (then it is far from a tie)
    margin = best[0][1] - min(lp[ta], lp[tb]) if best and ta in lp and tb in lp else None
    near = is_near_tie(margin, dtype, kernels_differ)
    text = lambda t: "" if t is None else tokenizer.decode([t])  # noqa: E731
    return Divergence(index=i, base_token=text(ta), other_token=text(tb), margin=margin,
                      top2=tuple(text(t) for t, _ in best[:3]), near_tie=near, judged=ta in lp)


KINDS = ("near_tie", "real", "unjudged")


def kind(d: dict[str, Any]) -> str:
    """A divergence (`asdict(Divergence)`, as stored in results) as one of KINDS; records from before `judged`
    existed count as judged."""
    return "unjudged" if not d.get("judged", True) else "near_tie" if d["near_tie"] else "real"


def count_kinds(divergences: list[dict[str, Any]]) -> dict[str, int]:
    """{"near_ties": n, "real": n, "unjudged": n} over stored divergences."""
    kinds = [kind(d) for d in divergences]
    return {"near_ties": kinds.count("near_tie"), "real": kinds.count("real"), "unjudged": kinds.count("unjudged")}


def summarize(compared: int, divergences: list[Divergence], dtype: str, kernels_differ: bool = False) -> dict[str, Any]:
    """Counts for a set of greedy comparisons: identical, near-ties, real differences, and whether the check passes
    (float32: every output identical, or within F32_KERNELS_NATS where the GEMM kernels differ; bf16: every
    divergence a near-tie)."""
    rows = [asdict(d) for d in divergences]
    counts = count_kinds(rows)
    return {"dtype": dtype, "compared": compared, "identical": compared - len(divergences), **counts,
            "passed": not counts["real"] and not counts["unjudged"], "kernels_differ": kernels_differ,
            "near_tie_nats": near_tie_nats(dtype, kernels_differ),
            "max_near_tie_margin": max((d["margin"] for d in rows if kind(d) == "near_tie"), default=None),
            "divergences": rows}


def verdict_line(s: dict[str, Any]) -> str:
    """One line a newcomer reads correctly: identical, near-ties with their margins, or a real difference."""
    head = f"greedy outputs identical to no speculation: {s['identical']}/{s['compared']}"
    if s["identical"] == s["compared"]:
        return head + (" (float32: exact)" if s["dtype"] == "float32" else f" ({s['dtype']})")
    if s["passed"]:
        margins = ", ".join(f"{d['margin']:.3f}" for d in s["divergences"])
        if s.get("kernels_differ") and s["dtype"] == "float32":
            return (f"{head}; the other {s['near_ties']} differ at float32 near-ties of the target (logprob margins "
                    f"{margins} nats <= {s['near_tie_nats']}): the two runs' GEMM kernels sum in different orders "
                    "(DFLASH_CPU_GEMM_F32=off gives oneDNN's)")
        return (f"{head}; the other {s['near_ties']} differ at numerical near-ties of the target in {s['dtype']} "
                f"(logprob margins {margins} nats <= {s['near_tie_nats']}; the target alone does the same "
                "under a different batch shape; run with --dtype float32 for token-exact output)")
    return (f"{head}; {s['real']} REAL DIFFERENCE(S), {s.get('unjudged', 0)} not judged: " + "; ".join(
        Divergence(**{**d, "top2": tuple(d["top2"])}).describe() for d in s["divergences"] if kind(d) != "near_tie"))
