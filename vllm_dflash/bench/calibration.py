# SPDX-License-Identifier: Apache-2.0
"""Calibration of sampled output: does a server emit tokens with the probabilities its logprobs state?

At every emitted position the server returns the logprobs of its most likely tokens (OpenAI `top_logprobs`). Take a
set S of tokens fixed by that distribution alone, here "the k most likely" (k = 1, 5), and score the position with

    I = [emitted token in S],   E = P(S) = sum of the probabilities of the tokens in S.

For a lossless server E is the conditional probability of I given everything before it, so I - E has mean 0 and
variance E(1 - E) at every position, and over n positions (a martingale central limit theorem)

    z = sum(I - E) / sqrt(sum E(1 - E))  ~  N(0, 1).

A sampler that favours the likely tokens gives z > 0, one that favours unlikely tokens z < 0; a verifier that
accepts too many drafts pulls the output towards the drafts, z > 0 or < 0 as they are likely tokens or not. For a
fixed bias |z| grows with the square root of the number of positions.

Which probabilities: vLLM 0.32's default `logprobs_mode` is `raw_logprobs`, log-softmax of the target's logits
before temperature, penalties and top-k / top-p (vllm/v1/sample/sampler.py; the rejection sampler returns the same
for accepted drafts, from the target's raw logits at each position). Only at temperature 1.0 with no top-k / top-p,
penalty, bias or other logits processor do they equal the distribution tokens are sampled from: the requests of
`vllm_dflash.bench.soak.calibrate` are made so.

The set S is defined by values, not by list positions, so ties and duplicates cannot bias it: S = every token whose
logprob is at least the k-th largest listed value (in bfloat16 logits tie often; a tie at the boundary makes S hold
more than k tokens, and E counts all of them). Tokens are compared by id (request `return_tokens_as_token_ids`:
completions' top_logprobs is a dict keyed by token text, where two ids that decode alike collapse into one).
A logprob of -inf (vLLM's JSON writes -9999.0) is probability 0. A position where S cannot be read off the list
(fewer than k tokens listed, or the tie at the threshold runs to the end of the list, so unlisted tokens may share
it) is counted as undecided and left out; an emitted token of probability 0 is counted as impossible (a lossless
server never emits one) and fails the check. `tie_blind_event` scores the same sets as a statistic that ignores
ties would: a diagnostic that shows how ties read as a skew (dev/calibration.md).

Pure Python, no vLLM: tests/unit/test_calibration.py checks z on draws from known distributions and that a biased
sampler fails.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any

TOP_K = (1, 5)  # the sets scored: the most likely token, the five most likely
TOP_LOGPROBS = 20  # alternatives requested per position (OpenAI's maximum)
Z_LIMIT = 3.5  # |z| above this fails the check (two-sided p ~ 4.7e-4 per statistic under the null)
NO_LOGPROB = -9999.0  # vLLM's JSON floor for a logprob of -inf
EXACT_BELOW = 200.0  # sum E(1 - E) under which the check takes z's tail from the exact distribution (Tally.exact_z)
EXACT_MAX_STEPS = 5_000_000  # work bound of that computation (positions x misses)


@dataclass(frozen=True)
class Position:
    """One emitted position: the emitted token, its logprob (None: not reported) and the listed alternatives."""
    token: str
    logprob: float | None
    top: tuple[tuple[str, float], ...]


def _lp(x: Any) -> float:
    """A JSON logprob as a float; None and vLLM's -9999.0 floor are -inf (probability 0)."""
    if x is None:
        return -math.inf
    x = float(x)
    return -math.inf if x <= NO_LOGPROB else x


def positions_from_choice(choice: dict[str, Any]) -> list[Position]:
    """The positions of one OpenAI choice's `logprobs`: chat ({content: [{token, logprob, top_logprobs: [{token,
    logprob}]}]}) or completions ({tokens, token_logprobs, top_logprobs: [{token: logprob}]})."""
    lp = choice.get("logprobs") or {}
    if "content" in lp:
        return [Position(c["token"], None if c.get("logprob") is None else _lp(c["logprob"]),
                         tuple((t["token"], _lp(t["logprob"])) for t in c.get("top_logprobs") or []))
                for c in lp["content"] or []]
    tops = lp.get("top_logprobs") or []
    return [Position(tok, None if emitted is None else _lp(emitted), tuple((t, _lp(v)) for t, v in (top or {}).items()))
            for tok, emitted, top in zip(lp.get("tokens") or [], lp.get("token_logprobs") or [], tops, strict=False)]


