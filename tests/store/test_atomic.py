"""publish_dir: an output directory appears complete or not at all."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from depthlab.errors import DepthlabError
from depthlab.store.atomic import publish_dir, remove_stale_tmp_dirs

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_success_renames_the_whole_directory_and_failure_leaves_nothing(tmp_path):
    out = tmp_path / "out"
    with publish_dir(out) as tmp:
        (tmp / "a.txt").write_text("a")
        assert not out.exists() and tmp.parent == out.parent
    assert (out / "a.txt").read_text() == "a" and [p.name for p in tmp_path.iterdir()] == ["out"]
    with pytest.raises(RuntimeError):
        with publish_dir(tmp_path / "b") as tmp:
            (tmp / "half").write_text("x")
            raise RuntimeError("interrupted")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    with pytest.raises(DepthlabError, match="not empty"):
        with publish_dir(out):
            pass


def test_a_killed_writer_leaves_only_a_hidden_sibling_that_the_next_run_removes(tmp_path):
    out = tmp_path / "out"
    code = ("import os, signal, sys\nsys.path.insert(0, %r)\nfrom depthlab.store.atomic import publish_dir\n"
            "with publish_dir(%r) as tmp:\n    (tmp / 'part').write_text('x')\n    os.kill(os.getpid(), signal.SIGKILL)\n"
            % (SRC, str(out)))
    assert subprocess.run([sys.executable, "-c", code]).returncode == -9
    left = list(tmp_path.iterdir())
    assert not out.exists() and len(left) == 1 and left[0].name.startswith(".out.tmp-")
    assert remove_stale_tmp_dirs(out) == left and not list(tmp_path.iterdir())
    with publish_dir(out) as tmp:
        (tmp / "whole").write_text(str(os.getpid()))
    assert (out / "whole").is_file()
