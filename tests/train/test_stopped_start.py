"""Issue 33, case 9: ``kill -9`` of ``train`` before its first checkpoint. ``--resume`` says there is nothing to resume
and what to do; the original command starts the run afresh (no ``rm -rf``) and ends with the weights of a run that
was never killed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from safetensors.torch import load_file

from depthlab.cli import main

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _argv(data: Path, out: Path) -> list[str]:
    return ["train", "--set", "n_layers=2", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64",
            "--tokenizer", "bytes", "--data", str(data), "--seq-len", "16", "--batch-size", "4", "--eval-tokens", "64",
            "--steps", "4", "--ckpt-every", "2", "--device", "cpu", "--no-plots", "-q", "--out", str(out)]


def test_a_run_killed_before_its_first_checkpoint_starts_afresh_and_resume_says_so(tmp_path, capsys, caplog):
    torch.set_num_threads(1)
    data = tmp_path / "corpus.jsonl"
    data.write_text("".join(json.dumps({"text": f"Line {i} of a small corpus, words and words. " * 6}) + "\n"
                            for i in range(60)))
    run = tmp_path / "run"
    script = textwrap.dedent(f"""
        import os, signal, torch
        import depthlab.base.store.checkpoint as ck
        from depthlab.cli import main
        torch.set_num_threads(1)
        def dying_save(*a, **k):  # the first file of the first checkpoint: killed mid-write
            os.kill(os.getpid(), signal.SIGKILL)
        ck.torch.save = dying_save
        main({_argv(data, run)!r})
    """)
    proc = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": SRC}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert (run / "config.json").is_file() and not list((run / "checkpoint").glob("step-*"))

    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stopped before its first checkpoint" in err[0] and "without --resume" in err[0]

    assert main(_argv(data, run)) == 0
    assert any("starting it afresh" in r.getMessage() for r in caplog.records)
    assert main(_argv(data, tmp_path / "never-killed")) == 0
    final = [load_file(str(r / "checkpoint" / "step-00000004" / "model.safetensors")) for r in (run, tmp_path / "never-killed")]
    assert final[0].keys() == final[1].keys()
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])


def test_a_directory_that_is_not_a_stopped_run_is_still_refused(tmp_path, capsys):
    """Only a run's own first files are started over: a directory with anything else in it is refused as before."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"model": {}, "train": {}}))
    (out / "notes.txt").write_text("keep me")
    assert main(_argv(tmp_path / "nope.jsonl", out)) == 2
    err = capsys.readouterr().err
    assert "notes.txt" in err and "starting it afresh" not in err
    assert (out / "notes.txt").read_text() == "keep me"
