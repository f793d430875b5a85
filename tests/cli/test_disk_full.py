"""A full disk (a 2 MiB tmpfs): one line naming it, exit 2, no partial output, earlier checkpoints intact.

Mounting a tmpfs needs root; elsewhere these tests skip."""

import json
import os
import subprocess

import pytest

from depthlab.base.store.checkpoint import damage, list_checkpoints
from depthlab.cli import main


@pytest.fixture
def full_disk(tmp_path):
    """A 2 MiB tmpfs under tmp_path (skipped where it cannot be mounted)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def _corpus(path, docs: int, repeat: int) -> str:
    line = "A line of plain words for a corpus that does not fit on the small disk. " * repeat
    rows = [json.dumps({"text": f"{i} {line}"}) for i in range(docs)]
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def _one_error_line(capsys, command: str) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith(f"depthlab {command}: error: "), err
    return err[0]


def test_tokenize_on_a_full_disk_says_so_and_leaves_nothing(full_disk, tmp_path, capsys):
    data = _corpus(tmp_path / "corpus.jsonl", 2000, 10)  # 3 MB of uint16 byte tokens: more than the disk
    out = full_disk / "shards"
    assert main(["tokenize", "--data", data, "--tokenizer", "bytes", "--out", str(out)]) == 2
    line = _one_error_line(capsys, "tokenize")
    assert "no space left" in line and str(out) in line, line
    assert list(full_disk.iterdir()) == []  # no partial train.bin, no .lock, no hidden sibling


def test_a_checkpoint_that_does_not_fit_leaves_the_earlier_one_intact(full_disk, tmp_path, capsys):
    data = _corpus(tmp_path / "corpus.jsonl", 400, 1)
    run = full_disk / "run"  # ~1.2 MB a checkpoint (weights + Adam state): the first fits, the second does not
    argv = ["train", "--preset", "tiny", "--set", "n_layers=2", "--set", "d_model=64", "--set", "n_heads=2",
            "--set", "d_ff=128", "--tokenizer", "bytes", "--data", data, "--seq-len", "16", "--batch-size", "2",
            "--steps", "2", "--ckpt-every", "1", "--eval-tokens", "32", "--device", "cpu", "--no-plots", "-q",
            "--out", str(run)]
    assert main(argv) == 2
    line = _one_error_line(capsys, "train")
    assert "cannot write checkpoint step 2: no space left on the device holding" in line, line
    assert "inline_container" not in line and "enforce fail" not in line
    (first,) = list_checkpoints(run)
    assert first.name == "step-00000001" and damage(first) is None
    assert not list((run / "checkpoint").glob(".*.tmp-*"))  # the failed write is gone


def test_export_hf_onto_a_full_disk_says_so_in_one_line_and_leaves_nothing(full_disk, tmp_path, capsys):
    """Issue 49, cause 14: ``export --hf`` onto a full disk printed a raw ``SafetensorError ... os error 28`` (and
    progress bars) and left a partial directory; the checkpoint is now published whole."""
    data = _corpus(tmp_path / "corpus.jsonl", 50, 1)
    run = tmp_path / "run"  # about 3 MB of weights: more than the disk
    assert main(["train", "--preset", "tiny", "--set", "n_layers=4", "--set", "d_model=256", "--set", "d_ff=512",
                 "--tokenizer", "bytes", "--data", data, "--seq-len", "16", "--batch-size", "2", "--steps", "1",
                 "--eval-tokens", "32", "--device", "cpu", "--no-plots", "-q", "--out", str(run)]) == 0
    capsys.readouterr()
    out = full_disk / "hf"
    assert main(["export", str(run), "--hf", str(out)]) == 2
    line = _one_error_line(capsys, "export")
    assert "no space left on the device holding" in line and str(out) in line, line
    assert list(full_disk.iterdir()) == []  # no partial checkpoint, no hidden sibling
