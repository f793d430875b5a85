"""The frame of diagnose and prune (depthlab.targets.frame): each stage of checks runs before what it does not need is
read, a refusal stops there with nothing loaded and no resume state left, and the resume state is held from the
engine's choice to the end of the body, removed on success and kept when the body raises."""

from __future__ import annotations

import pytest
from tiny_models import hf_dir

import depthlab.targets.load as load
from depthlab.analysis.diagnostics import DiagnoseOptions, diagnose
from depthlab.base.errors import DepthlabError
from depthlab.targets.frame import Checks, Request, checked
from depthlab.targets.stream.resume import state_dir


def _spy(monkeypatch, seen: list) -> None:
    """Record when the frame plans (config.json read) and loads (the model opened)."""
    plan, open_ = load.plan_target, load.load_target
    monkeypatch.setattr(load, "plan_target", lambda *a, **k: (seen.append("plan"), plan(*a, **k))[1])
    monkeypatch.setattr(load, "load_target", lambda *a, **k: (seen.append("load"), open_(*a, **k))[1])


def test_the_stages_run_in_order_and_the_state_is_held_from_the_plan_to_the_end(tmp_path, monkeypatch):
    path, out = hf_dir(tmp_path, "llama", 2), tmp_path / "out"
    seen: list = []
    _spy(monkeypatch, seen)
    checks = Checks(before_load=[lambda r: seen.append("before_load")],
                    on_plan=[lambda r, plan: seen.append(("on_plan", plan.streamed))],
                    on_target=[lambda r, t: seen.append(("on_target", (r.state / ".lock").is_file()))])
    request = Request(str(path), DiagnoseOptions(stream=True), out)
    with checked(request, checks) as target:
        assert target.plan.streamed and request.state == state_dir(out)
    assert seen == ["before_load", "plan", ("on_plan", True), "load", ("on_target", True)]
    assert not state_dir(out).exists()  # removed once the body returned

    with pytest.raises(RuntimeError, match="crash"), checked(Request(str(path), DiagnoseOptions(stream=True), out),
                                                              Checks()) as target:
        (state_dir(out) / "progress").write_text("saved")  # what a sweep saves
        raise RuntimeError("crash")
    assert (state_dir(out) / "progress").is_file()  # kept for the rerun


def test_a_refusal_stops_its_stage_before_anything_it_does_not_need(tmp_path, monkeypatch):
    path = hf_dir(tmp_path, "llama", 2)
    seen: list = []
    _spy(monkeypatch, seen)

    def refuse(*_):
        raise DepthlabError("refused")

    for stage, reached in (("before_load", []), ("on_plan", ["plan"]), ("on_target", ["plan", "load"])):
        seen.clear()
        out = tmp_path / stage
        with pytest.raises(DepthlabError, match="refused"), checked(Request(str(path), DiagnoseOptions(stream=True),
                                                                            out), Checks(**{stage: [refuse]})):
            pass
        assert seen == reached and not state_dir(out).exists() and not out.exists()
    seen.clear()
    with pytest.raises(DepthlabError, match="nope.jsonl"):  # diagnose's own checks: the --mc file before the plan
        diagnose(str(path), DiagnoseOptions(stream=True, mc=str(tmp_path / "nope.jsonl")))
    assert seen == []


@pytest.fixture
def no_model(monkeypatch):
    """Fails the test if the engine is even chosen (config.json read): the refusal must come first."""
    def never(*args, **kwargs):
        raise AssertionError("the model was planned or loaded before the refusal")

    monkeypatch.setattr(load, "plan_target", never)
    monkeypatch.setattr(load, "load_target", never)


@pytest.mark.parametrize("argv, needle", [
    (["diagnose", "--data", "/dev/zero"], "data '/dev/zero' is a character device, not a file or directory"),
    (["diagnose", "--data", "{fifo}"], "is a FIFO, not a file or directory"),
    (["diagnose", "--data", "{missing}"], "not found: give 'builtin'"),
    (["prune", "--remove", "1", "--data", "{fifo}"], "is a FIFO, not a file or directory"),
    (["prune", "--remove", "1", "--generate", "{missing}.jsonl"], "does not exist"),
    (["diagnose", "--out", "/proc/depthlab-x"], "'/proc' is not a writable directory"),
])
def test_data_task_files_and_out_are_refused_before_the_model_is_read(argv, needle, tmp_path, capsys, no_model):
    """Issue 49, causes 8, 9, 10: ``--data /dev/zero`` or a FIFO (said "not found" after the load), a missing
    ``--generate`` file (found after the held-out pass and the block choice), an ``--out`` under /proc that root's
    ``os.access`` calls writable (the work was lost when publishing): one line, exit 2, before the model."""
    import os

    from depthlab.cli import main

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "model").mkdir()  # a directory the model path check accepts; never read (no_model)
    (tmp_path / "model" / "config.json").write_text('{"model_type": "llama"}')
    values = {"fifo": str(tmp_path / "fifo"), "missing": str(tmp_path / "nothing")}
    argv = [a.format(**values) for a in argv]
    out = [] if "--out" in argv else ["--out", str(tmp_path / "out")]
    assert main([argv[0], str(tmp_path / "model"), *argv[1:], "--device", "cpu", *out]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "out").exists()
