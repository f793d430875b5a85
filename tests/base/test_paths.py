"""A TARGET that can only be a local path and does not exist: one line, exit 2, the closest names, no network."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from depthlab.base.errors import DepthlabError
from depthlab.base.paths import check_local_target, closest_paths, looks_local

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def runs(tmp_path, monkeypatch):
    (tmp_path / "runs" / "lns").mkdir(parents=True)
    (tmp_path / "runs" / "pre").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_what_counts_as_a_local_path(runs):
    assert looks_local("runs/lsn") and looks_local("./x") and looks_local("../x") and looks_local("/x/y")
    assert looks_local("~/x")
    assert not looks_local("someorg/somemodel")  # no directory someorg here: may be a hub id
    assert not looks_local("smollm2") and not looks_local("preset:tiny")


def test_closest_names_keep_the_rest_of_the_path_as_typed(runs):
    assert closest_paths("runs/lsn") == ["runs/lns"]
    assert closest_paths("./runs/lsn/checkpoint") == ["./runs/lns/checkpoint"]
    assert closest_paths(f"{runs}/rnus/pre") == [f"{runs}/runs/pre"]
    assert closest_paths("runs/zzzzzz") == []


def test_an_existing_path_or_a_hub_id_passes(runs):
    check_local_target("runs/lns")
    check_local_target("someorg/somemodel")
    with pytest.raises(DepthlabError, match=r"did you mean runs/lns\?"):
        check_local_target("runs/lsn")


def test_cli_answers_a_mistyped_path_in_one_line_without_the_network(runs, monkeypatch, capsys):
    from depthlab.cli import main

    def no_network(*args, **kwargs):
        raise AssertionError(f"network attempt: {args[:2]}")

    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    for command in ("diagnose", "prune", "evaluate"):
        extra = ["--out", str(runs / f"o-{command}")] if command == "prune" else []
        assert main([command, "runs/lsn", *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "did you mean runs/lns?" in err and "runs/lsn" in err, err
        assert not (runs / f"o-{command}").exists()


def test_the_mistyped_path_is_answered_before_torch_is_imported(runs):
    """What makes the answer take well under a second: no torch, transformers or hub client is loaded for it."""
    code = ("import sys\nfrom depthlab.cli import main\nrc = main(['diagnose', 'runs/lsn'])\n"
            "heavy = [m for m in ('torch', 'transformers', 'huggingface_hub') if m in sys.modules]\n"
            "print(rc, heavy)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=runs, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert proc.stdout.strip() == "2 []", proc.stdout + proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and "did you mean runs/lns?" in proc.stderr


def test_load_target_refuses_it_too(runs):
    from depthlab.targets import load_target

    with pytest.raises(DepthlabError, match="no such file or directory: 'runs/lsn'"):
        load_target("runs/lsn")


def test_an_unreachable_hub_is_one_line_at_once(runs, monkeypatch):
    from depthlab.targets import load_target

    def unresolvable(host, *args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(socket, "getaddrinfo", unresolvable)
    with pytest.raises(DepthlabError, match="hub id, and huggingface.co cannot be reached"):
        load_target("someorg/somemodel")
