"""The toy world's pieces: tokenizer, task, quality, checker, generated data."""

from __future__ import annotations

import json
import random

import jax.numpy as jnp
import numpy as np
import pytest

import jaxrubric
from jaxrubric.rubric import grammar as grammar_lib
from jaxrubric.rubric import templates as tpl
from jaxrubric.rubric.verifier import verifier_readout
from jaxrubric.toy import config_tree, tokens, world_runs, world_warm_starts
from jaxrubric.toy import digits_task as task
from jaxrubric.toy.verifier_sft import verifier_examples
from jaxrubric.toy.workdir import prepare_workdir
from jaxrubric.toy.world_config import GENERATOR_REFERENCES, RUNS, ToyWorldConfig


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return jaxrubric.load_tokenizer(task.build_tokenizer(tmp_path_factory.mktemp("toy_tok")))


def test_tokenizer_spells_digits_one_token_each_and_has_yes_no(tokenizer):
    ids = tokenizer.encode("big 318729", add_special_tokens=False)
    assert tokenizer.decode(ids) == "big 318729"
    assert len(tokenizer.encode("31415", add_special_tokens=False)) == 5
    readout = verifier_readout(tokenizer, tpl.verifier_template(tokenizer, style="compact"))
    assert readout.yes_ids == tuple(tokenizer.encode("yes", add_special_tokens=False))
    assert readout.no_ids == tuple(tokenizer.encode("no", add_special_tokens=False))


def test_prompts_targets_and_warm_start_answers():
    rng = random.Random(0)
    for _ in range(200):
        prompt, target = task.make_prompt(rng)
        digits = task.digits_of(prompt)
        assert len(set(digits)) == len(digits) and target == task.target_of(prompt)
        assert 2 <= len(target) <= 5 and all(d > "4" for d in target)
        assert task.flawed_answer(prompt, rng, 0) == target
        assert task.quality(task.flawed_answer(prompt, rng, 1), prompt) < 1
    prompts = [task.make_prompt(rng)[0] for _ in range(2000)]
    correct = [task.policy_warm_start_answer(p, rng, 0.3) == task.target_of(p) for p in prompts]
    assert 0.25 < np.mean(correct) < 0.35  # the middling warm start: 30% right


def test_quality_partial_credit_and_jax_version_agree(tokenizer):
    prompt = "big 381729"  # big 8 7 9, small 3 1 2
    assert task.quality("879", prompt) == 1.0
    assert task.quality("79", prompt) == pytest.approx(2 / 3)  # a big digit dropped
    assert task.quality("8179", prompt) == pytest.approx(2 / 3)  # a small digit kept
    assert task.quality("81", prompt) == pytest.approx(1 / 3 * 2 / 3)
    assert task.quality("897", prompt) == 0.5  # out of order
    assert task.quality("8799", prompt) == 0.5  # a digit twice
    assert task.quality("", prompt) == 0.0 and task.quality("381729", prompt) == 0.0
    rng = random.Random(0)
    prompts = [task.make_prompt(rng)[0] for _ in range(6)]
    answers = [[task.noisy_answer(p, rng) for _ in range(4)]
               + [task.digits_of(p)[::-1][:4], task.target_of(p) + "a"] for p in prompts]
    ids = [[tokenizer.encode(a, add_special_tokens=False) for a in row] for row in answers]
    width = max(len(i) for row in ids for i in row) + 1
    responses = np.full((6, 6, width), tokenizer.pad_token_id)
    lengths = np.zeros((6, 6), np.int32)
    for b, row in enumerate(ids):
        for k, i in enumerate(row):
            responses[b, k, :len(i)], lengths[b, k] = i, len(i)
    prompt_ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    prompt = np.full((6, 12), tokenizer.pad_token_id)
    for b, i in enumerate(prompt_ids):
        prompt[b, :len(i)] = i
    prompt_len = np.array([len(i) for i in prompt_ids])
    got = task.token_quality(jnp.asarray(responses), jnp.asarray(lengths),
                             jnp.asarray(prompt)[:, None], jnp.asarray(prompt_len)[:, None])
    want = [[task.quality(a, p) for a in row] for p, row in zip(prompts, answers)]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    assert len({round(q, 3) for row in want for q in row}) > 5  # the check covers many values


