"""Multiple-choice tasks from local jsonl files in the native formats of the paper's eight tasks.

Each line of a task file is one item; the format is detected from the fields of the first item and
every item must then fit it. Prompts follow lm-evaluation-harness's task yamls (zero-shot,
``target_delimiter`` " "), so depthlab's ``acc``/``acc_norm`` are lm-eval's:

    format      fields                                          context / choices (lm-eval task)
    arc         question, choices{text,label}, answerKey        "Question: {question}\\nAnswer:" / choices.text (arc_easy)
    openbookqa  question_stem, choices{text,label}, answerKey   "{question_stem}" / choices.text (openbookqa)
    piqa        goal, sol1, sol2, label                         "Question: {goal}\\nAnswer:" / [sol1, sol2] (piqa)
    hellaswag   ctx (or ctx_a + ctx_b), endings, label          preprocess("{activity_label}: {ctx}") / endings (hellaswag)
    boolq       passage, question, answer (bool)                "{passage}\\nQuestion: {question}?\\nAnswer:" / ["no", "yes"]
    winogrande  sentence (with "_"), option1, option2, answer   partial scoring: context = sentence up to "_" with the
                                                                option, continuation = the rest (winogrande)
    siqa        context, question, answerA..C, label (1..3)     "Q: {context} {question}\\nA:" / answers (social_iqa)
    generic     context, choices (list), answer (index | text)  "{context}" / choices
    question    question, choices (list), answer (index, letter "Question: {question}\\nAnswer:" / choices
                or text); or AI2's ARC release: question{stem,
                choices[{label,text}]}, answerKey

Every item also carries the instruction LLM-Adapters' Commonsense170K uses for that task (``--scoring
generate``): "Please choose the correct answer to the question: ...\\n\\nAnswer1: ...\\n\\nAnswer format:
answer1/answer2/..." with the answer words (``answer1``, ``solution2``, ``true``, ``ending3``,
``option1``) that the generated text is searched for.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from depthlab.base.errors import DepthlabError
from depthlab.base.fileio import read_json_records


@dataclass(frozen=True)
class TaskItem:
    """One multiple-choice item as lm-eval scores it: request ``i`` is (``contexts[i]``,
    ``continuations[i]``); ``choices`` are lm-eval's ``doc_to_choice`` strings, whose character
    lengths normalise ``acc_norm``; ``gold`` indexes them."""

    contexts: tuple[str, ...]
    continuations: tuple[str, ...]
    choices: tuple[str, ...]
    gold: int
    instruction: str = ""  # LLM-Adapters-style prompt for generation scoring
    answer_words: tuple[str, ...] = ()  # what a generated answer names choice i by
    source: str = ""  # "file:line"


@dataclass
class Task:
    name: str
    format: str
    items: list[TaskItem]
    source: str = ""
    info: dict[str, Any] = field(default_factory=dict)


class _BadItem(ValueError):
    """An item that fits its format's fields but is wrong (answer not among the choices, ...)."""


# ---------------------------------------------------------------------- helpers
def _text(value: Any, name: str) -> str:
    """A text field: a string (a number is taken as its digits); null, true, a list ... are refused."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise _BadItem(f"{name!r} must be a string, got {json.dumps(value, default=str)[:40]}")


def _check_choices(item: TaskItem) -> None:
    """At least two choices, none empty: a 1-choice item or ["", ""] would score 100 % for any model."""
    if len(item.choices) < 2:
        raise _BadItem(f"{len(item.choices)} choice(s): a multiple-choice item needs at least two")
    empty = next((i for i, c in enumerate(item.choices, 1) if not c.strip()), None)
    if empty is not None:
        raise _BadItem(f"choice {empty} of {len(item.choices)} is empty")


def _mc(context: str, choices: list[str], gold: int, instruction: str, words: list[str]) -> TaskItem:
    if not 0 <= gold < len(choices):
        raise _BadItem(f"answer index {gold} is not among the {len(choices)} choices")
    return TaskItem(tuple(context for _ in choices), tuple(" " + c for c in choices), tuple(choices), gold,
                    instruction, tuple(words))


def _listing(head: str, word: str, choices: list[str], *, fmt_words: str | None = None) -> tuple[str, list[str]]:
    """LLM-Adapters' instruction: head, then "Word1: choice" blocks, then the answer format."""
    words = [f"{word.lower()}{i + 1}" for i in range(len(choices))]
    body = "".join(f"\n\n{word}{i + 1}: {c}" for i, c in enumerate(choices))
    return f"{head}{body}\n\nAnswer format: {fmt_words or '/'.join(words)}", words


def _labelled(choices: Any, key: Any) -> tuple[list[str], int]:
    """ARC/OBQA ``choices: {"text": [...], "label": [...]}`` and ``answerKey`` -> (texts, gold)."""
    if not isinstance(choices, dict) or not isinstance(choices.get("text"), list):
        raise _BadItem("'choices' must be {\"text\": [...], \"label\": [...]}")
    texts = [_text(t, "choices.text") for t in choices["text"]]
    labels = [str(x) for x in choices.get("label", [])]
    key = str(key).strip()
    if key not in labels:
        raise _BadItem(f"answerKey {key!r} is not among the choice labels {labels}")
    return texts, labels.index(key)


