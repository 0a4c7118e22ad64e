# SPDX-License-Identifier: Apache-2.0
"""The calibration statistic of sampled output (vllm_dflash/bench/calibration.py), without vLLM: z is N(0, 1) for
tokens drawn from the stated distributions (one long seeded run, and the mean and spread of z over many short
ones, with and without heavy ties), and fails for samplers that favour the argmax or avoid it, so the served check
can fail; edge cases: ties, duplicates, -inf logprobs, undecidable positions, both OpenAI logprob formats. The
served check itself: tests/e2e/test_calibration_served.py."""
import math
import random
import statistics

import pytest

from vllm_dflash.bench.calibration import (
    Z_LIMIT,
    Calibration,
    Position,
    calibration_checks,
    positions_from_choice,
    tokens_for,
    top_k_event,
    z_score,
)

V = 64  # vocabulary of the simulated positions
LISTED = 20  # alternatives listed per position, as requested from vLLM


def _logprobs(rng: random.Random, quant: float | None = None) -> list[float]:
    """A random distribution over V tokens, from flat to peaked; quant: logits rounded to that grid (many ties, as
    bfloat16 logits have)."""
    spread = rng.uniform(0.3, 4.0)
    logits = [rng.gauss(0.0, spread) for _ in range(V)]
    if quant:
        logits = [round(x / quant) * quant for x in logits]
    m = max(logits)
    lse = m + math.log(sum(math.exp(x - m) for x in logits))
    return [x - lse for x in logits]


def exact(rng: random.Random, lps: list[float]) -> int:
    u, acc = rng.random(), 0.0
    for i, lp in enumerate(lps):
        acc += math.exp(lp)
        if u < acc:
            return i
    return max(range(V), key=lambda i: lps[i])


def greedy_now_and_then(eps: float):
    """A biased sampler: with probability eps the argmax instead of a draw (a verifier that accepts too often)."""
    def sample(rng: random.Random, lps: list[float]) -> int:
        return max(range(V), key=lambda i: lps[i]) if rng.random() < eps else exact(rng, lps)
    return sample


def avoids_argmax(eps: float):
    """A biased sampler the other way: a draw that hit the argmax is drawn again with probability eps."""
    def sample(rng: random.Random, lps: list[float]) -> int:
        tok = exact(rng, lps)
        if tok == max(range(V), key=lambda i: lps[i]) and rng.random() < eps:
            tok = exact(rng, lps)
        return tok
    return sample


def position(rng: random.Random, sampler=exact, quant: float | None = None) -> Position:
    """One emitted position as vLLM's chat API lists it: the top LISTED tokens (in the chat API the sampled token
    comes first and, when outside the top ones, pushes out the last), token ids as token names."""
    lps = _logprobs(rng, quant)
    tok = sampler(rng, lps)
    order = sorted(range(V), key=lambda i: -lps[i])[:LISTED]
    if tok not in order:
        order = [tok] + order[:-1]
    return Position(f"token_id:{tok}", lps[tok], tuple((f"token_id:{i}", lps[i]) for i in order))


def run(seed: int, n: int, sampler=exact, quant: float | None = None) -> Calibration:
    rng = random.Random(seed)
    return Calibration().add_all(position(rng, sampler, quant) for _ in range(n))


def test_z_is_standard_normal_for_exact_sampling():
    """One long run stays inside the limit; over 80 short runs z has mean ~0 and spread ~1, for the top-1 and
    top-5 sets alike."""
    cal = run(0, 10_000)
    assert cal.tokens == 10_000 and cal.tallies[1].undecided == cal.tallies[5].undecided == 0
    assert abs(cal.z(1)) < Z_LIMIT and abs(cal.z(5)) < Z_LIMIT, cal.to_dict()
    runs = [run(100 + s, 200) for s in range(80)]
    for k in (1, 5):
        zs = [c.z(k) for c in runs]
        assert abs(statistics.mean(zs)) < 0.3, (k, statistics.mean(zs))
        assert 0.75 < statistics.stdev(zs) < 1.25, (k, statistics.stdev(zs))