@pytest.mark.parametrize("criterion, answer, met", [
    ("has 8", "879", True), ("has 3", "879", False), ("omits 3", "879", True),
    ("omits 9", "879", False), ("has 87", "879", False), ("has  8", "879", False),
    ("no 3", "879", False), ("omits 3", "", True), ("has x", "879", False),
])
def test_checker(criterion, answer, met):
    assert task.check(criterion, answer) is met


def test_anchor_lists_cover_each_mistake_and_rank_ties_equal():
    ties = 0
    for row in task.anchor_rows(200, seed=3, num_anchors=4):
        prompt, answers = row["prompt"], [a["answer"] for a in row["answers"]]
        big = [d for d in task.digits_of(prompt) if d > "4"]
        small = [d for d in task.digits_of(prompt) if d <= "4"]
        assert answers[0] == task.target_of(prompt) and len(set(answers)) == 4
        # One answer drops exactly one big digit, another keeps exactly one small digit.
        assert any(sum(d not in a for d in big) == 1 and not any(d in a for d in small)
                   for a in answers)
        assert any(sum(d in a for d in small) == 1 and all(d in a for d in big)
                   for a in answers)
        qualities = [task.quality(a, prompt) for a in answers]
        ranks = [a["rank"] for a in row["answers"]]
        assert all(a >= b for a, b in zip(qualities, qualities[1:]))
        for i in range(4):
            for j in range(4):
                assert (ranks[i] < ranks[j]) == (qualities[i] > qualities[j])
        ties += len(set(ranks)) < 4
    assert ties > 0  # equal quality happens (one big of two dropped vs one small of two kept)


def test_distinct_anchor_lists_rank_the_correct_answer_first_by_strictly_falling_quality():
    for row in task.anchor_rows(50, seed=3, num_anchors=3, kind="distinct"):
        answers = [a["answer"] for a in row["answers"]]
        assert answers[0] == task.target_of(row["prompt"])
        qualities = [task.quality(a, row["prompt"]) for a in answers]
        assert all(a > b for a, b in zip(qualities, qualities[1:]))
        assert [a["rank"] for a in row["answers"]] == [1, 2, 3]


def test_every_digit_anchor_lists_hold_every_single_mistake_ranked_by_quality():
    """Each digit flipped once (a big one dropped, a small one kept) beside the correct
    answer, so every sound item (`has <big>`, `omits <small>`) orders the correct answer above
    the answer it catches, and its opposite-sign item the other way round."""
    for row in task.anchor_rows(100, seed=5, num_anchors=8, kind="every_digit"):
        prompt, answers = row["prompt"], [a["answer"] for a in row["answers"]]
        digits = task.digits_of(prompt)
        assert answers[0] == task.target_of(prompt)
        assert sorted(answers[1:]) == sorted(task.flipped_answer(prompt, {i})
                                             for i in range(len(digits)))
        qualities = [task.quality(a, prompt) for a in answers]
        ranks = [a["rank"] for a in row["answers"]]
        for i in range(len(answers)):
            for j in range(len(answers)):
                assert (ranks[i] < ranks[j]) == (qualities[i] > qualities[j])
        for d in digits:
            sound = f"has {d}" if d > "4" else f"omits {d}"
            caught = [a for a in answers[1:] if not task.check(sound, a)]
            assert len(caught) == 1 and task.check(sound, answers[0])
    with pytest.raises(ValueError, match="num_anchors 7: every_digit anchor lists"):
        task.anchor_answers("big 3817290", random.Random(0), 7, "every_digit")


def test_anchor_lists_need_room_for_both_mistakes():
    with pytest.raises(ValueError, match="num_anchors 2"):
        task.anchor_answers("big 381729", random.Random(0), 2)
    with pytest.raises(ValueError, match="kind 'random' is not one of"):
        task.anchor_answers("big 381729", random.Random(0), 3, "random")