def _index(raw: Any, n: int, base: int = 0) -> int:
    if isinstance(raw, bool) or not (isinstance(raw, int) or (isinstance(raw, str) and raw.strip().lstrip("-").isdigit())):
        raise _BadItem(f"answer {raw!r} is not an index among the {n} choices")
    i = int(raw) - base
    if not 0 <= i < n:
        raise _BadItem(f"answer {raw!r} is not among the {n} choices")
    return i


# ---------------------------------------------------------------------- formats
def _arc(row: dict) -> TaskItem:
    texts, gold = _labelled(row["choices"], row["answerKey"])
    q = _text(row["question"], "question")
    return _mc(f"Question: {q}\nAnswer:", texts, gold,
               *_listing(f"Please choose the correct answer to the question: {q}", "Answer", texts))


def _openbookqa(row: dict) -> TaskItem:
    texts, gold = _labelled(row["choices"], row["answerKey"])
    q = _text(row["question_stem"], "question_stem")
    return _mc(q, texts, gold, *_listing(f"Please choose the correct answer to the question: {q}", "Answer", texts))


def _piqa(row: dict) -> TaskItem:
    sols, goal = [_text(row["sol1"], "sol1"), _text(row["sol2"], "sol2")], _text(row["goal"], "goal")
    return _mc(f"Question: {goal}\nAnswer:", sols, _index(row["label"], 2),
               *_listing(f"Please choose the correct solution to the question: {goal}", "Solution", sols))


