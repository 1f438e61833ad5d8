"""Free-form rubric parsing: every accepted format, every problem kind, never raising."""

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxrubric.rubric.parse import ParsedRubric, RubricItem, format_rubric, parse_rubric

DATA = Path(__file__).parents[1] / "data"


def _items(*pairs):
    return [RubricItem(c, w) for w, c in pairs]


def _healthbench_rows():
    with open(DATA / "healthbench_oss_eval_30examples.jsonl") as f:
        return [json.loads(line) for line in f]


# ---------------------------------------------------------------- line format


def test_line_format_with_bullets_numbering_and_signs():
    text = """Rubric:
      [3] States the dose
    - [2] Mentions side effects
    * [+4] Cites a guideline
    1. [5] Advises seeing a doctor
    2) [-2] Recommends an unsafe drug
    (3) [ 1 ]   Is concise
    • [3.0] Is polite
    """
    rubric = parse_rubric(text)
    assert rubric.items == _items(
        (3, "States the dose"),
        (2, "Mentions side effects"),
        (4, "Cites a guideline"),
        (5, "Advises seeing a doctor"),
        (-2, "Recommends an unsafe drug"),
        (1, "Is concise"),
        (3, "Is polite"),
    )
    assert rubric.problems == []


def test_line_format_problems_name_the_line_and_reason():
    text = "[3] ok\n[x] foo\n[3]\n[2.5] half\n[0] nothing\n[4 unclosed\nplain prose\n[] empty"
    rubric = parse_rubric(text)
    assert rubric.items == _items((3, "ok"))
    problems = rubric.problems
    assert len(problems) == 6
    assert problems[0].startswith("line 2:") and "not a number" in problems[0]
    assert problems[1].startswith("line 3:") and "empty criterion" in problems[1]
    assert problems[2].startswith("line 4:") and "not an integer" in problems[2]
    assert problems[3].startswith("line 5:") and "weight 0" in problems[3]
    assert problems[4].startswith("line 6:") and "unclosed" in problems[4]
    assert problems[5].startswith("line 8:") and "not a number" in problems[5]


def test_prose_lines_are_skipped_silently():
    rubric = parse_rubric("Here is my rubric.\n\n[2] Is correct\nHope it helps!")
    assert rubric.items == _items((2, "Is correct"))
    assert rubric.problems == []


def test_weight_range_and_negative_rules():
    text = "[1] a\n[5] b\n[6] c\n[-1] d"
    rubric = parse_rubric(text, weight_range=(1, 5))
    assert rubric.items == _items((1, "a"), (5, "b"))
    assert "line 3: weight 6 outside [1, 5]" in rubric.problems[0]
    assert "line 4: weight -1 outside [1, 5]" in rubric.problems[1]

    rubric = parse_rubric(text, allow_negative=False)
    assert [item.weight for item in rubric.items] == [1, 5, 6]
    assert rubric.problems == ["line 4: negative weight -1 not allowed: '[-1] d'"]


def test_weight_too_large_for_int32():
    rubric = parse_rubric("[99999999999] a\n[" + "9" * 5000 + "] b")
    assert rubric.items == []
    assert sum("int32" in p for p in rubric.problems) == 2
    assert all(len(p) < 200 for p in rubric.problems)


def test_empty_text_reports_no_items():
    assert parse_rubric("") == ParsedRubric([], ["no rubric items found"])
    assert parse_rubric("just prose").problems == ["no rubric items found"]


def test_non_string_input_is_a_problem_not_an_error():
    rubric = parse_rubric(None)
    assert rubric.items == [] and "expected a str" in rubric.problems[0]


# ---------------------------------------------------------------- JSON formats


def test_json_array_with_alternative_keys():
    text = json.dumps(
        [
            {"criterion": "a", "weight": 3},
            {"description": "b", "points": -2},
            {"text": "c", "weight": 4.0},
        ]
    )
    assert parse_rubric(text).items == _items((3, "a"), (-2, "b"), (4, "c"))