def test_teacher_rubrics_follow_the_grammar(tokenizer):
    cfg = ToyWorldConfig()
    grammar = grammar_lib.build_rubric_grammar(tokenizer, weights=range(1, 6),
                                               max_items=cfg.max_items,
                                               max_item_tokens=cfg.max_item_tokens)
    prompts, targets = world_warm_starts.generator_examples(tokenizer, random.Random(0), 64, cfg)
    width = grammar.max_rubric_tokens
    tokens = np.full((len(targets), width), tokenizer.pad_token_id, np.int32)
    for i, t in enumerate(targets):
        assert len(t) <= width
        tokens[i, :len(t)] = t
    parsed = grammar_lib.parse_rubric_tokens(jnp.asarray(tokens), grammar, tokenizer.pad_token_id)
    assert np.asarray(parsed.complete).all()
    for i, t in enumerate(targets):
        lines = tokenizer.decode(t[:-1]).splitlines()
        assert int(np.asarray(parsed.valid[i]).sum()) == len(lines)
        for m, line in enumerate(lines):
            item = np.asarray(parsed.items[i, m, :int(parsed.item_lengths[i, m])])
            assert "[" + str(int(parsed.weights[i, m])) + "] " + tokenizer.decode(item) == line


def test_contested_symbols_are_those_some_but_not_all_answers_hold():
    assert task.contested_symbols("big 381729", ["879", "8179", "38179"]) == ["3", "1"]
    assert task.contested_symbols("big 381729", ["879", "879"]) == []
    assert task.contested_symbols("big 381729", []) == []
    # Stray letters come after the digits; a letter every answer holds tells none apart.
    assert task.contested_symbols("big 381729", ["8x79", "879", "87k9", "8k79"]) == ["k", "x"]
    assert task.contested_symbols("big 381729", ["8x79", "x879"]) == []
    assert task.sound_item("x") == "omits x" and task.sound_item("9") == "has 9"


def test_stray_letters_are_written_where_asked_and_halve_quality():
    """`policy_warm_start_answer`'s ``stray`` share: one stray letter, which `quality` halves
    (the answer is not the prompt's digits in order) and an ``omits`` item sees."""
    rng = random.Random(0)
    prompt = "big 381729"
    answers = [task.policy_warm_start_answer(prompt, rng, 1.0, stray=0.25) for _ in range(2000)]
    stray = [a for a in answers if a != "879"]
    assert 0.22 < len(stray) / len(answers) < 0.28
    for answer in stray:
        letters = [c for c in answer if c in task.STRAY_LETTERS]
        assert len(letters) == 1 and answer.replace(letters[0], "") == "879", answer
        assert task.quality(answer, prompt) == 0.5
        assert not task.check(f"omits {letters[0]}", answer)
        assert task.check(f"has {letters[0]}", answer)
    # Without a stray share the rng stream is the one before stray letters existed.
    a, b = random.Random(3), random.Random(3)
    assert ([task.policy_warm_start_answer(prompt, a, 0.3, "keeps_small") for _ in range(50)]
            == [task.policy_warm_start_answer(prompt, b, 0.3, "keeps_small", 0.0)
                for _ in range(50)])


def test_no_stray_letter_is_written_by_a_template_or_an_item_word(tokenizer):
    """A stray letter in a role's prompt is always an answer's: the generator copies it from
    there, and a letter the template also writes ("a:") it could not tell apart."""
    question, answers = "big 381729", ["879"] * 4
    texts = [tokenizer.decode(tokens.template_ids(template, tokenizer, *slots)) for template, slots
             in ((tpl.dynamic_rubric_generator_template(tokenizer, 4, max_items=4,
                                                         style="compact"), (question, *answers)),
                 (tpl.dynamic_rubric_generator_template(tokenizer, 0, max_items=4,
                                                         style="compact"), (question,)),
                 (tpl.verifier_template(tokenizer, style="compact"), (question, "879", "has 8")))]
    texts += [tokenizer.decode(tokens.policy_prompt(tokenizer, question)), "has omits yes no"]
    for text in texts:
        written = set(text.replace("<|im_start|>", " ").replace("<|im_end|>", " "))
        assert not written & set(task.STRAY_LETTERS), (text, written & set(task.STRAY_LETTERS))


