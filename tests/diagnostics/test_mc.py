"""Multiple-choice scoring (depthlab.diagnostics.mc) against lm-evaluation-harness's rule."""

import json

import torch

from depthlab.diagnostics import ResidualCapture, find_layers
from depthlab.diagnostics.mc import MCAccumulator, load_mc


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