def _listed(pos: Position) -> dict[str, float]:
    """Token -> logprob of the listed alternatives; a token listed twice (vLLM lists the sampled one besides the top
    ones) keeps its first value, a NaN is left out."""
    out: dict[str, float] = {}
    for tok, v in pos.top:
        if not math.isnan(v):
            out.setdefault(tok, v)
    return out


def _event(pos: Position, k: int) -> tuple[int, float, int] | None:
    """(I, E, tokens in the set) of "tokens at least as likely as the k-th most likely listed one"; None when the set
    cannot be read off the list."""
    listed = _listed(pos)
    values = sorted(listed.values(), reverse=True)
    if len(values) < k:
        return None
    t = values[k - 1]
    if t > -math.inf and values[-1] >= t:
        return None  # the tie at the threshold runs to the end of the list: unlisted tokens may share it
    emitted = listed.get(pos.token, pos.logprob)
    if emitted is None or math.isnan(emitted):
        return None
    members = [v for v in values if v >= t]
    return int(emitted >= t), min(1.0, sum(math.exp(v) for v in members)), len(members)


def tie_blind_event(pos: Position, k: int) -> tuple[int, float] | None:
    """A diagnostic, not the check: (I, E) as a statistic blind to ties scores a position, I = [emitted logprob at
    least the k-th largest listed value] but E = the probability of exactly k tokens. Where tokens tie at the k-th
    value I counts every one of them and E only k, so such a statistic reads ties as a sampler favouring the likely
    tokens (z > 0); bfloat16 logits tie often. None with fewer than k tokens listed."""
    listed = _listed(pos)
    values = sorted(listed.values(), reverse=True)
    emitted = listed.get(pos.token, pos.logprob)
    if len(values) < k or emitted is None or math.isnan(emitted):
        return None
    return int(emitted >= values[k - 1]), min(1.0, sum(math.exp(v) for v in values[:k]))


def top_k_event(pos: Position, k: int) -> tuple[int, float] | None:
    """(I, E) of the set "tokens at least as likely as the k-th most likely listed one" (ties at the threshold all
    in); None when undecidable (the module doc)."""
    ev = _event(pos, k)
    return None if ev is None else ev[:2]