def test_a_focused_teacher_writes_its_first_items_about_the_contested_symbols():
    rng = random.Random(0)
    signs = []
    for _ in range(300):
        focus = ["3", "8"]
        items = [line.split("] ")[1] for line in task.teacher_rubric(
            "big 381729", rng, max_items=4, informed=0.5, focus=focus).splitlines()]
        assert {item.split(" ")[1] for item in items[:2]} == set(focus)
        signs += [item for item in items[:2]]
    # Sound ("omits 3", "has 8") three times in four: half informed, half a coin flip.
    share = sum(item in ("omits 3", "has 8") for item in signs) / len(signs)
    assert 0.68 < share < 0.82
    # With focus_informed=1 every item about a contested digit has the sound sign.
    for _ in range(50):
        items = [line.split("] ")[1] for line in task.teacher_rubric(
            "big 381729", rng, max_items=4, informed=0.5, focus=["3", "8"],
            focus_informed=1.0).splitlines()]
        assert set(items[:2]) == {"omits 3", "has 8"}


def _slot_texts(tokenizer, template, ids):
    """The texts `tokens.template_ids` spliced into ``template``'s slots, read back from ids."""
    texts, at = [], len(template.segments[0])
    for segment in template.segments[1:]:
        segment = list(segment)
        end = next(i for i in range(at, len(ids) - len(segment) + 1)
                   if ids[i:i + len(segment)] == segment)
        texts.append(tokenizer.decode(ids[at:end]))
        at = end + len(segment)
    return texts


def test_the_answer_seeing_cold_start_looks_at_the_digits_its_answers_differ_on(tokenizer):
    cfg = ToyWorldConfig()
    template = tpl.dynamic_rubric_generator_template(tokenizer, cfg.round.num_responses,
                                                     max_items=cfg.max_items, style="compact")
    prompts, targets = world_warm_starts.generator_examples(tokenizer, random.Random(0), 64, cfg)
    focused = 0
    for ids, target in zip(prompts, targets):
        question, *shown = _slot_texts(tokenizer, template, ids)
        assert question.startswith(task.INSTRUCTION) and len(shown) == cfg.round.num_responses
        contested = task.contested_symbols(question, shown)
        first = tokenizer.decode(target[:-1]).splitlines()[0].split("] ")[-1]
        digit = first.split(" ")[-1]
        # The defaults' teacher gives every contested digit its sound sign.
        focused += (digit in contested and first == task.sound_item(digit)) if contested else 1
    assert focused == len(prompts)


def test_verifier_examples_are_balanced_and_labelled_by_the_checker(tokenizer):
    prompts, targets = verifier_examples(tokenizer, random.Random(0), 200, stray=0.25)
    yes = tokenizer.encode("yes", add_special_tokens=False)
    assert sum(t == yes for t in targets) == 100
    template = tpl.verifier_template(tokenizer, style="compact")
    letter_verdicts = []
    for ids, target in zip(prompts, targets):
        text = tokenizer.decode(ids, skip_special_tokens=True)
        question, answer, criterion = (
            text.split("q: ")[1].split("\n")[0], text.split("a: ")[1].split("\n")[0],
            text.split("c:")[1].split("\n")[0].strip())
        assert task.check(criterion, answer) == (target == yes)
        assert ids[:len(template.segments[0])] == list(template.segments[0])
        assert question.startswith(task.INSTRUCTION)
        if criterion[-1] in task.STRAY_LETTERS:
            letter_verdicts.append((criterion.split(" ")[0], target == yes))
    # Items about stray letters, each word with each verdict: "has x" is sometimes true.
    assert set(letter_verdicts) == {("has", True), ("has", False), ("omits", True),
                                    ("omits", False)}


