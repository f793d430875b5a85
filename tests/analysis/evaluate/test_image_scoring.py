"""Image-text multiple choice scored on a tiny random LLaVA equals a naive computation (each choice's sequence run
through the model, its continuation's log-probabilities summed), by both paths (one forward for single-token letters,
one per choice otherwise); bad input is one line, exit 2, before any model is loaded."""

from __future__ import annotations

import json

import pytest
import torch
from vlmdata import mmmu_rows, tiny_llava, write_jsonl

from depthlab.base.errors import DepthlabError
from depthlab.cli import main

pytest.importorskip("PIL")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llava_dirs(tmp_path_factory):
    return {merged: tiny_llava(tmp_path_factory.mktemp(f"llava-{merged}"), merged=merged) for merged in (True, False)}


def _load(path):
    model = transformers.AutoModelForImageTextToText.from_pretrained(path).eval()
    return model, transformers.AutoProcessor.from_pretrained(path)


@torch.no_grad()
def naive_logliks(model, processor, item) -> list[float]:
    """Each choice: context + continuation through the processor, one forward, the continuation's tokens scored."""
    images = [[r.open() for r in item.images]]
    context = item.context().replace("<image>", processor.image_token)
    out = []
    for cont in item.continuations():
        ctx = processor(text=[context], images=images, return_tensors="pt")["input_ids"][0]
        whole = processor(text=[context + cont], images=images, return_tensors="pt")
        ids = whole["input_ids"][0]
        assert torch.equal(ids[: len(ctx)], ctx)
        logp = torch.log_softmax(model(**whole).logits[0].float(), dim=-1)
        out.append(sum(float(logp[t - 1, ids[t]]) for t in range(len(ctx), len(ids))))
    return out


@pytest.mark.parametrize("merged", [True, False], ids=["letters-one-token", "letters-two-tokens"])
def test_scores_equal_the_naive_computation(llava_dirs, merged, tmp_path):
    from depthlab.analysis.evaluate.image_scoring import score_image_loglik
    from depthlab.data.image_tasks import load_image_task
    from depthlab.data.shapes import builtin_image_task

    model, processor = _load(llava_dirs[merged])
    assert len(processor.tokenizer(" A")["input_ids"]) == (1 if merged else 2)
    tasks = [builtin_image_task("builtin-shapes", limit=4),
             load_image_task(str(write_jsonl(tmp_path / "m.jsonl", mmmu_rows(tmp_path))))]
    for task in tasks:
        got = score_image_loglik(model, processor, task, progress=False)
        want = [naive_logliks(model, processor, item) for item in task.items]
        for g, w in zip(got.lls, want):
            torch.testing.assert_close(torch.tensor(g), torch.tensor(w), rtol=1e-5, atol=1e-5)
        acc = [float(max(range(len(w)), key=lambda i: w[i]) == it.gold) for w, it in zip(want, task.items)]
        assert got.metrics()["acc"] == sum(acc) / len(acc)


def test_the_image_reaches_the_scores(llava_dirs):
    from depthlab.analysis.evaluate.image_scoring import item_logliks
    from depthlab.data.image_tasks import ImageItem
    from depthlab.data.shapes import shapes_items

    model, processor = _load(llava_dirs[True])
    a, b = shapes_items(2, seed=5)
    swapped = ImageItem(b.images, a.question, a.options, a.gold)
    assert item_logliks(model, processor, a) != item_logliks(model, processor, swapped)


def test_chat_template_renders_one_user_turn(llava_dirs):
    from depthlab.analysis.evaluate.image_scoring import item_logliks, prompt
    from depthlab.data.shapes import shapes_items

    model, processor = _load(llava_dirs[True])
    item = shapes_items(1)[0]
    text, conts = prompt(item, processor, chat_template=True)
    assert text.startswith("USER: <image>\nWhich shape") and text.endswith("directly.\nASSISTANT: ")
    assert conts == ("A", "B", "C", "D")
    assert len(item_logliks(model, processor, item, chat_template=True)) == 4


def test_evaluate_writes_results_and_refuses_a_text_model_before_loading(llava_dirs, tiny_hf_dir, tmp_path):
    from depthlab.analysis.evaluate import evaluate

    res = evaluate(str(llava_dirs[True]), "builtin-shapes,builtin-mc", limit=3, out=tmp_path / "ev", progress=False)
    assert res["builtin-shapes"]["n"] == 3 and res["builtin-mc"]["n"] == 3
    saved = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert saved["chat_template"] is False and saved["results"]["builtin-shapes"]["format"] == "image-mc"
    with pytest.raises(DepthlabError, match="'builtin-shapes' is image-text .* not an image-text-to-text model"):
        evaluate(str(tiny_hf_dir), "builtin-shapes", limit=2, progress=False)


def _fails(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err


def test_cli_bad_image_input_is_one_line_exit_2(llava_dirs, tiny_hf_dir, tmp_path, capsys, monkeypatch):
    import transformers as tf

    def no_loading(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(tf.AutoModelForImageTextToText, "from_pretrained", no_loading)
    monkeypatch.setattr(tf.AutoModelForCausalLM, "from_pretrained", no_loading)
    out = str(tmp_path / "out")
    rows = mmmu_rows(tmp_path)
    missing = write_jsonl(tmp_path / "missing.jsonl", [{**rows[0], "image_1": "gone.png"}])
    _fails(capsys, ["evaluate", str(llava_dirs[True]), "--tasks", str(missing), "--out", out],
           f"{missing}:1", "gone.png' does not exist")
    no_answer = write_jsonl(tmp_path / "noanswer.jsonl", [{k: v for k, v in rows[0].items() if k != "answer"}])
    _fails(capsys, ["evaluate", str(llava_dirs[True]), "--tasks", str(no_answer), "--out", out], "no 'answer' field")
    _fails(capsys, ["evaluate", str(tiny_hf_dir), "--tasks", "builtin-shapes", "--out", out],
           "'builtin-shapes' is image-text", "no vision_config")


def test_cli_scores_an_image_text_model(llava_dirs, tmp_path, capsys):
    tasks = f"builtin-shapes,{write_jsonl(tmp_path / 'mmmu.jsonl', mmmu_rows(tmp_path))}"
    assert main(["evaluate", str(llava_dirs[True]), "--tasks", tasks, "--limit", "2", "--out",
                 str(tmp_path / "ev"), "--no-progress"]) == 0
    saved = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert saved["results"]["mmmu"]["n"] == 2 and saved["target_info"]["architecture"] == "LlavaForConditionalGeneration"
