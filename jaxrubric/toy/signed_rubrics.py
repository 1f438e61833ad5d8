"""The GenRubric toy world's task: signed rubrics over the big-digits world of `digits_task`.

A rubric here is a list of ``(criterion, weight)`` items in the criterion language (``has D``,
``omits D``) with signed integer weights, scored as GenRubric and HealthBench score:
``sum(w * met) / sum(w for w > 0)`` (`score`).

- The **expert rubric** of a query comes from the checker: ``[+3] has D`` for each digit D the
  answer should keep (a big one), ``[-3] has D`` for each it should drop (`expert_rubric`).
- **Held-out responses**: for a seven-digit query, eight answers whose expert scores are all
  distinct, from the correct one down to the small digits alone (`held_out_responses`), like the
  paper's eight responses per query.
- **Rubric following**: the answer a rubric asks for (`follow`): a digit is kept when the items
  naming it ask for it (a positive ``has`` or a negative ``omits``), dropped when they ask
  against it, and kept or dropped by a coin where no item names it. An answerer warm-started on
  this makes a rubric that states more of the query's requirements induce a better answer, one
  that the other rubrics of the query also score well: GenRubric's comprehensiveness signal.
- **Teacher rubrics** for the generator's cold start are only partly sound: each item sound
  with probability ``informed``, else any criterion about a digit with a random sign
  (`teacher_rubric`), so there is something left for self-evolution to learn.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from jaxrubric.toy import digits_task as task

Item = tuple[str, int]  # (criterion, signed weight)
EXPERT_POINTS = 3  # every expert criterion's |points|: each digit matters as much
HELD_OUT_DIGITS = 7  # held-out queries: 7 digits give 8 distinct expert scores
WEIGHTS = (1, 2, 3, 4, 5)  # magnitudes of the teacher's weights (the grammar's signed weights)


def expert_rubric(prompt: str) -> list[Item]:
    """The checker's rubric: keep each big digit, drop each small one, in the prompt's order."""
    return [(f"has {d}", EXPERT_POINTS if d > "4" else -EXPERT_POINTS)
            for d in task.digits_of(prompt)]


def score(rubric: Sequence[Item], answer: str,
          judge: Callable[[str, str], bool] = task.check) -> float | None:
    """The GenRubric score of ``answer`` under ``rubric`` with ``judge`` deciding each item (the
    checker by default); None for a rubric without a positive weight (it has no scale)."""
    positive = sum(w for _, w in rubric if w > 0)
    if positive <= 0:
        return None
    return sum(w for c, w in rubric if judge(c, answer)) / positive


def keep_votes(rubric: Sequence[Item], digit: str) -> int:
    """The rubric's net instruction about ``digit``: the weights of the items that ask to keep
    it (``has`` with w > 0, ``omits`` with w < 0) minus those that ask to drop it."""
    votes = 0
    for criterion, weight in rubric:
        if task.in_language(criterion) and criterion.endswith(f" {digit}"):
            votes += weight if criterion.startswith("has") else -weight
    return votes


def follow(prompt: str, rubric: Sequence[Item], rng: random.Random) -> str:
    """The answer ``rubric`` asks for: the prompt's digits in order, each kept or dropped as
    the rubric's net instruction says (`keep_votes`), by a fair coin where it says nothing."""
    kept = []
    for digit in task.digits_of(prompt):
        votes = keep_votes(rubric, digit)
        if votes > 0 or (votes == 0 and rng.random() < 0.5):
            kept.append(digit)
    return "".join(kept)


def sound_item(prompt: str, rng: random.Random) -> Item:
    """An item the expert rubric agrees with: ``has`` or ``omits`` a digit of the prompt, signed
    so that meeting it is right (``[+w] has 7``, ``[-w] has 2``, ``[+w] omits 2``,
    ``[-w] omits 7``)."""
    digit = rng.choice(task.digits_of(prompt))
    op = rng.choice(("has", "omits"))
    right = (op == "has") == (digit > "4")
    return f"{op} {digit}", rng.choice(WEIGHTS) * (1 if right else -1)