def test_ties_keep_z_calibrated():
    """Logits on a coarse grid (ties at the top and at the 5th value, as bfloat16 gives): the sets take every tied
    token, so z stays N(0, 1); the ties are counted."""
    cal = run(1, 10_000, quant=0.5)
    assert cal.tallies[1].tied > 1000 and cal.tallies[5].tied > 1000, cal.to_dict()
    assert abs(cal.z(1)) < Z_LIMIT and abs(cal.z(5)) < Z_LIMIT, cal.to_dict()
    zs = [run(300 + s, 200, quant=0.5).z(1) for s in range(60)]
    assert abs(statistics.mean(zs)) < 0.35 and 0.7 < statistics.stdev(zs) < 1.3


@pytest.mark.parametrize("sampler,sign", [(greedy_now_and_then(0.05), 1), (avoids_argmax(0.3), -1)])
def test_biased_samplers_fail(sampler, sign):
    """5 % of tokens switched to the argmax, or 30 % of the argmax draws redrawn: |z| far past the limit at 10,000
    tokens, with the sign of the bias, so the served check can fail."""
    cal = run(2, 10_000, sampler)
    assert sign * cal.z(1) > 2 * Z_LIMIT, cal.to_dict()
    checks = calibration_checks("biased", {**cal.to_dict(), "requests": 1, "completed": 1})
    assert [c["ok"] for c in checks] == [True, False, True]


def test_tie_at_the_top_counts_both_tokens():
    p = math.log(0.3)
    pos = Position("token_id:2", p, (("token_id:1", p), ("token_id:2", p), ("token_id:3", math.log(0.2)),
                                     ("token_id:4", math.log(0.1))))
    i, e = top_k_event(pos, 1)
    assert i == 1 and e == pytest.approx(0.6)
    cal = Calibration(ks=(1,)).add_all([pos])
    assert cal.tallies[1].tied == 1
    # the token listed after the tie is not in the top-1 set, whatever its place in the list
    assert top_k_event(Position("token_id:3", math.log(0.2), pos.top), 1) == (0, pytest.approx(0.6))


def test_duplicates_and_unlisted_emitted_token():
    """The sampled token listed twice (vLLM lists it besides the top ones) counts once; an emitted token missing
    from the list is outside every set and its own logprob is used."""
    top = (("token_id:7", math.log(0.5)), ("token_id:7", math.log(0.5)), ("token_id:8", math.log(0.3)),
           ("token_id:9", math.log(0.1)))
    assert top_k_event(Position("token_id:7", math.log(0.5), top), 1) == (1, pytest.approx(0.5))
    assert top_k_event(Position("token_id:5", math.log(0.01), top), 1) == (0, pytest.approx(0.5))


def test_minus_inf_logprobs():
    """vLLM's -9999.0 (and None) is probability 0; an emitted token of probability 0 is impossible; a top-k set
    padded with zero-probability tokens is still decidable."""
    choice = {"logprobs": {"content": [{"token": "token_id:3", "logprob": -9999.0, "top_logprobs": [
        {"token": "token_id:1", "logprob": 0.0}, {"token": "token_id:2", "logprob": -9999.0},
        {"token": "token_id:3", "logprob": -9999.0}]}]}}
    (pos,) = positions_from_choice(choice)
    assert pos.logprob == -math.inf
    cal = Calibration().add_all([pos])
    assert cal.impossible == 1
    assert top_k_event(pos, 1) == (0, 1.0)
    assert top_k_event(pos, 3) == (1, 1.0)  # threshold -inf: every listed token, total mass 1
    assert cal.z(1) is None  # a certain position carries no variance


def test_undecidable_positions():
    """Fewer tokens listed than k, or a tie at the threshold running to the end of the list: left out, counted."""
    lp = math.log(0.1)
    short = Position("token_id:1", lp, (("token_id:1", lp), ("token_id:2", lp)))
    assert top_k_event(short, 5) is None
    flat = Position("token_id:1", math.log(0.4), (("token_id:1", math.log(0.4)),) + tuple(
        (f"token_id:{i}", lp) for i in range(2, 6)))
    assert top_k_event(flat, 1) == (1, pytest.approx(0.4))
    assert top_k_event(flat, 3) is None  # tokens 2-5 tie at the 3rd value and the list ends there
    assert top_k_event(short, 1) is None  # two tokens tie at the top and the list ends there
    cal = Calibration().add_all([short, flat])
    assert cal.tallies[5].undecided == 2 and (cal.tallies[1].positions, cal.tallies[1].undecided) == (1, 1)


