"""``depthlab evaluate``: bad input -> one line on stderr, exit 2, nothing written; a good run writes
eval.json + eval.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from evaldata import ITEMS, write_jsonl

import depthlab
from depthlab.cli import main


def _fails(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and err.startswith("depthlab evaluate: error:")
    for n in needles:
        assert n in err, err
    return err


def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    unknown = write_jsonl(tmp_path / "u.jsonl", [{"prompt": "x", "target": "y"}])
    _fails(capsys, ["evaluate", "preset:tiny", "--tasks", str(unknown), "--out", str(out)],
           f"{unknown}:1", "prompt, target", "known formats", "siqa (")
    bad = write_jsonl(tmp_path / "arc.jsonl", [ITEMS["arc"][0], {**ITEMS["arc"][1], "answerKey": "Z"}])
    _fails(capsys, ["evaluate", "preset:tiny", "--tasks", f"builtin-mc,{bad}", "--out", str(out)],
           f"{bad}:2", "'Z'")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    _fails(capsys, ["evaluate", "preset:tiny", "--tasks", str(empty), "--out", str(out)], "holds no items")
    _fails(capsys, ["evaluate", "preset:tiny", "--tasks", "nosuch", "--out", str(out)], "unknown task 'nosuch'")
    _fails(capsys, ["evaluate", "no/such/dir", "--tasks", "builtin-mc", "--out", str(out)], "unknown model")
    _fails(capsys, ["evaluate", "preset:tiny", "--tasks", "builtin-mc", "--out", str(out), "--limit", "0"],
           "--limit 0")
    assert not out.exists()
    out.mkdir()
    (out / "keep.txt").write_text("x")
    _fails(capsys, ["evaluate", "preset:tiny", "--tasks", "builtin-mc", "--out", str(out)], "not empty")
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


def test_subprocess_exit_code_and_no_traceback(tmp_path):
    bad = write_jsonl(tmp_path / "g.jsonl", [{"context": "c", "choices": ["a", "b"], "answer": 5}])
    proc = subprocess.run([sys.executable, "-m", "depthlab", "evaluate", "preset:tiny", "--tasks", str(bad),
                           "--out", str(tmp_path / "o")], check=False, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(depthlab.__file__).parents[1])})
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and f"{bad}:1" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


def test_evaluate_writes_json_and_table(tmp_path, capsys, tiny_hf_dir):
    arc = write_jsonl(tmp_path / "arc.jsonl", ITEMS["arc"])
    out = tmp_path / "ev"
    assert main(["evaluate", str(tiny_hf_dir), "--tasks", f"{arc},builtin-mc", "--limit", "6", "--out", str(out),
                 "--batch-size", "4", "--no-progress"]) == 0
    body = json.loads((out / "eval.json").read_text())
    assert set(body["results"]) == {"arc", "builtin-mc"}
    assert body["results"]["arc"]["n"] == 3 and body["results"]["builtin-mc"]["n"] == 6
    for r in body["results"].values():
        assert {"acc", "acc_norm", "acc_stderr", "acc_norm_stderr", "n"} <= set(r)
    assert body["scoring"] == "loglik" and body["limit"] == 6 and "evaluate" in body["command"]
    table = (out / "eval.md").read_text()
    assert "| arc | arc | 3 |" in table and "| builtin-mc | generic | 6 |" in table
    assert "| arc |" in capsys.readouterr().out


@pytest.mark.parametrize("template", ["alpaca", "llm-adapters"])
def test_generate_scoring(tmp_path, tiny_hf_dir, template):
    out = tmp_path / "gen"
    assert main(["evaluate", str(tiny_hf_dir), "--tasks", "builtin-mc", "--limit", "2", "--out", str(out),
                 "--scoring", "generate", "--max-new-tokens", "3", "--template", template, "--no-progress"]) == 0
    body = json.loads((out / "eval.json").read_text())
    assert body["results"]["builtin-mc"]["n"] == 2 and body["template"]["name"] == template
    rows = [json.loads(x) for x in (out / "generations-builtin-mc.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all("output" in r for r in rows)
