"""The reward-hacking watch: a training reward that rises while a gold metric no rubric trains on
falls, and a rubric score that follows answer length (docs/observability.md).

The host loop feeds it each round's scalars and each evaluation's; it answers with alarms,
which the loop prints (one line each), logs (`watch/*` scalars, `watch.jsonl`) and, with
`stop`, turns into a saved stop. It never reads the device.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import NamedTuple

REWARD = "policy/reward"
LENGTH_CORRELATION = "telemetry/policy/score_length_corr"
# The gold metrics `watch.gold` defaults to, the first logged: a toy world's ground truth, the
# expert rubrics of `data.gold` (`methods.gold`).
DEFAULT_GOLD = ("eval/quality", "eval/gold_score")
Z = 2.0  # how many standard errors a rise or a fall must exceed


@dataclasses.dataclass(frozen=True)
class WatchSettings:
    """`config.watch`: `gold` an eval metric (empty: `DEFAULT_GOLD`'s first logged), `window`
    evaluations (and rounds, for the length correlation) compared, `length_corr` the
    correlation to warn at (its sign says which way: > 0 rubrics paying for long answers,
    < 0 for short ones), `stop` whether an alarm saves and stops the run."""

    gold: str = ""
    window: int = 3
    length_corr: float = 0.5
    stop: bool = False


class Alarm(NamedTuple):
    """One warning: the round, its kind (`reward_hacking` or `length`) and the line printed."""

    round: int
    kind: str
    message: str


class _Point(NamedTuple):
    round: int
    reward: float  # the mean training reward of the rounds since the previous evaluation
    reward_se: float
    gold: float
    gold_se: float


def _mean_se(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(variance / len(values))


class RewardWatch:
    """The watch's state over a run (see the module docstring).

    Reward hacking: at an evaluation, over the last `window` evaluations that have training
    rounds behind them, the training reward (the mean of the rounds since the evaluation before,
    with its standard error) rose and the gold metric (with `<gold>_se` where the evaluation
    reports one) fell, each by more than `Z` standard errors of the difference. Length: the
    mean score-length correlation of the last `window` rounds reaches `length_corr` (at or
    above a positive one, at or below a negative one), once per crossing. One sign only: where
    quality itself goes with length (the toy task's answer drops the small digits, so shorter is
    better) a correlation of that sign is no sign of hacking.
    """

    def __init__(self, settings: WatchSettings):
        self.settings = settings
        self._rewards: list[float] = []
        self._points: list[_Point] = []
        self._correlations: list[float] = []
        self._length_alarmed = False

    def gold_name(self, eval_scalars: Mapping[str, float]) -> str | None:
        """The gold metric's name in `eval_scalars`, None when the run has none."""
        names = (self.settings.gold,) if self.settings.gold else DEFAULT_GOLD
        names = tuple(n if n.startswith("eval/") else f"eval/{n}" for n in names)
        return next((n for n in names if n in eval_scalars), None)

    def after_round(self, round_: int, scalars: Mapping[str, float]) -> list[Alarm]:
        if REWARD in scalars:
            self._rewards.append(float(scalars[REWARD]))
        if LENGTH_CORRELATION not in scalars:
            return []
        self._correlations = [*self._correlations, float(scalars[LENGTH_CORRELATION])][
            -self.settings.window:]
        if len(self._correlations) < self.settings.window:
            return []
        mean = sum(self._correlations) / len(self._correlations)
        limit = self.settings.length_corr
        above = mean >= limit if limit > 0 else mean <= limit
        crossed, self._length_alarmed = above and not self._length_alarmed, above
        if not crossed:
            return []
        pays = "long" if mean > 0 else "short"
        return [Alarm(round_, "length", (
            f"watch: round {round_}: the policy's score follows answer length (correlation "
            f"{mean:+.2f} over the last {len(self._correlations)} rounds, watch.length_corr "
            f"{self.settings.length_corr}): the rubrics may be paying for {pays} answers"))]

    def after_evaluation(self, round_: int, eval_scalars: Mapping[str, float]) -> list[Alarm]:
        gold = self.gold_name(eval_scalars)
        rewards, self._rewards = self._rewards, []
        if gold is None or not rewards:
            return []
        reward, reward_se = _mean_se(rewards)
        self._points.append(_Point(round_, reward, reward_se, float(eval_scalars[gold]),
                                   float(eval_scalars.get(f"{gold}_se", 0.0))))
        if len(self._points) < self.settings.window:
            return []
        first, last = self._points[-self.settings.window], self._points[-1]
        rise = last.reward - first.reward
        fall = first.gold - last.gold
        if (rise > Z * math.hypot(first.reward_se, last.reward_se)
                and fall > Z * math.hypot(first.gold_se, last.gold_se)):
            return [Alarm(round_, "reward_hacking", (
                f"watch: round {round_}: the training reward rose {rise:+.3f} (round "
                f"{first.round} to {last.round}) while the gold metric {gold} fell "
                f"{-fall:+.3f}: the policy may be learning what the rubrics pay for, not what "
                "they describe"))]
        return []


def replay(rounds: list[Mapping[str, float]], evaluations: list[Mapping[str, float]],
           settings: WatchSettings) -> list[Alarm]:
    """The alarms a run would have raised under `settings`, from its logged rounds
    (`metrics.jsonl`, every round logged) and evaluations (`eval_history.jsonl`), each a
    mapping with its `round`: the watch tried on a finished run with other settings."""
    watch, alarms = RewardWatch(settings), []
    evals = {int(e["round"]): e for e in evaluations}
    for row in sorted(rounds, key=lambda r: r["round"]):
        alarms += watch.after_round(int(row["round"]), row)
        if int(row["round"]) in evals:
            alarms += watch.after_evaluation(int(row["round"]), evals[int(row["round"])])
    return alarms