def test_completions_format():
    choice = {"logprobs": {"tokens": ["token_id:4", "token_id:6"], "token_logprobs": [math.log(0.6), math.log(0.2)],
                           "top_logprobs": [{"token_id:4": math.log(0.6), "token_id:5": math.log(0.3)},
                                            {"token_id:5": math.log(0.7), "token_id:6": math.log(0.2),
                                             "token_id:7": math.log(0.05)}]}}
    a, b = positions_from_choice(choice)
    assert a.token == "token_id:4" and dict(a.top)["token_id:5"] == pytest.approx(math.log(0.3))
    assert top_k_event(a, 1) == (1, pytest.approx(0.6)) and top_k_event(b, 1) == (0, pytest.approx(0.7))
    assert positions_from_choice({}) == []


def test_merge_z_and_sizes():
    a, b = run(5, 500), run(6, 500)
    both = Calibration().merge(a).merge(b)
    t = both.tallies[1]
    assert both.tokens == 1000 and t.hits == a.tallies[1].hits + b.tallies[1].hits
    assert both.z(1) == pytest.approx(z_score(t.hits, t.expected, t.variance))
    assert z_score(3, 3.0, 0.0) is None
    assert tokens_for(1.75, 1000) == 4000 and tokens_for(-7.0, 1000) == 250 and tokens_for(None, 10) is None


def test_calibration_checks():
    ok = {"requests": 4, "completed": 4, "tokens": 400, "z_top1": 0.4, "z_top5": -1.2, "impossible": 0}
    assert all(c["ok"] for c in calibration_checks("ours", ok))
    assert [c["name"] for c in calibration_checks("ours", ok)] == ["calibration_ran:ours", "calibrated:ours",
                                                                    "no_impossible_tokens:ours"]
    assert not calibration_checks("ours", {**ok, "z_top5": None})[1]["ok"]
    assert not calibration_checks("ours", {**ok, "completed": 3})[0]["ok"]
    assert not calibration_checks("ours", {**ok, "impossible": 1})[2]["ok"]
    (err,) = calibration_checks("ours", {"error": "RuntimeError: no server"})
    assert not err["ok"] and "no server" in err["detail"]


def test_served_requests_and_scoring():
    """The soak's calibration requests: chat, temperature 1.0, every other knob neutral, top-20 logprobs with token
    ids; score() reads the outcomes' logprobs per prompt source."""
    from vllm_dflash.bench.soak.calibrate import calibration_requests, score

    prompts = [{"id": "a", "source": "open-chat", "messages": [{"role": "user", "content": "hi"}]},
               {"id": "b", "source": "copy", "messages": [{"role": "user", "content": "repeat: x"}]}]
    reqs = calibration_requests(prompts, 16)
    body = reqs[0].body
    assert reqs[0].endpoint == "chat" and not reqs[0].stream and reqs[0].keep_logprobs
    assert (body["temperature"], body["top_p"], body["top_k"], body["top_logprobs"]) == (1.0, 1.0, 0, 20)
    assert body["return_tokens_as_token_ids"] and body["logprobs"] and body["ignore_eos"]
    rng = random.Random(9)

    def outcome(source: str, n: int) -> dict:
        content = [{"token": p.token, "logprob": p.logprob,
                    "top_logprobs": [{"token": t, "logprob": v} for t, v in p.top]}
                   for p in (position(rng) for _ in range(n))]
        return {"status": "ok", "source": source, "logprobs": {"content": content}}

    res = score([outcome("open-chat", 30), outcome("copy", 20), {"status": "cut", "source": "copy"}])
    assert res["tokens"] == 50 and set(res["by_source"]) == {"open-chat", "copy"}
    assert res["by_source"]["copy"]["tokens"] == 20 and res["tallies"]["top1"]["positions"] == 50


