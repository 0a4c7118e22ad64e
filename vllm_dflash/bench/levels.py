# SPDX-License-Identifier: Apache-2.0
"""How many prompts each concurrency level sends, which ones, and in how many interleaved rounds.

A run at concurrency c measures serving throughput only while c requests are in flight. With c prompts (one wave)
every request starts together and the run lasts as long as its slowest request: a request's steps saved by
speculation do not shorten the run unless they are the slowest one's, while every rejected draft still costs verify
compute. Measured on a 2-core AVX2 EPYC, chat prompts at c32 (`bench_v28_avx2` against `waves_c32_avx2`): one wave
put vLLM's n-gram drafter at 0.90x of no speculation and ours at 0.84x; three waves (96 prompts, a freed slot takes
the next prompt) 0.97x and 1.06x. So a run holds at least `waves` x c prompts, and an interleaved round (which ends
in a drain of its own) holds at least that many too.

Levels reuse the same prompts (every level starts at the set's first prompt), so a prompt set needs only as many
prompts as the largest level; the server's prefix cache is reset before each wave (bench/waves.py), so a prompt seen
at an earlier level is not served from the cache. The warm-up request uses the prompt after the largest level."""
from __future__ import annotations

DEFAULT_WAVES = 3


def parse_num_prompts(value: str | int, levels: list[int]) -> dict[int, int]:
    """--num-prompts: one number for every level, or one per level in level order ("32,72,96"). -> {c: N}."""
    parts = [p.strip() for p in str(value).split(",") if p.strip()]
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"--num-prompts {value!r}: expected a whole number or a comma list of them (one per "
                         f"concurrency level {levels}). Fix: e.g. --num-prompts 32") from None
    if len(nums) == 1:
        nums = nums * len(levels)
    if len(nums) != len(levels) or any(n < 1 for n in nums):
        raise ValueError(f"--num-prompts {value!r}: give one positive number, or one per concurrency level "
                         f"({len(levels)}: {levels}). Fix: e.g. --num-prompts 32 or --num-prompts "
                         f"{','.join('32' for _ in levels)}")
    return dict(zip(levels, nums))


def prompts_per_run(levels: list[int], num_prompts: dict[int, int], waves: int = DEFAULT_WAVES) -> dict[int, int]:
    """Prompts a run at each level sends: max(--num-prompts of the level, waves x c)."""
    if waves < 1:
        raise ValueError(f"--waves {waves}: must be at least 1 (1 = a single wave at the top level). Fix: --waves 3")
    return {c: max(num_prompts[c], waves * c) for c in levels}


def level_slices(counts: dict[int, int]) -> dict[int, slice]:
    """The prompts of each level: the set's first counts[c]. Levels share prompts (the prefix cache is reset before
    each wave); the warm-up request uses prompt max(counts), outside every slice."""
    return {c: slice(0, n) for c, n in counts.items()}


def prompts_needed(counts: dict[int, int]) -> int:
    """Prompts a set must hold: the largest level's plus the warm-up prompt."""
    return max(counts.values()) + 1


def interleave_rounds(n_prompts: int, c: int, rounds: int, waves: int = 1) -> int:
    """Rounds a run of n_prompts at concurrency c is split into: at most `rounds`, and each round keeps at least
    waves x c prompts (a round of fewer would not hold the concurrency for most of its time)."""
    return max(1, min(rounds, n_prompts // max(waves * c, 1)))


def rotation(names: list[str], turn: int) -> list[str]:
    """The order configurations run in at round `turn` of an interleaved benchmark: `names` rotated by turn, so
    each one starts in turn (a machine that drifts within a round does not always favour the same one)."""
    if not names:
        return []
    k = turn % len(names)
    return names[k:] + names[:k]


def round_chunks(items: list, c: int, rounds: int, waves: int = 1, min_rounds: int = 1) -> list[list]:
    """The prompts of each interleaved round of one level: `items` split into `interleave_rounds` rounds (round r takes
    items r, r + n, ...), or, when that gives fewer than `min_rounds` (a level too large for the prompt set to split,
    c32 on 96-102 prompts), all of `items` again in each of `min_rounds` rounds. Every configuration sends round r's
    prompts back to back, so a round pairs them (their ratio) and the rounds' spread shows the machine's drift; the
    prefix cache is reset before each wave, so a repeated prompt is computed again."""
    if min_rounds < 1:
        raise ValueError(f"--min-rounds {min_rounds}: must be at least 1. Fix: --min-rounds 2")
    n = interleave_rounds(len(items), c, rounds, waves)
    if n < min_rounds:
        return [list(items) for _ in range(min_rounds)]
    return [items[r::n] for r in range(n)]

