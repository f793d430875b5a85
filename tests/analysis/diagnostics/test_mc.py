"""Multiple-choice scoring (depthlab.analysis.diagnostics.mc) against lm-evaluation-harness's rule."""

import json

import pytest
import torch

from depthlab.analysis.diagnostics import ResidualCapture, find_layers
from depthlab.analysis.diagnostics.mc import MCAccumulator, load_mc


def test_multiple_choice_scores_like_lm_eval(tmp_path, tiny_model):
    from depthlab.data import ByteTokenizer

    tok = ByteTokenizer()
    rows = [{"question": "2+2?", "choices": ["4", "five", "22"], "answer": 0},
            {"question": {"stem": "Sky?", "choices": [{"label": "A", "text": "blue"}, {"label": "B", "text": "red"}]},
             "answerKey": "B"}]
    path = tmp_path / "mc.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    items = load_mc(path)
    assert [it.answer for it in items] == [0, 1] and items[1].choices == ["blue", "red"]
    cap = ResidualCapture(tiny_model, find_layers(tiny_model), lambda x: tiny_model(x).logits)
    acc = MCAccumulator(items, 4)
    acc.run(cap, tok.encode, batch_size=2, device=torch.device("cpu"))
    # reference: one choice, scored alone without padding
    ctx, cont = tok.encode("Question: 2+2?\nAnswer:"), tok.encode(" five")
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = torch.log_softmax(tiny_model(ids).logits[0], -1)
    ref = sum(float(logp[len(ctx) - 1 + i, c]) for i, c in enumerate(cont))
    assert abs(float(acc.scores[0, 0, 1]) - ref) < 1e-4
    res = acc.result()
    assert len(res["removed_acc"]) == 4 and 0.0 <= res["acc"] <= 1.0


def test_mc_reads_tasks_as_evaluate_does_and_scores_like_it(tmp_path, tiny_model):
    """The eight formats / builtin-mc through depthlab.data.tasks; acc and acc_norm (lm-eval's
    character-length normalisation) equal depthlab evaluate's on the same model."""
    from depthlab.analysis.evaluate import load_tasks, score_loglik
    from depthlab.data import ByteTokenizer

    tok = ByteTokenizer()
    rows = [{"goal": "Open a jar", "sol1": "twist the lid", "sol2": "sing to it", "label": 0},
            {"goal": "Dry hair", "sol1": "use a towel", "sol2": "use a wet towel please", "label": 1},
            {"goal": "Cut bread", "sol1": "a knife", "sol2": "a spoon", "label": 0}]
    path = tmp_path / "piqa.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    items = load_mc(path)
    assert [it.answer for it in items] == [0, 1, 0] and items[0].contexts[0] == "Question: Open a jar\nAnswer:"
    cap = ResidualCapture(tiny_model, find_layers(tiny_model), lambda x: tiny_model(x).logits)
    acc = MCAccumulator(items, 4)
    acc.run(cap, tok.encode, batch_size=4, device=torch.device("cpu"), removal=False, prefix_id=tok.eos_id)
    task = load_tasks([str(path)])[0]
    ref = score_loglik(lambda ids: tiny_model(ids).logits, task, tok.encode, prefix_id=tok.eos_id, progress=False)
    for i, lls in enumerate(ref.lls):
        assert acc.scores[0, i, : len(lls)].tolist() == pytest.approx(lls, abs=1e-4)
    res, want = acc.result(), ref.metrics()
    assert res["acc"] == want["acc"] and res["acc_norm"] == want["acc_norm"]
    assert len(load_mc("builtin-mc", limit=3)) == 3