def test_soak_phase_checks_and_render():
    """The soak's optional calibration phase: its checks join the soak's only when it was asked for or ran, a phase
    that was asked for and left no result fails, and the report shows it (one row; `--calibration` results as a
    table of their own)."""
    from vllm_dflash.bench.soak import report as soak_report
    from vllm_dflash.bench.soak.calibrate import render_calibration
    from vllm_dflash.bench.soak.render import _calibration_row

    def names(res: dict) -> dict[str, bool]:
        return {c["name"]: c["ok"] for c in soak_report.evaluate(res) if c["name"].startswith(("calibr", "no_imp"))}

    cal = {"requests": 8, "completed": 8, "tokens": 800, "z_top1": 0.5, "z_top5": -0.25, "impossible": 0,
           "concurrency": 8, "max_tokens": 100, "by_source": {"copy": {"z_top1": 1.0}}, "accepted_share": 0.1,
           "output_tok_s": 50.0}
    assert names({"meta": {}}) == {}
    assert names({"meta": {"calibration_requests": 8}}) == {"calibration_ran": False}
    assert names({"meta": {"calibration_requests": 8}, "calibration": cal}) == {
        "calibration_ran": True, "calibrated": True, "no_impossible_tokens": True}
    assert _calibration_row(cal) == "800, +0.50 / -0.25 (c8, T 1.0)" and _calibration_row(None) == "not run"
    table = render_calibration([{"meta": {"dtype": "float32", "cpu": "AMD EPYC", "started": "2026-12-07 10:00:00"},
                                 "configs": {"ours": cal, "stock": {"error": "RuntimeError: no server"}}}])
    assert "| ours | 800 (8 x 100, c8) | +0.50 | -0.25 | n/a / +1.00 | n/a / n/a | 10.0 % | 50.0 | ok |" in table
    assert "**FAIL**: RuntimeError: no server" in table


def test_a_tie_blind_statistic_reads_ties_as_bias():
    """The diagnostic `tie_blind_event` (I: emitted logprob at least the k-th largest; E: exactly k tokens'
    probability) on the tied draws of test_ties_keep_z_calibrated: z far above the limit, from an exact sampler.
    This is what a statistic that ignores ties reports for bfloat16 logits."""
    cal = run(1, 10_000, quant=0.5)
    d = cal.to_dict()
    assert abs(d["z_top1"]) < Z_LIMIT and d["z_top1_tie_blind"] > 2 * Z_LIMIT and d["z_top5_tie_blind"] > Z_LIMIT, d
    assert run(0, 2000).to_dict()["z_top1_tie_blind"] == run(0, 2000).to_dict()["z_top1"]  # no ties: the same


def test_exact_tail_when_information_is_small():
    """A peaked target (E near 1 almost everywhere: the tiny test pair, p_max ~0.995) leaves few misses, and their
    count is skewed: 12 misses where 4 are expected read as z = -4.0 under the normal, a probability of 3e-5, where
    the binomial gives 1.9e-3. The check then takes the exact tail (Poisson binomial; here binomial, checked against
    math.comb); with ample information it keeps z."""
    from statistics import NormalDist

    from vllm_dflash.bench.calibration import EXACT_BELOW, Tally

    n, q, misses = 400, 0.01, 12
    t = Tally()
    for j in range(n):
        t.add(int(j >= misses), 1.0 - q)
    tail = 1.0 - sum(math.comb(n, j) * q ** j * (1 - q) ** (n - j) for j in range(misses))
    assert t.z == pytest.approx(-(misses - n * q) / math.sqrt(n * q * (1 - q)))
    assert t.z < -Z_LIMIT < t.exact_z() == pytest.approx(NormalDist().inv_cdf(tail), abs=1e-6)
    few = Tally()  # no miss at all: the lower tail P(misses <= 0)
    for _ in range(n):
        few.add(1, 1.0 - q)
    assert few.exact_z() == pytest.approx(-NormalDist().inv_cdf((1 - q) ** n), abs=1e-6) and few.exact_z() > 0
    d = Calibration(ks=(1,)).merge(Calibration(ks=(1,), tallies={1: t})).to_dict()
    assert d["z_top1_exact"] == round(t.exact_z(), 3) and "misses" not in d["tallies"]["top1"]
    (_, calibrated, _) = calibration_checks("tiny", {**d, "z_top5": 0.0, "requests": 1, "completed": 1})
    assert calibrated["ok"] and "(exact tail)" in calibrated["detail"]
    big = run(0, 3000)  # sum E(1 - E) above EXACT_BELOW: no exact tail, the check reads z
    assert big.tallies[1].variance > EXACT_BELOW and "z_top1_exact" not in big.to_dict()