@pytest.mark.parametrize("field, value, message", [
    ("runs", ("coevolve", "stale"), "unknown toy runs \\['stale'\\]"),
    ("policy_mistakes", "keep_small", "ToyWorldConfig.policy_mistakes 'keep_small'"),
    ("teacher_sound", "has", "ToyWorldConfig.teacher_sound 'has'"),
    ("teacher_focus", "answers", "ToyWorldConfig.teacher_focus 'answers'"),
    ("anchors", "random", "ToyWorldConfig.anchors 'random'"),
    ("final_samples", 0, "ToyWorldConfig.final_samples must be >= 1"),
    ("round.policy.advantage_mode", "std", "policy.advantage_mode 'std' is not one of"),
    ("round.num_responses", 1, "num_responses must be >= 2"),
    ("round.induced_responses", 2, "DynamicRubricConfig has no setting 'induced_responses'"),
])
def test_toy_config_names_a_bad_choice(field, value, message):
    """The world's own settings are checked by its config, the round's by the round config it
    holds (a GenRubric key in the DynamicRubric world's round has nowhere to go)."""
    with pytest.raises(ValueError, match=message):
        config_tree.replace(ToyWorldConfig(), {field: value})


def test_unknown_mistake_and_item_kinds_are_errors():
    with pytest.raises(ValueError, match="mistakes 'keep_small'"):
        task.policy_warm_start_answer("big 381729", random.Random(0), 0.3, "keep_small")
    with pytest.raises(ValueError, match="kinds 'has'"):
        task.sound_criterion("big 381729", random.Random(0), "has")


def test_malformed_items_are_outside_the_language_and_never_met():
    """What the verifier learns to answer "no" to (`ToyWorldConfig.verifier_malformed`): items
    outside the criterion language, which the checker never meets."""
    rng = random.Random(0)
    assert task.in_language("has 7") and task.in_language("omits 0")
    assert task.in_language("omits x") and task.in_language("has d")  # stray letters
    assert not any(task.in_language(c) for c in ("has", "has 7 8", "hs 7", "] ] ] ]", "omits e",
                                                  "has y", "omits ]"))
    for _ in range(500):
        prompt = task.anchor_rows(1, rng.randrange(10**6), 3)[0]["prompt"]
        item = task.malformed_criterion(prompt, rng)
        assert not task.in_language(item) and "\n" not in item, item
        assert not task.check(item, prompt)


def test_only_the_compared_runs_evaluate_on_the_held_out_set(tmp_path):
    """The generators' own rounds skip held-out evaluation (the compared runs evaluate their
    result at round 0), so the stage compiles and runs no evaluation program; each compared run
    evaluates every `eval_every` rounds."""
    cfg = ToyWorldConfig()
    paths = world_runs.write_data(tmp_path, cfg)
    for name in ("generator", "generator_static"):
        c = world_runs.run_config(name, tmp_path, paths, cfg,
                                  tmp_path / "models" / "generator_cold")
        assert (c.data.eval, c.eval_every, c.rounds) == ("", 0, cfg.generator_rounds)
        assert c.round.policy.freeze
    for name in RUNS:
        c = world_runs.run_config(name, tmp_path, paths, cfg, tmp_path / "models" / "generator")
        assert (c.data.eval, c.eval_every) == (str(paths["eval"]), cfg.eval_every)


def test_the_runs_of_one_generator_kind_differ_only_in_runtime_switches(tmp_path):
    """The generators' own rounds and the compared runs set which roles train and what rewards
    the policy as runtime switches, and agree on every other round option: those with
    answer-seeing rubrics compile one round program, the static ones another (the compilation
    cache then serves it to each later run), and the 256 held-out prompts are evaluated in
    pieces of a round's 8."""
    cfg = ToyWorldConfig()
    paths = world_runs.write_data(tmp_path, cfg)
    for names in (("generator", "coevolve", "frozen", "oracle"), ("generator_static", "static")):
        rounds = []
        for name in names:
            c = world_runs.run_config(name, tmp_path, paths, cfg, tmp_path / "models" / "generator")
            assert c.round.runtime_switches and c.round.eval_micro_batches == 32
            r = c.round.to_dict()  # less the switches: the roles' freeze and the policy reward
            del r["policy"]["freeze"], r["generator"]["freeze"], r["policy_reward"]
            rounds.append(r)
        assert all(r == rounds[0] for r in rounds), names


