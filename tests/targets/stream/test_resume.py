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


def test_an_edit_of_config_json_after_a_crash_starts_the_pass_over_with_the_new_config(tmp_path, one_thread):
    """Issue 49, cause 2: a streamed diagnose killed after layer 2, then ``rope_theta`` and ``rms_norm_eps`` edited in
    config.json (the weights untouched): the rerun used to resume and mix the two configs in one report. The state's
    fingerprint now covers every file beside the weights: the pass starts over and gives a clean run's numbers."""
    import json

    from tiny_models import hf_dir

    from depthlab.analysis.diagnostics import DiagnoseOptions, diagnose
    from depthlab.targets.stream.open import open_streamed
    from depthlab.targets.stream.sweep import SweepSettings

    opts = DiagnoseOptions(tokens=96, seq_len=32, batch_size=2, jacobian=False, joint_check=False, progress=False)
    path, out = hf_dir(tmp_path, "llama", 4), tmp_path / "report"

    def crash(name: str, group: int, layer: int) -> None:
        if name == "diagnose" and layer == 2:
            raise RuntimeError("crash")

    with pytest.raises(RuntimeError, match="crash"):
        diagnose(open_streamed(str(path)), opts, out=out, settings=SweepSettings(on_layer=crash))
    assert any((state_dir(out) / "diagnose").glob("*.pt")), "the crash left a resume state"
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(rope_theta=cfg.get("rope_theta", 10000.0) * 7, rms_norm_eps=1e-2)
    (path / "config.json").write_text(json.dumps(cfg))
    rerun = diagnose(open_streamed(str(path)), opts, out=out)
    clean = diagnose(open_streamed(str(path)), opts, out=tmp_path / "clean")
    assert rerun["engine"]["resumed"] == []
    assert [rerun["angular"], rerun["loss"]] == [clean["angular"], clean["loss"]]
