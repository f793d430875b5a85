"""Every long command, its stderr piped to a file as on a cluster: progress lines with a count and an ETA
(depthlab.base.progress), not silence. train: tests/base/test_progress.py (the CLI and the Python API);
compare: tests/compare/test_compare.py; theory: tests/analysis/theory/test_theory.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from depthlab import from_preset
from depthlab.train import TrainConfig, train


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("progress") / "run"
    model = from_preset("tiny", n_layers=3, d_model=32, n_heads=2, d_ff=64)
    train(model, TrainConfig(data="builtin", tokenizer="bytes", steps=2, batch_size=4, seq_len=32, eval_tokens=256),
          out, quiet=True)
    return out


def depthlab(*argv: str) -> list[str]:
    """``depthlab ARGV`` in a fresh process, stderr a pipe (not a terminal); its stderr lines."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-m", "depthlab", *argv], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr.splitlines()


def counted(lines: list[str], desc: str) -> None:
    """``desc``'s start, at least one count with an ETA, and its end."""
    mine = [l for l in lines if l.startswith(f"{desc}: ")]
    assert any(l.startswith(f"{desc}: started (") for l in mine), lines
    assert any("ETA" in l and "/" in l for l in mine), mine
    assert any(l.startswith(f"{desc}: done, ") for l in mine), mine


def test_diagnose_prune_finetune_and_evaluate_report_progress_when_piped(run, tmp_path):
    lines = depthlab("diagnose", str(run), "--tokens", "512", "--seq-len", "32", "--batch-size", "2", "--no-jacobian",
                     "--out", str(tmp_path / "diag"))
    counted(lines, "residual stream + removal sweep + swap test + sublayers + logit lens")
    lines = depthlab("prune", str(run), "--remove", "1", "--tokens", "256", "--seq-len", "32", "--batch-size", "2",
                     "--out", str(tmp_path / "pruned"))
    assert any("ETA" in l for l in lines), lines
    lines = depthlab("finetune", str(run), "--data", "builtin-sft", "--steps", "4", "--seq-len", "256", "--batch-size",
                     "2", "--out", str(tmp_path / "sft"))
    counted(lines, "training sft")
    lines = depthlab("evaluate", str(run), "--tasks", "builtin-mc", "--limit", "8", "--batch-size", "4", "--out",
                     str(tmp_path / "eval"))
    counted(lines, "builtin-mc")
    assert json.loads((tmp_path / "eval" / "eval.json").read_text())


def test_a_streamed_prune_piped_shows_no_third_party_progress_bars(tmp_path):
    """Issue 49, also seen: transformers' "Loading weights" bar (once per streamed layer) and huggingface_hub's
    "Writing model shards" reached a piped stderr (23 lines in a log); they are shown on a terminal only."""
    from tiny_models import hf_dir

    path = hf_dir(tmp_path, "llama", 4)
    lines = depthlab("prune", str(path), "--stream", "--remove", "1", "--tokens", "128", "--seq-len", "32",
                     "--device", "cpu", "--out", str(tmp_path / "pruned"))
    bars = [ln for ln in lines if "it/s]" in ln or "Loading weights" in ln or "Writing model shards" in ln]
    assert not bars, bars
    assert (tmp_path / "pruned" / "config.json").is_file()