@pytest.mark.parametrize("key", ["rubric", "items", "criteria", "Rubrics"])
def test_json_wrapped_in_object(key):
    text = json.dumps({key: [{"criterion": "a", "weight": 2}], "note": "x"})
    assert parse_rubric(text).items == _items((2, "a"))


def test_json_nested_wrapper_and_single_item_object():
    nested = {"rubric": {"items": [{"criterion": "a", "weight": 1}]}}
    assert parse_rubric(json.dumps(nested)).items == _items((1, "a"))
    assert parse_rubric('{"criterion": "a", "weight": 5}').items == _items((5, "a"))


def test_json_in_fenced_code_block_with_prose():
    text = (
        "Sure! Here is the rubric:\n\n```json\n"
        '[{"criterion": "Gives the dose", "weight": 3},\n {"criterion": "Is kind", "weight": 1}]'
        "\n```\nLet me know."
    )
    rubric = parse_rubric(text)
    assert rubric.items == _items((3, "Gives the dose"), (1, "Is kind"))
    assert rubric.problems == []


def test_json_fence_without_language_and_later_valid_fence():
    text = "```\nnot json\n```\n```JSON\n" + '{"items": [{"criterion": "a", "weight": 2}]}\n```'
    assert parse_rubric(text).items == _items((2, "a"))


def test_json_embedded_in_prose_without_fence():
    text = 'The rubric is [{"criterion": "a", "weight": 2}] and that is all.'
    assert parse_rubric(text).items == _items((2, "a"))


def test_fenced_json_wins_over_footnote_lines():
    text = (
        "As shown in [1], dosing matters.\n```json\n"
        '[{"criterion": "Gives the dose", "weight": 3}]\n```\n[1] Smith et al. 2020'
    )
    assert parse_rubric(text).items == _items((3, "Gives the dose"))


def test_line_format_wins_over_json_inside_a_criterion():
    items = _items((3, 'Outputs [{"criterion": "x", "weight": 1}]'), (2, "Ends with ```json"))
    assert parse_rubric(format_rubric(items)).items == items


def test_json_item_problems():
    entries = [
        {"criterion": "ok", "weight": 2},
        5,
        {"weight": 3},
        {"criterion": 7, "weight": 3},
        {"criterion": "  ", "weight": 3},
        {"criterion": "no weight"},
        {"criterion": "string weight", "weight": "3"},
        {"criterion": "bool weight", "weight": True},
        {"criterion": "half", "weight": 2.5},
        {"criterion": "zero", "weight": 0},
        {"criterion": "list weight", "weight": [1]},
    ]
    rubric = parse_rubric(json.dumps(entries))
    assert rubric.items == _items((2, "ok"))
    expected = [
        "item[1]: not an object",
        "item[2]: missing criterion",
        "item[3]: criterion is a int",
        "item[4]: empty criterion",
        "item[5]: missing weight",
        "item[6]: weight '3' is a string",
        "item[7]: weight is a bool",
        "item[8]: weight 2.5 is not an integer",
        "item[9]: weight 0 carries nothing",
        "item[10]: weight is a list",
    ]
    assert len(rubric.problems) == len(expected)
    for problem, prefix in zip(rubric.problems, expected):
        assert problem.startswith(prefix), (problem, prefix)


def test_json_weight_rules_apply():
    text = json.dumps([{"criterion": "a", "weight": -3}, {"criterion": "b", "weight": 9}])
    rubric = parse_rubric(text, weight_range=(-5, 5), allow_negative=False)
    assert rubric.items == []
    assert rubric.problems[:2] == [
        "item[0]: negative weight -3 not allowed",
        "item[1]: weight 9 outside [-5, 5]",
    ]


def test_broken_json_is_reported():
    rubric = parse_rubric('[{"criterion": "a", "weight": 2},')
    assert rubric.items == []
    assert any(p.startswith("invalid JSON") for p in rubric.problems)
    assert rubric.problems[-1] == "no rubric items found"


def test_json_without_rubric_list_is_reported():
    rubric = parse_rubric('{"answer": 42}')
    assert rubric.problems == ["JSON value holds no rubric item list", "no rubric items found"]


