"""The resume state's lock (depthlab.targets.stream.resume): one holder, a second refused in one line naming the first's
PID (in another process or the same), no empty state directory left behind, and a one-line refusal where the state
cannot be created."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from depthlab.base.errors import DepthlabError
from depthlab.targets.stream.resume import hold_state, owned_state, state_dir

SRC = str(Path(__file__).resolve().parents[3] / "src")


def test_the_state_lock_leaves_no_empty_state_directory_and_refuses_a_second_holder(tmp_path):
    """A command that saved no progress (a full disk: the sweep runs without) leaves no hidden directory; while one
    process holds the state, another's attempt is one DepthlabError naming it."""
    root = tmp_path / ".out.stream-state"
    with hold_state(root, tmp_path / "out"):
        assert (root / ".lock").is_file()
        holder = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                                 "from depthlab.targets.stream.resume import hold_state\n"
                                 f"with hold_state(Path({str(root)!r})): pass"],
                                capture_output=True, text=True, env={**os.environ, "PYTHONPATH": SRC}, timeout=120)
        assert holder.returncode != 0 and f"process {os.getpid()}" in holder.stderr
        with pytest.raises(DepthlabError, match=f"process {os.getpid()}"):  # one holder, even in the same process
            with hold_state(root):
                pass
    assert not root.exists()
    with pytest.raises(DepthlabError, match="cannot create the resume state"):
        (tmp_path / "file").write_text("x")
        with hold_state(tmp_path / "file" / "state"):
            pass


def test_the_owned_state_is_removed_after_the_body_and_kept_when_it_raises(tmp_path):
    out = tmp_path / "report"
    with owned_state(out) as root:
        assert root == state_dir(out) and (root / ".lock").is_file()
        (root / "saved").write_text("progress")
    assert not root.exists()
    with pytest.raises(RuntimeError), owned_state(out) as root:
        (root / "saved").write_text("progress")
        raise RuntimeError
    assert (root / "saved").is_file()  # for the rerun to continue from