@dataclass
class Tally:
    """Running sums of one statistic: positions, hits (sum I), expected (sum E), variance (sum E(1 - E)); undecided
    positions; positions whose set held more than k tokens (ties at the threshold); each position's 1 - E (`misses`,
    for `exact_z`; not serialised)."""
    positions: int = 0
    hits: int = 0
    expected: float = 0.0
    variance: float = 0.0
    undecided: int = 0
    tied: int = 0
    misses: list[float] = field(default_factory=list, repr=False)

    def add(self, i: int, e: float, tied: bool = False) -> None:
        self.positions += 1
        self.hits += i
        self.expected += e
        self.variance += e * (1.0 - e)
        self.tied += tied
        if 0.0 < e < 1.0:
            self.misses.append(1.0 - e)

    @property
    def z(self) -> float | None:
        return z_score(self.hits, self.expected, self.variance)

    def exact_z(self) -> float | None:
        """The normal score of the same one-sided tail probability under the exact distribution of the misses (a
        Poisson binomial: independent Bernoulli(1 - E)), for runs with little information. When most positions are
        near-certain (a peaked target: E close to 1) the misses are few and skewed, and z's normal tail is several
        times too thin on the side of extra misses. None when the computation would be long (sum E(1 - E) at or
        above EXACT_BELOW, or too many steps): z's tails are then those of the normal."""
        if self.variance >= EXACT_BELOW or not self.misses:
            return None
        observed = self.positions - self.hits
        excess = observed >= self.positions - self.expected  # at least the expected misses: upper tail
        cap = observed if excess else observed + 1
        if cap * len(self.misses) > EXACT_MAX_STEPS:
            return None
        dist = [1.0] + [0.0] * cap  # P(misses = j), j < cap; dist[cap]: P(misses >= cap)
        for q in self.misses:
            for j in range(cap, 0, -1):
                dist[j] = (dist[j] if j == cap else dist[j] * (1.0 - q)) + dist[j - 1] * q
            dist[0] *= 1.0 - q
        tail = dist[cap] if excess else 1.0 - dist[cap]  # P(misses >= observed) or P(misses <= observed)
        z = NormalDist().inv_cdf(min(max(tail, 1e-300), 0.5))
        return z if excess else -z

    def merge(self, other: Tally) -> None:
        for f in ("positions", "hits", "expected", "variance", "undecided", "tied"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.misses += other.misses


def z_score(hits: float, expected: float, variance: float) -> float | None:
    """(hits - expected) / sqrt(variance); None when the variance is 0 (every position certain)."""
    return (hits - expected) / math.sqrt(variance) if variance > 0 else None


@dataclass
class Calibration:
    """The tallies of TOP_K over many positions, and the emitted tokens of probability 0 (`impossible`); `blind`:
    the same sets scored blind to ties (`tie_blind_event`, a diagnostic)."""
    ks: tuple[int, ...] = TOP_K
    tallies: dict[int, Tally] = field(default_factory=dict)
    blind: dict[int, Tally] = field(default_factory=dict)
    impossible: int = 0
    tokens: int = 0

    def __post_init__(self) -> None:
        for k in self.ks:
            self.tallies.setdefault(k, Tally())
            self.blind.setdefault(k, Tally())

    def add(self, pos: Position) -> None:
        self.tokens += 1
        emitted = _listed(pos).get(pos.token, pos.logprob)
        self.impossible += emitted == -math.inf
        for k in self.ks:
            ev = _event(pos, k)
            if ev is None:
                self.tallies[k].undecided += 1
            else:
                self.tallies[k].add(ev[0], ev[1], ev[2] > k)
            bl = tie_blind_event(pos, k)
            if bl is None:
                self.blind[k].undecided += 1
            else:
                self.blind[k].add(*bl)

    def add_all(self, positions: Iterable[Position]) -> Calibration:
        for p in positions:
            self.add(p)
        return self

    def z(self, k: int) -> float | None:
        return self.tallies[k].z

    def merge(self, other: Calibration) -> Calibration:
        self.tokens += other.tokens
        self.impossible += other.impossible
        for k in self.ks:
            self.tallies[k].merge(other.tallies[k])
            self.blind[k].merge(other.blind[k])
        return self

    def to_dict(self) -> dict[str, Any]:
        """{tokens, z_top1, z_top5, impossible, z_top1_tie_blind, z_top5_tie_blind, tallies: {top1: {...}, ...}}, and
        z_top{k}_exact where the information is small (Tally.exact_z; the check then reads it); z rounded to 3
        decimals."""
        r = lambda z: None if z is None else round(z, 3)  # noqa: E731
        out: dict[str, Any] = {"tokens": self.tokens}
        for k in self.ks:
            out[f"z_top{k}"] = r(self.z(k))
            if (exact := self.tallies[k].exact_z()) is not None:
                out[f"z_top{k}_exact"] = r(exact)
        out["impossible"] = self.impossible
        for k in self.ks:
            out[f"z_top{k}_tie_blind"] = r(self.blind[k].z)
        out["tallies"] = {f"top{k}": {**{f: v for f, v in asdict(t).items() if f != "misses"},
                                      "expected": round(t.expected, 3), "variance": round(t.variance, 3)}
                          for k, t in self.tallies.items()}
        return out


def tokens_for(z: float | None, tokens: int, target: float = Z_LIMIT) -> int | None:
    """Positions at which a deviation that gave `z` over `tokens` positions reaches |z| = target (|z| grows as the
    square root of the positions for a fixed per-position bias); None when z is 0 or unknown."""
    if not z:
        return None
    return math.ceil(tokens * (target / abs(z)) ** 2)


def calibration_checks(name: str, c: dict[str, Any], min_tokens: int = 1) -> list[dict[str, Any]]:
    """The pass/fail checks of one scored run `c` (a served configuration's result: requests, completed, tokens,
    z_top{k}, impossible, or error): it ran, every request completed, |z| < Z_LIMIT for every set (z_top{k}_exact
    where the run has it: little information), no emitted token of probability 0. Check names end in `:name`."""
    def check(what: str, ok: bool, detail: str) -> dict[str, Any]:
        return {"name": f"{what}:{name}", "ok": bool(ok), "detail": detail}

    if "error" in c:
        return [check("calibration_ran", False, c["error"])]
    zs = {k: c.get(f"z_top{k}_exact", c.get(f"z_top{k}")) for k in TOP_K}
    return [check("calibration_ran", c["completed"] == c["requests"] and c["tokens"] >= min_tokens,
                  f"{c['completed']}/{c['requests']} requests completed, {c['tokens']} tokens scored"
                  + (f"; failed: {c['failed'][:2]}" if c.get("failed") else "")),
            check("calibrated", all(z is not None and abs(z) < Z_LIMIT for z in zs.values()),
                  ", ".join(f"z top-{k} n/a" if z is None else f"z top-{k} {z:+.2f}"
                            + (" (exact tail)" if f"z_top{k}_exact" in c else "") for k, z in zs.items())
                  + f" (|z| < {Z_LIMIT}) over {c['tokens']} tokens"),
            check("no_impossible_tokens", c["impossible"] == 0,
                  f"{c['impossible']} emitted tokens the server gave probability 0")]
