"""Record files read one way everywhere (jsonio.read_json_records): JSON Lines split on \\n only, .json lists by
suffix in any case; task items and SFT records that would score or train junk are refused, naming the item."""

import json

import pytest

from depthlab.base.errors import DepthlabError
from depthlab.base.fileio import jsonl_lines, read_json_records
from depthlab.data.sft import load_records
from depthlab.data.tasks import load_task_file

#: characters str.splitlines() cuts at but JSON allows unescaped inside a string
SEPARATORS = "\u2028\u2029\u0085\x1c\x1d\x1e\x0b\x0c"


def test_jsonl_lines_split_on_newline_only_and_drop_carriage_returns():
    text = '{"a": "x\u2028y"}\r\n\n  \n{"a": "z\u0085"}'
    assert list(jsonl_lines(text)) == [(1, '{"a": "x\u2028y"}'), (4, '{"a": "z\u0085"}')]
    assert len(text.splitlines()) > 4  # what the old reader did: the first record cut in two


def test_separators_inside_json_strings_reach_evaluate_and_finetune_intact(tmp_path):
    items = [{"context": f"Pick{sep}one", "choices": [f"a{sep}", "b"], "answer": 0} for sep in SEPARATORS]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in items),
                                      encoding="utf-8")
    task = load_task_file(tmp_path / "t.jsonl")
    assert [it.choices[0] for it in task.items] == [f"a{sep}" for sep in SEPARATORS]
    records = [{"instruction": f"Say{sep}hi", "output": f"hi{sep}"} for sep in SEPARATORS]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                                      encoding="utf-8")
    assert [r["output"] for r in load_records(tmp_path / "s.jsonl")] == [f"hi{sep}" for sep in SEPARATORS]


def test_a_json_suffix_in_any_case_is_one_json_list(tmp_path):
    records = [{"instruction": "a", "output": "b"}, {"instruction": "c", "input": "d", "output": "e"}]
    (tmp_path / "OK.JSON").write_text(json.dumps(records, indent=2))  # several lines: not JSON Lines
    assert [r["output"] for r in load_records(tmp_path / "OK.JSON")] == ["b", "e"]
    items = [{"context": "x", "choices": ["a", "b"], "answer": 1}] * 3
    (tmp_path / "Task.Json").write_text(json.dumps(items, indent=1))
    assert len(load_task_file(tmp_path / "Task.Json").items) == 3
    (tmp_path / "obj.json").write_text('{"instruction": "a"}')
    with pytest.raises(DepthlabError, match="expected a JSON list"):
        list(read_json_records(tmp_path / "obj.json"))


def test_non_utf8_and_invalid_json_name_the_file_and_line(tmp_path):
    (tmp_path / "bad.jsonl").write_bytes(b'{"a": 1}\n{"a": "caf\xe9"}\n')
    with pytest.raises(DepthlabError, match=r"task file '.*bad.jsonl' is not valid UTF-8 \(byte 19\)"):
        list(read_json_records(tmp_path / "bad.jsonl", "task file"))
    (tmp_path / "cut.jsonl").write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(DepthlabError, match=r"cut.jsonl:2: invalid JSON"):
        list(read_json_records(tmp_path / "cut.jsonl"))


@pytest.mark.parametrize("row,why", [
    ({"context": "c", "choices": ["a", "b"], "answer": 0, "input": 0}, None),  # extra fields of a task: ignored
    ({"question": "q?", "choices": {"text": ["only"], "label": ["A"]}, "answerKey": "A"}, "1 choice"),
    ({"ctx": "He", "endings": ["ends."], "label": 0}, "1 choice"),
    ({"context": None, "choices": ["a", "b"], "answer": 0}, "'context' must be a string, got null"),
    ({"context": "c", "choices": ["", " "], "answer": 0}, "choice 1 of 2 is empty"),
    ({"goal": "g", "sol1": None, "sol2": "b", "label": 0}, "'sol1' must be a string"),
    ({"sentence": "A _ b", "option1": "", "option2": "x", "answer": "1"}, "an option is empty"),
    ({"passage": ["p"], "question": "q", "answer": True}, "'passage' must be a string"),
])
def test_items_that_would_score_junk_are_refused_naming_the_item(tmp_path, row, why):
    path = tmp_path / "t.jsonl"
    ok = {"context": "c", "choices": ["a", "b"], "answer": 1}
    path.write_text(json.dumps(row) + "\n" + json.dumps(ok if "context" in row else row) + "\n")
    if why is None:
        assert [it.gold for it in load_task_file(path).items] == [0, 1]
        return
    with pytest.raises(DepthlabError) as err:
        load_task_file(path)
    assert "t.jsonl:1: " in str(err.value) and why in str(err.value), err.value


@pytest.mark.parametrize("value,ok", [(0, False), (5, False), (False, False), ([], False), (None, True), ("", True),
                                      ("x", True)])
def test_sft_input_must_be_a_string_or_absent(tmp_path, value, ok):
    rec = {"instruction": "Say hi.", "input": value, "output": "hi"}
    (tmp_path / "s.jsonl").write_text(json.dumps(rec) + "\n")
    if ok:
        assert load_records(tmp_path / "s.jsonl")[0]["input"] == (value or "")
        return
    with pytest.raises(DepthlabError, match=r"s.jsonl:1: 'input' must be a string or absent, got "):
        load_records(tmp_path / "s.jsonl")
