"""The streamed engine under attack (issue 33): two commands into one --out, a tampered resume state, a full disk's
empty state directory. (Damaged checkpoints are refused before the first layer: tests/cli/test_bad_inputs.py.)"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import hf_dir

from depthlab.analysis.diagnostics import DiagnoseOptions, diagnose
from depthlab.targets.stream.open import open_streamed
from depthlab.targets.stream.resume import state_dir
from depthlab.targets.stream.sweep import SweepSettings

SRC = str(Path(__file__).resolve().parents[3] / "src")
OPTS = DiagnoseOptions(tokens=96, seq_len=32, batch_size=2, jacobian=False, joint_check=False, progress=False)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def _numbers(report: dict) -> list:
    return [report["angular"], report["removal"]["delta_loss"], report["loss"], report["variance"]]


def test_a_second_streamed_command_into_the_same_out_is_refused_and_the_first_finishes_correctly(tmp_path):
    """Issue 33, case 1: the second ``diagnose --stream`` started while the first sweeps gets one line naming the
    first's PID and touches nothing; the first then finishes with the numbers of an undisturbed run."""
    path, out = hf_dir(tmp_path, "llama", 4), tmp_path / "report"
    second: list[subprocess.CompletedProcess] = []

    def start_second(name: str, group: int, layer: int) -> None:
        if name == "diagnose" and layer == 2 and not second:
            before = sorted(p.name for p in (state_dir(out) / "diagnose").iterdir())
            second.append(subprocess.run([sys.executable, "-m", "depthlab", "diagnose", str(path), "--stream",
                                          "--tokens", "96", "--seq-len", "32", "--device", "cpu", "--out", str(out)],
                                         capture_output=True, text=True, timeout=300,
                                         env={**os.environ, "PYTHONPATH": SRC}))
            assert sorted(p.name for p in (state_dir(out) / "diagnose").iterdir()) == before  # nothing touched
            assert not out.exists()  # nor any report written

    first = diagnose(open_streamed(str(path)), OPTS, out=out, settings=SweepSettings(on_layer=start_second))
    proc = second[0]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"is being written by another streamed command (process {os.getpid()}" in lines[0]
    assert not proc.stdout.strip()  # refused before any work or output
    assert (out / "report.json").is_file() and not state_dir(out).exists()  # the first published its report
    alone = diagnose(open_streamed(str(path)), OPTS, out=tmp_path / "alone")
    assert _numbers(first) == _numbers(alone)


def test_a_tampered_resume_state_is_discarded_with_a_warning_and_the_rerun_is_exact(tmp_path, caplog):
    """Issue 33, case 12: a resume state file replaced by junk (or a pickle of more than tensors) no longer blocks
    every rerun: it is named in a warning, discarded, and the pass starts over with the same numbers."""
    path, out = hf_dir(tmp_path, "llama", 4), tmp_path / "report"

    def crash(name: str, group: int, layer: int) -> None:
        if name == "diagnose" and layer == 2:
            raise RuntimeError("crash")

    with pytest.raises(RuntimeError, match="crash"):
        diagnose(open_streamed(str(path)), OPTS, out=out, settings=SweepSettings(on_layer=crash))
    saved = sorted((state_dir(out) / "diagnose").glob("g00000-streams-*.pt"))
    assert saved, "the crash left a resume state"
    torch.save({"not": "tensors", "code": dict}, saved[-1])  # a pickle that weights_only refuses
    caplog.set_level(logging.WARNING)
    resumed = diagnose(open_streamed(str(path)), OPTS, out=out)
    warned = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert warned and str(state_dir(out) / "diagnose") in warned[0]
    assert resumed["engine"]["resumed"] == []  # started over
    assert _numbers(resumed) == _numbers(diagnose(open_streamed(str(path)), OPTS, out=tmp_path / "b"))
