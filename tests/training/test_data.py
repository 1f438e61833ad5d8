"""Loaders: each row validated; a bad row names its file, 0-based row and field, or is skipped
and counted; the real HealthBench rows load as they are."""

import json
from pathlib import Path

import datasets
import pytest

from jaxrubric.data import (
    DataError,
    load_anchors,
    load_healthbench,
    load_prompts,
    prompt_text,
)

HEALTHBENCH = Path(__file__).parents[1] / "data" / "healthbench_oss_eval_30examples.jsonl"

datasets.disable_progress_bars()


pytestmark = pytest.mark.usefixtures("datasets_cache")


def _healthbench_raw():
    return [json.loads(line) for line in HEALTHBENCH.open(encoding="utf-8")]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _expect_bad(loader, path, good, bad, message):
    """``bad`` after one good row: an error naming row 1, or a skipped and counted row."""
    _write(path, [good, bad])
    with pytest.raises(DataError) as info:
        loader(path)
    assert str(info.value) == f"{path} row 1: {message}"
    loaded = loader(path, skip_bad_rows=True)
    assert len(loaded.records) == 1 and loaded.skipped == 1
    assert loaded.problems == [f"{path} row 1: {message}"]


def test_prompts_as_strings_or_chats(tmp_path):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    path = _write(tmp_path / "prompts.jsonl",
                  [{"prompt": "Hello", "id": "a"}, {"prompt": chat, "id": 7}, {"prompt": "No id"}])
    loaded = load_prompts(path)
    assert loaded.skipped == 0 and loaded.source == str(path)
    assert [r.id for r in loaded.records] == ["a", "7", "2"]
    assert loaded.records[0].messages == [{"role": "user", "content": "Hello"}]
    assert loaded.records[1].messages == chat


@pytest.mark.parametrize("bad, message", [
    ({"id": "x"}, "field 'prompt' is missing or null"),
    ({"prompt": "   "}, "field 'prompt' must not be empty"),
    ({"prompt": []}, "field 'prompt' must not be empty"),
    ({"prompt": [{"role": "robot", "content": "hi"}]},
     "field 'prompt[0].role' must be one of ['system', 'developer', 'user', 'assistant'], "
     "got 'robot'"),
    ({"prompt": [{"role": "user", "content": 5}]}, "field 'prompt[0].content' must be a string, "
                                                   "got 5"),
    ({"prompt": [{"role": "user"}]}, "field 'prompt[0].content' is missing or null"),
    ({"prompt": "hi", "id": "first"}, "field 'id' repeats the id 'first' of row 0"),
    ({"prompt": "hi", "id": 1.5}, "field 'id' must be a non-empty string or an integer, got 1.5"),
])
def test_bad_prompt_rows(tmp_path, bad, message):
    _expect_bad(load_prompts, tmp_path / "prompts.jsonl", {"prompt": "fine", "id": "first"}, bad,
                message)


def test_anchors_sorted_best_first_with_ties_in_order(tmp_path):
    answers = [{"answer": "b", "rank": 2}, {"answer": "a", "rank": 1},
               {"answer": "c", "rank": 2.0}, {"answer": "d", "rank": 3}]
    path = _write(tmp_path / "anchors.jsonl", [{"prompt": "Q", "answers": answers, "id": "q"}])
    (record,) = load_anchors(path).records
    assert [(a.text, a.rank) for a in record.answers] == [("a", 1), ("b", 2), ("c", 2), ("d", 3)]
    assert all(type(a.rank) is int for a in record.answers)


def test_anchor_error_names_row_and_nested_field(tmp_path):
    good = {"prompt": "Q", "answers": [{"answer": "x", "rank": 1}]}
    bad = {"prompt": "Q", "answers": [{"answer": "x", "rank": 1}, {"answer": "y", "rank": 2},
                                      {"answer": "z", "rank": "x"}]}
    path = _write(tmp_path / "data.jsonl", [good] * 7 + [bad] + [good])
    with pytest.raises(DataError, match=r"data\.jsonl row 7: field 'answers\[2\]\.rank' must be "
                                        r"an integer, got 'x'$"):
        load_anchors(path)
    loaded = load_anchors(path, skip_bad_rows=True)
    assert [r.id for r in loaded.records] == ["0", "1", "2", "3", "4", "5", "6", "8"]
    assert loaded.skipped == 1


@pytest.mark.parametrize("bad, message", [
    ({"prompt": "Q", "answers": []}, "field 'answers' must not be empty"),
    ({"prompt": "Q", "answers": [{"answer": "x", "rank": 0}]},
     "field 'answers[0].rank' must be >= 1, got 0"),
    ({"prompt": "Q", "answers": [{"answer": "x", "rank": True}]},
     "field 'answers[0].rank' must be an integer, got True"),
    ({"prompt": "Q", "answers": [{"rank": 1}]}, "field 'answers[0].answer' is missing or null"),
    ({"prompt": "Q", "answers": "x"}, "field 'answers' must be a list, got 'x'"),
])
def test_bad_anchor_rows(tmp_path, bad, message):
    _expect_bad(load_anchors, tmp_path / "anchors.jsonl",
                {"prompt": "Q", "answers": [{"answer": "x", "rank": 1}]}, bad, message)


