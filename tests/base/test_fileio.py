"""depthlab.base.fileio: a published file or directory appears complete or not at all, and it is the only
place in the package that renames, replaces or fsyncs a file."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from depthlab.base.errors import DepthlabError
from depthlab.base.fileio import fresh_out, publish, publish_dir, remove_stale_tmp, write_json_atomic

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


def test_fresh_out_takes_an_absent_or_empty_directory_and_refuses_anything_else_naming_the_flag(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    (tmp_path / "file").write_text("x")
    assert fresh_out(tmp_path / "new") == tmp_path / "new" and fresh_out(str(tmp_path / "empty")) == tmp_path / "empty"
    for name in ("full", "file"):
        with pytest.raises(DepthlabError, match=rf"^--hf '.*{name}' exists and is not empty; give a new or empty"):
            fresh_out(tmp_path / name, "--hf")
    assert (tmp_path / "full" / "x").read_text() == "x"


def test_a_killed_writer_leaves_only_a_hidden_sibling_that_the_next_run_removes(tmp_path):
    out = tmp_path / "out"
    code = ("import os, signal, sys\nsys.path.insert(0, %r)\nfrom depthlab.base.fileio import publish_dir\n"
            "with publish_dir(%r) as tmp:\n    (tmp / 'part').write_text('x')\n    os.kill(os.getpid(), signal.SIGKILL)\n"
            % (SRC, str(out)))
    assert subprocess.run([sys.executable, "-c", code]).returncode == -9
    left = list(tmp_path.iterdir())
    assert not out.exists() and len(left) == 1 and left[0].name.startswith(".out.tmp-")
    assert remove_stale_tmp(out) == left and not list(tmp_path.iterdir())
    with publish_dir(out) as tmp:
        (tmp / "whole").write_text(str(os.getpid()))
    assert (out / "whole").is_file()


def test_a_file_killed_mid_write_keeps_the_old_content_and_the_next_writer_cleans_up(tmp_path):
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"old": 1})
    code = ("import os, signal, sys\nsys.path.insert(0, %r)\nfrom depthlab.base.fileio import publish\n"
            "with publish(%r) as tmp:\n    tmp.write_text('{\"new\": ')\n    os.kill(os.getpid(), signal.SIGKILL)\n"
            % (SRC, str(path)))
    assert subprocess.run([sys.executable, "-c", code]).returncode == -9
    assert path.read_text() == '{\n  "old": 1\n}\n'  # never a half-written file under the real name
    assert [p.name.startswith(".summary.json.tmp-") for p in tmp_path.iterdir() if p != path] == [True]
    with publish(path) as tmp:
        tmp.write_text("{}\n")
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"] and path.read_text() == "{}\n"


def test_an_existing_directory_is_replaced_whole_or_kept(tmp_path):
    out = tmp_path / "cache"
    with publish(out, directory=True) as tmp:
        (tmp / "a").write_text("first")
    with publish(out, directory=True, if_exists="keep") as tmp:  # another writer got there first: ours is dropped
        (tmp / "a").write_text("second")
    assert (out / "a").read_text() == "first"
    with publish(out, directory=True) as tmp:
        (tmp / "b").write_text("third")
    assert sorted(p.name for p in out.iterdir()) == ["b"] and [p.name for p in tmp_path.iterdir()] == ["cache"]


def _hand_written_renames(path: Path) -> list[str]:
    """Calls that rename, replace or fsync a file: os.replace / os.rename / os.fsync / shutil.move, and
    Path.replace / Path.rename (a one-argument ``.replace(x)``: ``str.replace`` takes two)."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
        name = node.func.attr
        by_os = owner == "os" and name in {"replace", "rename", "renames", "fsync"}
        by_path = owner not in {"os", "shutil"} and name in {"replace", "rename"} and len(node.args) == 1 and not node.keywords
        if by_os or by_path or (owner == "shutil" and name == "move"):
            bad.append(f"{path.name}:{node.lineno}: {ast.unparse(node.func)}")
    return bad


def test_no_module_but_fileio_renames_or_fsyncs_a_file_by_hand():
    """One atomic writer: every temp-and-rename goes through depthlab.base.fileio (this test is the CI check)."""
    src = Path(SRC) / "depthlab"
    found = [b for p in sorted(src.rglob("*.py")) if p.name != "fileio.py" for b in _hand_written_renames(p)]
    assert found == []
    assert _hand_written_renames(src / "base" / "fileio.py")  # the check sees the real ones
