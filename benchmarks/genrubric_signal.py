"""How much of GenRubric's comprehensiveness advantage says which rubric is sounder, in the toy
world with an ideal answerer (`signed_rubrics.follow`) and the checker as the judge.

Per query: G cold-start rubrics (`teacher_rubric`, each item sound with probability
`--informed`); each induces responses that follow it, tossing a coin for every digit it says
nothing about; a group's reward is the mean clipped score of its responses under the other
groups (cross-rubric comprehensiveness). The printed figure is the within-query correlation
of the centred reward (GRPO's advantage, no_std) with the rubric's sound-minus-unsound item
count: the share of the update that points at sounder rubrics. Variants: common random numbers
(one set of coins per query, `round.induce_common_noise`), several responses per group, more
groups, unclipped scores.

    python benchmarks/genrubric_signal.py [--queries 500] [--seed 0]
"""

from __future__ import annotations

import argparse
import random

import numpy as np

from jaxrubric.toy import digits_task as task
from jaxrubric.toy import signed_rubrics as sr

VARIANTS = {
    "independent coins (the round's default)": {},
    "one set of coins per query (induce_common_noise)": {"common": True},
    "two responses per group": {"responses": 2},
    "two responses per group, common coins": {"responses": 2, "common": True},
    "16 groups": {"groups": 16},
    "scores not clipped to [0, 1]": {"clip": False},
}


def net_soundness(prompt: str, rubric: list[sr.Item]) -> int:
    """Sound items minus unsound ones (items outside the language or on absent digits: 0)."""
    return sum({True: 1, False: -1, None: 0}[sr.item_soundness(prompt, item)] for item in rubric)


def correlation(queries: int, seed: int, *, groups: int = 12, responses: int = 1,
                common: bool = False, clip: bool = True, informed: float = 0.5) -> float:
    rng = random.Random(seed)
    advantages, soundness = [], []
    for _ in range(queries):
        prompt, _ = task.make_prompt(rng)
        rubrics = [sr.teacher_rubric(prompt, rng, 4, informed) for _ in range(groups)]
        coins = [rng.random() for _ in range(responses)]
        rewards = []
        for g, rubric in enumerate(rubrics):
            per_response = []
            for coin in coins:
                answer = sr.follow(prompt, rubric, random.Random(coin if common else rng.random()))
                scores = [sr.score(rubrics[h], answer) for h in range(groups) if h != g]
                scores = [min(1.0, max(0.0, s)) if clip else s for s in scores if s is not None]
                per_response.append(np.mean(scores))
            rewards.append(np.mean(per_response))
        rewards = np.asarray(rewards)
        sound = np.asarray([net_soundness(prompt, r) for r in rubrics], float)
        advantages += list(rewards - rewards.mean())
        soundness += list(sound - sound.mean())
    return float(np.corrcoef(advantages, soundness)[0, 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"| comprehensiveness with {args.queries} queries | corr(advantage, sound - unsound) |")
    print("|---|---:|")
    for name, kwargs in VARIANTS.items():
        print(f"| {name} | {correlation(args.queries, args.seed, **kwargs):.3f} |", flush=True)


if __name__ == "__main__":
    main()