def _hellaswag_preprocess(text: str) -> str:
    """lm-eval's hellaswag ``preprocess``: strip, WikiHow "[title]" -> ". ", drop "[...]", "  " -> " "."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def _hellaswag(row: dict) -> TaskItem:
    if "ctx_a" in row:
        ctx = _text(row["ctx_a"], "ctx_a") + " " + _text(row.get("ctx_b", ""), "ctx_b").capitalize()
    else:
        ctx = _text(row["ctx"], "ctx")
    label = row.get("activity_label")
    query = _hellaswag_preprocess(f"{label}: {ctx}" if label else ctx)
    endings = [_text(e, "endings") for e in row["endings"]]
    shown = f"{label}: {row.get('ctx', ctx)}" if label else str(row.get("ctx", ctx))
    instruction, words = _listing(f"Please choose the correct ending to complete the given sentence: {shown}",
                                  "Ending", endings)
    return _mc(query, [_hellaswag_preprocess(e) for e in endings], _index(row["label"], len(endings)),
               instruction, words)


def _boolq(row: dict) -> TaskItem:
    raw = row["answer"] if "answer" in row else row["label"]
    if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
        raw = raw.strip().lower() == "true"
    if not isinstance(raw, bool) and raw not in (0, 1):
        raise _BadItem(f"answer {raw!r} is not among the choices (true/false)")
    q, passage = _text(row["question"], "question"), _text(row["passage"], "passage")
    instruction = f"Please answer the following question with true or false, question: {q}?\n\nAnswer format: true/false"
    return _mc(f"{passage}\nQuestion: {q}?\nAnswer:", ["no", "yes"], int(bool(raw)), instruction,
               ["false", "true"])


def _winogrande(row: dict) -> TaskItem:
    sentence = _text(row["sentence"], "sentence")
    if "_" not in sentence:
        raise _BadItem("sentence has no '_' blank")
    idx = sentence.index("_")
    options = [_text(row["option1"], "option1"), _text(row["option2"], "option2")]
    if not all(o.strip() for o in options):
        raise _BadItem("an option is empty")
    gold = {"1": 0, "2": 1}.get(str(row["answer"]).strip())
    if gold is None:
        raise _BadItem(f"answer {row['answer']!r} is not among the choices (1, 2)")
    contexts = [sentence[:idx] + opt for opt in options]  # lm-eval doc_to_choice: the contexts
    rest = sentence[idx + 1:].strip()  # lm-eval doc_to_target: the shared continuation
    instruction, words = _listing("Please choose the correct answer to fill in the blank to complete the given "
                                  f"sentence: {sentence}", "Option", options)
    return TaskItem(tuple(contexts), tuple(" " + rest for _ in contexts), tuple(contexts), gold, instruction,
                    tuple(words))


def _siqa(row: dict) -> TaskItem:
    answers = [_text(row[k], k) for k in ("answerA", "answerB", "answerC")]
    q = f"{_text(row['context'], 'context')} {_text(row['question'], 'question')}"
    return _mc(f"Q: {q}\nA:", answers, _index(row["label"], 3, base=1),
               *_listing(f"Please choose the correct answer to the question: {q}", "Answer", answers))


def _generic(row: dict) -> TaskItem:
    choices = row["choices"]
    if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) for c in choices):
        raise _BadItem("'choices' must be a list of at least two strings")
    raw = row["answer"]
    gold = choices.index(raw) if isinstance(raw, str) and raw in choices else _index(raw, len(choices))
    ctx = _text(row["context"], "context")
    return _mc(ctx, list(choices), gold,
               *_listing(f"Please choose the correct answer to the question: {ctx}", "Answer", list(choices)))


def _question(row: dict) -> TaskItem:
    """``{"question", "choices", "answer"}`` (depthlab's first multiple-choice files) or AI2's ARC release
    (``{"question": {"stem", "choices": [{"label", "text"}]}, "answerKey"}``)."""
    q, choices = row["question"], row.get("choices")
    if isinstance(q, dict):
        q, choices = q.get("stem"), q.get("choices")
    labels = None
    if isinstance(choices, list) and choices and all(isinstance(c, dict) for c in choices):
        labels, choices = [str(c.get("label")) for c in choices], [c.get("text") for c in choices]
    if not isinstance(q, str) or not isinstance(choices, list) or len(choices) < 2 or None in choices:
        raise _BadItem("needs a question string and a list of at least two choices")
    texts = [str(c) for c in choices]
    raw = row.get("answer", row.get("answerKey"))
    key = str(raw).strip()
    if labels and key in labels:
        gold = labels.index(key)
    elif isinstance(raw, str) and raw in texts:
        gold = texts.index(raw)
    elif len(key) == 1 and key.isalpha():
        gold = _index(ord(key.upper()) - ord("A"), len(texts))
    else:
        gold = _index(raw, len(texts))
    return _mc(f"Question: {q}\nAnswer:", texts, gold,
               *_listing(f"Please choose the correct answer to the question: {q}", "Answer", texts))


#: name -> (fields that identify the format, parser); tried in this order
FORMATS: dict[str, tuple[tuple[str, ...], Callable[[dict], TaskItem]]] = {
    "arc": (("question", "choices", "answerKey"), _arc),
    "openbookqa": (("question_stem", "choices", "answerKey"), _openbookqa),
    "piqa": (("goal", "sol1", "sol2", "label"), _piqa),
    "hellaswag": (("endings", "label"), _hellaswag),
    "boolq": (("passage", "question"), _boolq),
    "winogrande": (("sentence", "option1", "option2", "answer"), _winogrande),
    "siqa": (("context", "question", "answerA", "answerB", "answerC", "label"), _siqa),
    "generic": (("context", "choices", "answer"), _generic),
    "question": (("question",), _question),
}
_EXTRA = {"hellaswag": (("ctx",), ("ctx_a",)), "boolq": (("answer",), ("label",)),  # one of these field sets too
          "question": (("choices", "answer"), ("answerKey",))}


def _fits(name: str, row: dict) -> bool:
    fields, _ = FORMATS[name]
    return all(f in row for f in fields) and (name not in _EXTRA or any(all(f in row for f in alt) for alt in _EXTRA[name]))


def known_formats() -> str:
    def one(name: str) -> str:
        fields = list(FORMATS[name][0])
        if name in _EXTRA:
            fields.append("|".join("+".join(alt) for alt in _EXTRA[name]))
        return f"{name} ({', '.join(fields)})"

    return "; ".join(one(n) for n in FORMATS)


def detect_format(row: dict) -> str | None:
    return next((name for name in FORMATS if _fits(name, row)), None)


def parse_rows(rows: Iterable[tuple[str, Any]], name: str, source: str, limit: int | None = None) -> Task:
    """A task from (where, row) pairs: the format is that of the first row; every row must fit it."""
    fmt, items = None, []
    for where, row in rows:
        if not isinstance(row, dict):
            raise DepthlabError(f"{where}: expected a JSON object, got {type(row).__name__}")
        if fmt is None:
            fmt = detect_format(row)
            if fmt is None:
                raise DepthlabError(f"{where}: no known task format fits the fields {', '.join(sorted(row)) or 'none'}; "
                                    f"known formats: {known_formats()}")
        elif not _fits(fmt, row):
            raise DepthlabError(f"{where}: not a {fmt} item (fields {', '.join(sorted(row))}; "
                                f"{fmt} needs {', '.join(FORMATS[fmt][0])})")
        try:
            item = FORMATS[fmt][1](row)
            _check_choices(item)
        except (_BadItem, TypeError, ValueError, KeyError) as err:
            raise DepthlabError(f"{where}: {err}") from None
        items.append(TaskItem(item.contexts, item.continuations, item.choices, item.gold, item.instruction,
                              item.answer_words, where))
        if limit is not None and len(items) >= limit:
            break
    if not items:
        raise DepthlabError(f"task {name!r} ({source}) holds no items")
    return Task(name, fmt or "generic", items, source)


def _jsonl_rows(path: Path) -> Iterable[tuple[str, Any]]:
    return read_json_records(path, "task file")


def load_task_file(path: str | Path, limit: int | None = None, name: str | None = None) -> Task:
    """A task from a local ``.jsonl`` file (one item per line, any format above) or a ``.json`` list of items."""
    path = Path(path)
    if not path.is_file():
        raise DepthlabError(f"task file {str(path)!r} does not exist")
    return parse_rows(_jsonl_rows(path), name or path.stem, str(path), limit)