def test_deeply_nested_and_huge_inputs_do_not_raise():
    for text in [
        "[" * 200_000,
        "[" * 200_000 + "]" * 200_000,
        '{"a": ' * 100_000 + "1" + "}" * 100_000,
        '{"rubric": ' * 100 + "[]" + "}" * 100,
        '[{"criterion": "a", "weight": ' + "[" * 900 + "]" * 900 + "}]",
        '[{"criterion": "a", "weight": ' + "9" * 6000 + "}]",
        "[3] " + "x" * 1_000_000,
        "\x00\xff\ud7ff\ufffe[\x01] \x7f" * 10_000,
    ]:
        rubric = parse_rubric(text)
        assert isinstance(rubric, ParsedRubric)
    assert parse_rubric("[3] " + "x" * 1_000_000).items[0].weight == 3


# ---------------------------------------------------------------- real data


def test_all_healthbench_rubrics_parse_exactly():
    rows = _healthbench_rows()
    total = negative = 0
    for row in rows:
        rubric = parse_rubric(json.dumps(row["rubrics"]), weight_range=(-10, 10))
        assert rubric.problems == []
        assert rubric.items == [RubricItem(c["criterion"], c["points"]) for c in row["rubrics"]]
        total += len(rubric.items)
        negative += sum(item.weight < 0 for item in rubric.items)
    assert (len(rows), total, negative) == (30, 352, 102)


def test_healthbench_rubric_in_a_fence_wrapped_under_rubrics():
    row = _healthbench_rows()[3]
    text = "```json\n" + json.dumps({"rubrics": row["rubrics"]}, indent=2) + "\n```"
    assert [(i.criterion, i.weight) for i in parse_rubric(text).items] == [
        (c["criterion"], c["points"]) for c in row["rubrics"]
    ]


# ---------------------------------------------------------------- format + properties


def test_format_rubric_writes_canonical_lines():
    assert format_rubric(_items((3, "a b"), (-2, "c"))) == "[3] a b\n[-2] c"


@pytest.mark.parametrize(
    "item",
    [
        RubricItem("a", 0),
        RubricItem("a", 2.0),
        RubricItem("a", True),
        RubricItem("", 1),
        RubricItem(" a", 1),
        RubricItem("a\nb", 1),
        RubricItem("a", 2**40),
    ],
)
def test_format_rubric_rejects_items_that_cannot_round_trip(item):
    with pytest.raises(ValueError):
        format_rubric([item])


_bracketish = st.text(alphabet="[]{}()`0123456789+-.,:\"' \n\txjsonrubric*•", max_size=300)
_fragments = st.sampled_from(
    ["[", "]", "[3]", "[-2]", "[x]", "```json\n", "```", "{", "}", '"criterion"', '"weight"',
     ":", ",", "\n", "1. ", "- ", "[{", "}]", '"points": 2', '{"rubric": ', "2.5", "0", " "]
)
_spliced = st.lists(st.one_of(_fragments, st.text(max_size=5)), max_size=60).map("".join)


def _check(rubric):
    assert isinstance(rubric, ParsedRubric)
    assert all(isinstance(item, RubricItem) for item in rubric.items)
    assert all(isinstance(item.weight, int) and item.weight != 0 for item in rubric.items)
    assert all(isinstance(item.criterion, str) and item.criterion for item in rubric.items)
    assert all(isinstance(p, str) for p in rubric.problems)
    assert rubric.items or rubric.problems


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(), _bracketish, _spliced))
def test_random_text_never_raises(text):
    _check(parse_rubric(text))
    _check(parse_rubric(text, weight_range=(1, 5), allow_negative=False))


_criterion = st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40),
    st.text(alphabet='[]{}`"0123456789 :,-+.xjson', min_size=1, max_size=40),
).filter(lambda s: s.splitlines() == [s] and s == s.strip())
_weight = st.integers(-(2**31) + 1, 2**31 - 1).filter(lambda w: w != 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.builds(RubricItem, _criterion, _weight), max_size=12))
def test_format_then_parse_round_trips(items):
    assert parse_rubric(format_rubric(items)).items == items