def test_every_compared_run_trains_its_policy_alike(tmp_path):
    """The policy KL and advantage mode are the world's, in every compared run alike (a
    baseline trained otherwise would not be comparable); the generators' advantages keep the
    shared mode."""
    cfg = config_tree.replace(ToyWorldConfig(), {"round.policy.beta": 0.07,
                                                 "round.policy.advantage_mode": "batch_std"})
    paths = world_runs.write_data(tmp_path, cfg)
    for name in RUNS:
        c = world_runs.run_config(name, tmp_path, paths, cfg, tmp_path / "models" / "generator")
        assert c.round.policy.beta == 0.07 and not c.round.policy.freeze
        assert (c.round.policy.advantage_mode, c.round.generator.advantage_mode) == (
            "batch_std", "group_std")


def test_a_cold_start_reference_reaches_the_trained_compared_generators_only(tmp_path):
    """`generator_reference="cold_start"`: the co-evolving and static generators' KL reads
    their own cold start (not the generator they start from); the generators' own rounds
    start from it anyway, and the frozen and ground-truth runs train no generator."""
    paths = world_runs.write_data(tmp_path, ToyWorldConfig())
    models = tmp_path / "models"
    want = {"coevolve": str(models / "generator_cold"),
            "static": str(models / "generator_cold_static"), "frozen": "", "oracle": "",
            "generator": "", "generator_static": ""}
    for choice in GENERATOR_REFERENCES:
        cfg = ToyWorldConfig(generator_reference=choice)
        for name, reference in want.items():
            c = world_runs.run_config(name, tmp_path, paths, cfg, models / "generator")
            assert c.generator.reference == (reference if choice == "cold_start" else ""), name
    with pytest.raises(ValueError, match="generator_reference 'sft' is not one of"):
        ToyWorldConfig(generator_reference="sft")


def test_item_signal_reads_which_sound_item_tells_the_answers_apart():
    """`diagnostics.item_signal_of` by hand: prompt `big 3817` (big 8 and 7, small 3 and 1);
    of four answers two drop the 7 and none keeps a small digit, so `has 7` splits them 2-2
    (variance 0.25) and `has 8` and both `omits` items split nothing."""
    from jaxrubric.toy import diagnostics

    row = {"prompt": "big 3817", "answers": [{"answer": "87", "rank": 1},
                                             {"answer": "387", "rank": 2},
                                             {"answer": "8", "rank": 3}]}
    got = diagnostics.item_signal_of(row, ["87", "8", "87", "8"])
    assert got["has_big_disc"] == pytest.approx(0.125)  # (0.25 + 0) / 2 digits
    assert got["has_big_contested"] and not got["omits_small_contested"]
    assert got["omits_small_disc"] == 0.0
    # `has 7` orders 87 and 387 above 8 (the list's order), `has 8` ties all three: the mean
    # of the two one-item rubrics' anchor rewards, against the functions' own values.
    from jaxrubric.rewards.dynamic_rubric import anchor_ranking
    ranks = np.array([1, 2, 3])
    want = np.mean([float(anchor_ranking(np.array(s, float), ranks=ranks))
                    for s in ([1, 1, 0], [1, 1, 1])])
    assert got["has_big_anchor"] == pytest.approx(want)
    assert got["has_big_anchor"] > got["omits_small_anchor"]  # `omits 3` puts 387 last