def test_real_healthbench_rows():
    raw = _healthbench_raw()
    loaded = load_healthbench(HEALTHBENCH)
    assert loaded.skipped == 0 and len(loaded.records) == len(raw) == 30
    with_ideal = 0
    for record, row in zip(loaded.records, raw):
        assert record.id == row["prompt_id"]
        assert record.messages == [{"role": m["role"], "content": m["content"]}
                                   for m in row["prompt"]]
        assert [(i.criterion, i.weight, i.tags) for i in record.rubric] == [
            (c["criterion"], c["points"], c["tags"]) for c in row["rubrics"]]
        assert record.tags == row["example_tags"]
        data = row["ideal_completions_data"]
        if data is None:
            assert record.ideal_completion is None and record.responses == []
            assert record.reference_ranks == []
            continue
        with_ideal += 1
        refs = data["ideal_completions_ref_completions"]
        assert record.responses == [data["ideal_completion"], *refs]
        assert record.reference_ranks == [1] + [2] * len(refs)
        assert 1 <= len(record.responses) <= 5
    assert with_ideal == 24


def test_prompt_text_shows_who_said_what():
    (record,) = [r for r in load_healthbench(HEALTHBENCH).records
                 if r.id == "c971f9d1-5f6a-464e-b282-41c8f0d82f58"]
    text = prompt_text(record.messages)
    assert text.startswith("user: ") and "\n\nassistant: " in text
    assert text.endswith(record.messages[-1]["content"])
    assert prompt_text([{"role": "user", "content": "Just this."}]) == "Just this."


def _healthbench_row(**changes):
    row = json.loads(json.dumps(_healthbench_raw()[1]))
    for path, value in changes.items():
        target, *keys = path.split("__")
        obj = row
        for key in [target, *keys][:-1]:
            obj = obj[int(key)] if isinstance(obj, list) else obj[key]
        last = [target, *keys][-1]
        if isinstance(obj, list):
            obj[int(last)] = value
        else:
            obj[last] = value
    return row


@pytest.mark.parametrize("changes, message", [
    ({"rubrics__0__points": "ten"}, "field 'rubrics[0].points' must be an integer, got 'ten'"),
    ({"rubrics__3__points": 0}, "field 'rubrics[3].points' must not be 0"),
    ({"rubrics__1__criterion": ""}, "field 'rubrics[1].criterion' must not be empty"),
    ({"rubrics": [{"criterion": "Harmful.", "points": -5, "tags": []}]},
     "field 'rubrics' needs at least one criterion with positive points"),
    ({"ideal_completions_data__ideal_completion": None},
     "field 'ideal_completions_data.ideal_completion' is missing or null"),
    ({"ideal_completions_data__ideal_completions_ref_completions__2": 3},
     "field 'ideal_completions_data.ideal_completions_ref_completions[2]' must be a string, "
     "got 3"),
    ({"prompt__0__role": "doctor"}, "field 'prompt[0].role' must be one of ['system', "
                                    "'developer', 'user', 'assistant'], got 'doctor'"),
])
def test_bad_healthbench_rows(tmp_path, changes, message):
    good = _healthbench_raw()[0]
    _expect_bad(load_healthbench, tmp_path / "hb.jsonl", good, _healthbench_row(**changes),
                message)


def test_parquet_and_json_array_files(tmp_path):
    rows = [{"prompt": "One", "id": "a"}, {"prompt": "Two", "id": "b"}]
    parquet = tmp_path / "prompts.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(parquet))
    array = tmp_path / "prompts.json"
    array.write_text(json.dumps(rows), encoding="utf-8")
    for path in (parquet, array):
        assert [(r.id, r.messages[0]["content"]) for r in load_prompts(path).records] == [
            ("a", "One"), ("b", "Two")]


def test_json_lines_under_either_extension(tmp_path):
    """Many hub exports are JSON lines named .json; blank lines are not rows; one object is
    one row."""
    lines = '{"prompt": "One", "id": "a"}\n\n{"prompt": "Two", "id": "b"}\n'
    for name in ("prompts.jsonl", "prompts.json"):
        (tmp_path / name).write_text(lines, encoding="utf-8")
        assert [r.id for r in load_prompts(tmp_path / name).records] == ["a", "b"]
    single = tmp_path / "single.json"
    single.write_text('{\n  "prompt": "Only",\n  "id": "c"\n}\n', encoding="utf-8")
    assert [r.id for r in load_prompts(single).records] == ["c"]


@pytest.mark.parametrize("name, text, message", [
    ("prompts.csv", "prompt\nhi\n", r"prompts\.csv: unsupported file type '\.csv'"),
    ("broken.jsonl", '{"prompt": "fine"}\n{"prompt": oops}\n',
     r"broken\.jsonl row 1 \(line 2\): not valid JSON"),
    ("broken.json", '[{"prompt": "fine"},\n {"prompt": oops}]\n',
     r"broken\.json line 2: not valid JSON"),
    ("after_blank.jsonl", '{"prompt": "fine"}\n\n{"prompt": "x", "id": 3.5}\n',
     r"after_blank\.jsonl row 1: field 'id'"),  # rows are counted without blank lines
    ("empty.jsonl", "", r"empty\.jsonl: the file is empty"),
])
def test_unreadable_sources_are_named(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=message):
        load_prompts(path)


def test_a_byte_that_is_not_utf8_is_named_by_row_and_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "fine"}\n\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"latin1\.jsonl row 1 \(line 3\), byte offset 35: "
                                         r"byte 0xe9 is not UTF-8"):
        load_prompts(path)


def test_missing_source_is_named(tmp_path):
    with pytest.raises(DataError, match=r"missing\.jsonl: no such file"):
        load_prompts(tmp_path / "missing.jsonl")