def random_item(prompt: str, rng: random.Random) -> Item:
    """Any criterion about a digit (`digits_task.random_criterion`) with a random sign: half of
    them reward a mistake."""
    return task.random_criterion(prompt, rng), rng.choice(WEIGHTS) * rng.choice((1, -1))


def teacher_rubric(prompt: str, rng: random.Random, max_items: int, informed: float
                   ) -> list[Item]:
    """The generator's cold-start target: 1 to ``max_items`` items on distinct criteria, each
    sound with probability ``informed`` and random otherwise; at least one weight positive
    (as the grammar's well-formed rubrics need), so a rubric always has a scale."""
    while True:
        count = rng.randint(1, max_items)
        items: list[Item] = []
        while len(items) < count:
            item = sound_item(prompt, rng) if rng.random() < informed else random_item(prompt, rng)
            if item[0] not in (c for c, _ in items):
                items.append(item)
        if any(w > 0 for _, w in items):
            return items


def rubric_text(rubric: Sequence[Item]) -> str:
    """A rubric in the grammar's format (``[w] criterion`` lines), as the generator writes it."""
    return "".join(f"[{w}] {c}\n" for c, w in rubric)


def make_held_out_prompt(rng: random.Random) -> str:
    """A seven-digit query with two to five big digits."""
    while True:
        prompt, _ = task.make_prompt(rng)
        if len(task.digits_of(prompt)) == HELD_OUT_DIGITS:
            return prompt


def held_out_responses(prompt: str, rng: random.Random) -> list[str]:
    """One answer per possible expert score, best first: with ``b`` big digits kept and ``s``
    small ones, the expert score is ``(b - s) / #big``, so each difference ``d = b - s`` from
    ``#big`` (the correct answer) down to ``-#small`` (the small digits alone) gets one answer,
    its digits drawn at random and kept in order (for ``d = #big - #small``: the prompt copied)."""
    digits = task.digits_of(prompt)
    big = [i for i, d in enumerate(digits) if d > "4"]
    small = [i for i, d in enumerate(digits) if d <= "4"]
    answers = []
    for d in range(len(big), -len(small) - 1, -1):
        if d == len(big) - len(small):
            kept_big = len(big)
        else:  # at least one digit kept: an empty answer is no completion
            kept_big = rng.randint(max(0, d, d == 0), min(len(big), len(small) + d))
        kept = set(rng.sample(big, kept_big)) | set(rng.sample(small, kept_big - d))
        answers.append("".join(digits[i] for i in sorted(kept)))
    return answers


def expert_row(row_id: str, prompt: str, rng: random.Random) -> dict:
    """A held-out row in HealthBench's schema: the query, its expert rubric, and the held-out
    responses (the correct one as the ideal completion, the others shuffled after it)."""
    best, *others = held_out_responses(prompt, rng)
    rng.shuffle(others)
    return {"prompt_id": row_id, "prompt": [{"role": "user", "content": prompt}],
            "rubrics": [{"criterion": c, "points": w, "tags": [f"digit:{'big' if w > 0 else 'small'}"]}
                        for c, w in expert_rubric(prompt)],
            "ideal_completions_data": {"ideal_completion": best,
                                       "ideal_completions_ref_completions": others},
            "example_tags": ["toy:big_digits"]}


def expert_rows(n: int, seed: int) -> list[dict]:
    """``n`` held-out rows (`expert_row`) from ``seed``."""
    rng = random.Random(seed)
    return [expert_row(f"big-expert-{seed}-{i}", make_held_out_prompt(rng), rng)
            for i in range(n)]


def item_soundness(prompt: str, item: Item) -> bool | None:
    """Does the expert rubric agree with ``item`` (a correct answer meets it iff w > 0)? None
    for an item outside the language or about a digit not in the prompt."""
    criterion, weight = item
    if not task.in_language(criterion) or criterion[-1] not in task.digits_of(prompt):
        return None
    return task.check(criterion, task.target_of(prompt)) == (weight > 0)
