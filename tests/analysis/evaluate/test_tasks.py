"""Each native task format is detected and parsed to the right gold answer, with lm-eval's prompts;
bad files fail with one clear line."""

from __future__ import annotations

import json

import pytest
from evaldata import GOLD, ITEMS, write_jsonl

from depthlab.analysis.evaluate import detect_format, load_task_file, load_tasks
from depthlab.base.errors import DepthlabError


@pytest.mark.parametrize("fmt", sorted(ITEMS))
def test_each_format_parses_to_the_gold_answer(task_files, fmt):
    task = load_task_file(task_files[fmt])
    assert task.format == fmt and task.name == fmt
    assert [it.gold for it in task.items] == GOLD[fmt]
    for it in task.items:
        assert len(it.contexts) == len(it.continuations) == len(it.choices) == len(it.answer_words)
        assert it.source.startswith(str(task_files[fmt])) and it.instruction


def test_prompts_follow_lm_eval_templates(task_files):
    arc = load_task_file(task_files["arc"]).items[0]
    assert arc.contexts[0] == "Question: Which gas do plants take in from the air?\nAnswer:"
    assert arc.continuations[1] == " carbon dioxide"
    boolq = load_task_file(task_files["boolq"]).items[0]
    assert boolq.contexts[0].endswith("\nQuestion: does water boil at 100 degrees?\nAnswer:")
    assert boolq.choices == ("no", "yes") and boolq.answer_words == ("false", "true")
    siqa = load_task_file(task_files["siqa"]).items[0]
    assert siqa.contexts[0] == "Q: Jordan gave Robin a gift. How would Robin feel?\nA:"
    hs = load_task_file(task_files["hellaswag"]).items[0]
    assert hs.contexts[0] == "Baking cookies: A woman mixes flour and sugar in a bowl. She"  # ctx_b capitalised
    assert hs.choices[1] == "swims across. the lake." and hs.choices[2] == "paints the car blue."  # preprocess
    obqa = load_task_file(task_files["openbookqa"]).items[1]
    assert obqa.contexts[0] == "Rain comes from" and obqa.gold == 0  # answerKey " A" stripped


def test_winogrande_partial_scoring(task_files):
    it = load_task_file(task_files["winogrande"]).items[0]
    assert it.contexts == ("The trophy does not fit in the suitcase because the trophy",
                           "The trophy does not fit in the suitcase because the suitcase")
    assert it.continuations == (" is too big.", " is too big.")
    assert it.answer_words == ("option1", "option2")


def test_generic_format_answer_as_index_or_text(tmp_path):
    rows = [{"context": "two and two make", "choices": ["four", "five"], "answer": 0},
            {"context": "the sky is", "choices": ["green", "blue"], "answer": "blue"}]
    task = load_task_file(write_jsonl(tmp_path / "g.jsonl", rows))
    assert task.format == "generic" and [it.gold for it in task.items] == [0, 1]
    assert "Answer1: four" in task.items[0].instruction and "Answer format: answer1/answer2" in task.items[0].instruction


def test_question_format_answer_as_index_letter_text_or_ai2_label(tmp_path):
    rows = [{"question": "2+2?", "choices": ["4", "five", "22"], "answer": 0},
            {"question": "Sky?", "choices": ["green", "blue"], "answer": "B"},
            {"question": "Grass?", "choices": ["green", "blue"], "answer": "green"},
            {"question": {"stem": "Sea?", "choices": [{"label": "1", "text": "dry"}, {"label": "2", "text": "wet"}]},
             "answerKey": "2"}]
    task = load_task_file(write_jsonl(tmp_path / "q.jsonl", rows))
    assert task.format == "question" and [it.gold for it in task.items] == [0, 1, 0, 1]
    assert task.items[3].contexts[0] == "Question: Sea?\nAnswer:" and task.items[3].continuations == (" dry", " wet")
    with pytest.raises(DepthlabError, match="not among the 2 choices"):
        load_task_file(write_jsonl(tmp_path / "bad.jsonl", [{**rows[1], "answer": "C"}]))


def test_hellaswag_with_ctx_only(tmp_path):
    row = {"ctx": "A dog runs. it", "endings": ["barks.", "flies.", "melts.", "sings."], "label": 2}
    assert detect_format(row) == "hellaswag"
    it = load_task_file(write_jsonl(tmp_path / "h.jsonl", [row])).items[0]
    assert it.contexts[0] == "A dog runs. it" and it.gold == 2


def test_limit(task_files):
    assert len(load_tasks([str(task_files["arc"])], limit=2)[0].items) == 2


def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_unknown_format_names_fields_and_known_formats(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [{"prompt": "hi", "target": "there"}])
    with pytest.raises(DepthlabError) as err:
        load_task_file(path)
    msg = _one_line(err)
    assert f"{path}:1" in msg and "prompt, target" in msg and "arc (" in msg and "winogrande (" in msg


def test_answer_not_among_choices_names_file_and_line(tmp_path):
    rows = [ITEMS["arc"][0], {**ITEMS["arc"][1], "answerKey": "E"}]
    path = write_jsonl(tmp_path / "arc.jsonl", rows)
    with pytest.raises(DepthlabError) as err:
        load_task_file(path)
    assert f"{path}:2" in _one_line(err) and "'E'" in str(err.value)
    for bad in ({"context": "c", "choices": ["a", "b"], "answer": 2}, {"context": "c", "choices": ["a", "b"], "answer": "z"}):
        with pytest.raises(DepthlabError, match=r"g\.jsonl:1: answer"):
            load_task_file(write_jsonl(tmp_path / "g.jsonl", [bad]))
    with pytest.raises(DepthlabError, match="not among the choices"):
        load_task_file(write_jsonl(tmp_path / "w.jsonl", [{**ITEMS["winogrande"][0], "answer": "3"}]))


def test_empty_task_and_mixed_formats(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(DepthlabError, match="holds no items"):
        load_task_file(empty)
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [ITEMS["piqa"][0], ITEMS["siqa"][0]])
    with pytest.raises(DepthlabError, match=r"mixed\.jsonl:2: not a piqa item"):
        load_task_file(mixed)
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text(json.dumps(ITEMS["piqa"][0]) + "\n{oops\n")
    with pytest.raises(DepthlabError, match=r"bad\.jsonl:2: invalid JSON"):
        load_task_file(bad_json)
    with pytest.raises(DepthlabError, match="unknown task"):
        load_tasks("nope-task")


def test_hf_task_spec(monkeypatch):
    datasets = pytest.importorskip("datasets")
    calls = []

    def fake(name, config=None, split=None):
        calls.append((name, config, split))
        if name == "offline/none":
            raise ConnectionError("Couldn't reach 'offline/none' on the Hub (LocalEntryNotFoundError)\nmore")
        return ITEMS["piqa"]

    monkeypatch.setattr(datasets, "load_dataset", fake)
    task = load_tasks("hf:baber/piqa::validation")[0]
    assert task.format == "piqa" and [it.gold for it in task.items] == [0, 1] and calls[-1] == ("baber/piqa", None,
                                                                                                 "validation")
    assert load_tasks("hf:allenai/ai2_arc:ARC-Easy", limit=1)[0].name == "hf:allenai/ai2_arc:ARC-Easy"
    assert calls[-1] == ("allenai/ai2_arc", "ARC-Easy", "validation")
    with pytest.raises(DepthlabError, match=r"cannot load task 'hf:offline/none': Couldn't reach") as err:
        load_tasks("hf:offline/none")
    assert "\n" not in str(err.value)
