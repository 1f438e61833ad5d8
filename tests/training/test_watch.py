"""The reward-hacking watch's rules on constructed histories (the loop's use of it:
`test_train_loop.py`)."""

from jaxrubric.watch import LENGTH_CORRELATION, REWARD, RewardWatch, WatchSettings


def _feed(watch, rewards_per_eval, golds, gold_se=None):
    """Rounds of training rewards, then an evaluation, for each entry; the alarms raised."""
    alarms, round_ = [], 0
    for rewards, gold in zip(rewards_per_eval, golds, strict=True):
        for reward in rewards:
            round_ += 1
            alarms += watch.after_round(round_, {REWARD: reward})
        scalars = {"eval/quality": gold}
        if gold_se is not None:
            scalars["eval/quality_se"] = gold_se
        alarms += watch.after_evaluation(round_, scalars)
    return alarms


def test_a_rise_and_a_fall_beyond_their_noise_raise_one_alarm_per_evaluation():
    rewards = [[0.50, 0.52], [0.60, 0.62], [0.70, 0.72]]
    alarms = _feed(RewardWatch(WatchSettings(window=3)), rewards, [0.8, 0.7, 0.6], gold_se=0.01)
    assert [(a.round, a.kind) for a in alarms] == [(6, "reward_hacking")]
    assert "rose +0.200" in alarms[0].message and "fell -0.200" in alarms[0].message


def test_changes_within_their_standard_errors_raise_nothing():
    # The gold metric falls by less than two standard errors of the difference.
    assert _feed(RewardWatch(WatchSettings(window=3)), [[0.5, 0.5], [0.6, 0.6], [0.7, 0.7]],
                 [0.80, 0.79, 0.78], gold_se=0.02) == []
    # The training reward moves inside its rounds' noise.
    assert _feed(RewardWatch(WatchSettings(window=3)), [[0.2, 0.8], [0.3, 0.7], [0.25, 0.85]],
                 [0.8, 0.7, 0.6], gold_se=0.001) == []
    # The gold metric rises.
    assert _feed(RewardWatch(WatchSettings(window=2)), [[0.5], [0.9]], [0.5, 0.9]) == []


def test_the_gold_metric_is_named_or_a_default_and_without_one_nothing_is_compared():
    watch = RewardWatch(WatchSettings(gold="agreement"))
    assert watch.gold_name({"eval/agreement": 1.0, "eval/quality": 0.0}) == "eval/agreement"
    assert RewardWatch(WatchSettings()).gold_name({"eval/quality": 1.0}) == "eval/quality"
    assert RewardWatch(WatchSettings()).gold_name({"eval/gold_score": 0.5}) == "eval/gold_score"
    assert _feed(RewardWatch(WatchSettings(gold="missing", window=2)), [[0.1], [0.9]],
                 [0.9, 0.1]) == []


def test_the_length_alarm_fires_once_per_crossing_of_the_windowed_correlation():
    correlations = [0.1, 0.6, 0.7, 0.8, 0.1, 0.0, 0.9, 0.9, -0.9, -0.9]
    # Windowed means: -, .35, .65, .75, .45, .05, .45, .9, 0, -.9.
    rounds = {}
    for limit in (0.5, -0.5):
        watch = RewardWatch(WatchSettings(window=2, length_corr=limit))
        rounds[limit] = [a for r, c in enumerate(correlations, 1)
                         for a in watch.after_round(r, {LENGTH_CORRELATION: c})]
    assert [a.round for a in rounds[0.5]] == [3, 8]  # up at 3, back under at 5, up at 8
    assert [a.round for a in rounds[-0.5]] == [10]  # the other sign only
    assert "long answers" in rounds[0.5][0].message
    assert "short answers" in rounds[-0.5][0].message
