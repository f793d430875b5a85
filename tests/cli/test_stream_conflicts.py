"""Issue 49, cause 6: flag combinations the streamed engine cannot run are refused at the engine's plan, before any
weight is read (a full NaN/inf read of 16 GB on an 8B model used to come first), from flags and ``--config`` alike:
one line, exit 2, nothing written."""

from __future__ import annotations

import json

import pytest
from tiny_models import hf_dir

from depthlab.cli import main
from depthlab.targets.stream import verify

CASES = {
    "heal-attn": (["prune", "--stream", "--unit", "attn", "--heal-steps", "2", "--remove", "1"],
                  "--heal with --unit attn needs the model in memory"),
    "generate": (["prune", "--stream", "--unit", "attn", "--generate", "{task}", "--remove", "1"],
                 "--generate needs the model in memory"),
    "tuned-lens": (["diagnose", "--stream", "--tuned-lens"], "--tuned-lens needs the model in memory"),
    "config-heal-attn": (["prune", "--config", "{config}"], "--heal with --unit attn needs the model in memory"),
}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("conflicts")
    (root / "task.jsonl").write_text(json.dumps({"context": "The sky is", "choices": ["blue", "green"],
                                                 "answer": 0}) + "\n")
    (root / "c.json").write_text(json.dumps({"stream": True, "unit": "attn", "remove": 1, "heal_steps": 2}))
    return hf_dir(root, "llama", 4, max_shard_size="40KB")


@pytest.mark.parametrize("case", CASES)
def test_a_streamed_flag_conflict_is_refused_before_any_weight_is_read(model, case, tmp_path, capsys, monkeypatch):
    def read(*args, **kwargs):
        raise AssertionError("a weight was read before the refusal")

    monkeypatch.setattr(verify, "_check_finite", read)
    argv, needle = CASES[case]
    task, config = model.parent / "task.jsonl", model.parent / "c.json"
    argv = [a.format(task=task, config=config) for a in argv]
    out = tmp_path / "out"
    assert main([argv[0], str(model), *argv[1:], "--device", "cpu", "--out", str(out)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and needle in err[0], err
    assert not out.exists()