def test_aim_counts_items_about_what_the_shown_answers_differ_on():
    """`diagnostics.aim_of` by hand: prompt `big 3817` and answers that differ only on the 7
    (contested: 1 of 4 digits, chance 0.25). Of five items one leaves the language; of the
    four left, `has 7` and `omits 7` name the contested digit (one of them soundly), `has 8`
    and `omits 3` do not."""
    from jaxrubric.toy import diagnostics

    rubrics = [[(3.0, "has 7"), (1.0, "has 8")], [(2.0, "omits 7"), (1.0, "omits 3"),
                                                  (5.0, "] ]")]]
    got = diagnostics.aim_of([("big 3817", ["87", "8", "87", "8"], rubrics)])
    assert got == pytest.approx({"in_language": 0.8, "contested": 0.5, "chance": 0.25,
                                 "sound_contested": 0.5, "names_the_letter": 0.0})
    assert diagnostics.aim_of([]) == {"in_language": 0.0, "contested": 0.0, "chance": 0.0,
                                      "sound_contested": 0.0, "names_the_letter": 0.0}
    # Rubrics for answers holding a stray letter: does one of them name it?
    lettered = [("big 3817", ["8x7", "87"], [[(1.0, "omits x")], [(1.0, "omits d")],
                                              [(1.0, "has 7")], [(1.0, "has x"), (1.0, "]")]])]
    assert diagnostics.aim_of(lettered)["names_the_letter"] == 0.5


def test_mistakes_of_names_each_kind_of_mistake():
    """`diagnostics.mistakes_of` by hand on `big 3817` (big 8 and 7; correct answer 87): the
    order mistake is the one `task.quality` halves and no `has`/`omits` item sees."""
    from jaxrubric.toy import diagnostics

    def kinds(answer):
        return {k for k, v in diagnostics.mistakes_of(answer, "big 3817").items() if v}

    assert kinds("87") == set()
    assert kinds("8") == {"drops_a_big_digit"}
    assert kinds("387") == {"keeps_a_small_digit"}
    assert kinds("78") == kinds("877") == kinds("879") == {"out_of_order"}
    assert kinds("73") == {"drops_a_big_digit", "keeps_a_small_digit", "out_of_order"}
    assert kinds("8x7") == {"writes_a_letter"}
    assert kinds("x78") == {"writes_a_letter", "out_of_order"}


def test_gaps_by_mistake_split_the_delta_gap_by_what_tells_each_pair_apart():
    """`diagnostics.gaps_by_mistake` by hand on `big 3817` (correct answer 87). Answers: 87
    (quality 1), 8 (drops 7: 0.5), 8x7 (a letter: 0.5), 78 (out of order: 0.5). Rubric A
    `[1] has 7, [1] omits x` scores them 1, 0.5, 0.5, 1; rubric B `[2] has 8` 1, 1, 1, 1; the
    policy score is their mean: 1, 0.75, 0.75, 1. Pairs the quality orders: 87 above each of
    the others, gaps 0.25, 0.25 and 0 (the order no item sees)."""
    from jaxrubric.toy import diagnostics

    rubrics = [[(1.0, "has 7"), (1.0, "omits x")], [(2.0, "has 8")], []]
    got = diagnostics.gaps_by_mistake([("big 3817", ["87", "8", "8x7", "78"], rubrics)])
    assert got["pairs"] == 3 and got["delta_gap"] == pytest.approx(0.5 / 3)
    for kind, gap in (("drops_a_big_digit", 0.25), ("writes_a_letter", 0.25),
                      ("out_of_order", 0.0)):
        assert got[f"{kind}_share"] == pytest.approx(1 / 3) and got[f"{kind}_gap"] == gap
    assert got["several_share"] == got["same_kinds_share"] == 0.0
    assert diagnostics.pair_mistake("873", "8", "big 3817") == "several"
    assert diagnostics.pair_mistake("873", "8733", "big 3817") == "same_kinds"
    # What the order mistake costs, and the part of quality the language can judge.
    assert task.quality("78", "big 3817") == 0.5 and task.visible_quality("78", "big 3817") == 1
    assert task.visible_quality("387", "big 3817") == task.quality("387", "big 3817") == 0.5


