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