def test_checker_advantages_rank_the_rubric_that_splits_the_answers_and_agrees_with_the_list():
    """`diagnostics.checker_advantages` by hand: of two rubrics for `big 3817` and answers
    that differ only on the 7, `has 7` splits them 2-2 and orders the list as ranked;
    `has 8` passes everything. The advantages are those of the library's rewards on the
    verdicts written out here."""
    from jaxrubric.rewards.dynamic_rubric import (
        anchor_ranking,
        discriminability,
        generator_advantages,
    )
    from jaxrubric.toy import diagnostics

    row = {"prompt": "big 3817", "answers": [{"answer": "87", "rank": 1},
                                             {"answer": "8", "rank": 2}]}
    got = diagnostics.checker_advantages([[(2.0, "has 7")], [(1.0, "has 8")]],
                                         ["87", "8", "87", "8"], row, max_items=2)
    verdicts = np.zeros((2, 4, 2))
    verdicts[0, :, 0] = [1, 0, 1, 0]
    verdicts[1, :, 0] = 1
    weights = np.array([[2.0, 0.0], [1.0, 0.0]])
    mask = np.array([[True, False], [True, False]])
    want = generator_advantages(discriminability(verdicts, weights, mask),
                                anchor_ranking(np.array([[1.0, 0.0], [1.0, 1.0]]),
                                               ranks=np.array([[1, 2], [1, 2]])),
                                mask.any(-1))
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert got[0] > got[1]


def test_a_workdir_built_with_another_config_is_refused_before_it_is_reused(tmp_path):
    """A workdir caches warm starts and runs; another config (a default changed since, an
    old workdir without a newer key) must not silently reuse them. Other `runs` and
    `final_samples` (`workdir.REUSABLE_SETTINGS`) may."""
    from jaxrubric.toy.genrubric_config import GenRubricWorldConfig

    prepare_workdir(tmp_path, ToyWorldConfig())
    prepare_workdir(tmp_path, ToyWorldConfig(runs=("oracle",)))  # adds runs only
    # The final evaluation's samples: it is redone whenever the world runs, not cached.
    prepare_workdir(tmp_path, ToyWorldConfig(final_samples=4))
    with pytest.raises(ValueError, match=r"another config \(round.policy.advantage_mode: "
                                         r"'no_std' there, 'group_std' now\)"):
        prepare_workdir(tmp_path, config_tree.replace(
            ToyWorldConfig(), {"round.policy.advantage_mode": "group_std"}))
    saved = json.loads((tmp_path / "toy_config.json").read_text())
    del saved["round"]["policy"]["advantage_mode"]  # a workdir from before the key
    (tmp_path / "toy_config.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="round.policy.advantage_mode: '\\(not set\\)' there"):
        prepare_workdir(tmp_path, ToyWorldConfig())
    # A workdir saved before the round settings moved under `round`.
    saved = json.loads((tmp_path / "toy_config.json").read_text())
    flat = {**{k: v for k, v in saved.items() if k != "round"}, "policy_beta": 0.01}
    (tmp_path / "toy_config.json").write_text(json.dumps(flat))
    with pytest.raises(ValueError, match="before a world's config held its round settings"):
        prepare_workdir(tmp_path, ToyWorldConfig())
    other = tmp_path / "genrubric"
    gw_config = GenRubricWorldConfig(eval_queries=4)
    assert prepare_workdir(other, gw_config)[0] == other
    with pytest.raises(ValueError, match="eval_queries: 4 there, 128 now"):
        prepare_workdir(other, GenRubricWorldConfig())


def test_a_world_config_is_rebuilt_from_its_saved_form():
    """A world's config saved as JSON (`toy_config.json`, a test's overrides) builds the same
    config again, its round from the nested mapping."""
    import dataclasses

    from jaxrubric.toy.genrubric_config import GenRubricWorldConfig

    for config in (ToyWorldConfig(), GenRubricWorldConfig(),
                   config_tree.replace(ToyWorldConfig(), {"round.policy.beta": 0.07})):
        saved = json.loads(json.dumps(dataclasses.asdict(config)))
        rebuilt = type(config)(**{k: tuple(v) if isinstance(v, list) else v
                                  for k, v in saved.items()})
        assert rebuilt == config
