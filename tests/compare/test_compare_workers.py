"""compare --jobs: a worker that dies (kill -9) or fails stops only its own run; the others finish, one line names
the dead run, and running the same compare again resumes it."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_compare import small_config

from depthlab.base.errors import DepthlabError
from depthlab.compare import compare
from depthlab.compare.parallel import run_in_parallel


def toy_work(cfg, scheme, seed, run_dir, command):
    """A stand-in for train_and_diagnose: 'victim' waits to be killed, 'broken' fails, others finish."""
    run_dir.mkdir(parents=True)
    (run_dir / "pid").write_text(str(os.getpid()))
    if scheme == "victim":
        time.sleep(600)
    if scheme == "broken":
        raise DepthlabError("this run's data is bad\nsecond line")
    time.sleep(1.0)  # still running when the victim dies
    (run_dir / "done").write_text("yes")
    return f"{scheme}-seed{seed}"


def test_a_killed_worker_stops_only_its_run_and_is_named_in_one_line(tmp_path):
    todo = [(s, 0, tmp_path / s) for s in ("victim", "healthy", "broken", "late")]

    def kill_the_victim():
        pid_file = tmp_path / "victim" / "pid"
        while not pid_file.is_file() or not pid_file.read_text():
            time.sleep(0.01)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)

    killer = threading.Thread(target=kill_the_victim, daemon=True)
    killer.start()
    with pytest.raises(DepthlabError) as err:
        run_in_parallel(toy_work, SimpleNamespace(preset="vit-tiny"), todo, jobs=2, command=None)
    killer.join(timeout=60)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("2 of 4 runs did not finish"), msg
    assert "victim-seed0: its worker process was killed by SIGKILL" in msg
    assert "broken-seed0: this run's data is bad" in msg
    assert (tmp_path / "healthy" / "done").is_file() and (tmp_path / "late" / "done").is_file()  # the others went on


def test_a_compare_whose_worker_was_killed_keeps_the_other_run_and_resumes(tmp_path):
    base = small_config()
    cfg = dataclasses.replace(base, jobs=2, train=base.train.replace(steps=12, ckpt_every=2, eval_every=6,
                                                                     variance_every=6))
    out = tmp_path / "cmp"
    victim = out / "runs" / "pre-seed0"

    def kill_pre_after_its_first_checkpoint():
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            pid = (victim / ".lock").read_text().strip() if (victim / ".lock").is_file() else ""
            if pid and list((victim / "checkpoint").glob("step-*")):
                os.kill(int(pid), signal.SIGKILL)
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_pre_after_its_first_checkpoint, daemon=True)
    killer.start()
    with pytest.raises(DepthlabError, match=r"1 of 2 runs did not finish \(pre-seed0: its worker process was killed "
                                            r"by SIGKILL\)"):
        compare(cfg, out, quiet=True)
    killer.join(timeout=60)
    assert (out / "runs" / "lns-seed0" / "diagnostics" / "report.json").is_file()  # the healthy run finished
    assert not (victim / "summary.json").exists() and list((victim / "checkpoint").glob("step-*"))

    result = compare(cfg, out, quiet=True)  # the same command again: pre resumes from its checkpoint
    assert [r["scheme"] for r in result["runs"]] == ["pre", "lns"]
    newest = sorted((victim / "checkpoint").glob("step-*"))[-1]
    assert "command_resume" in json.loads((newest / "config.json").read_text())  # resumed, not started over
    assert Path(out / "summary.json").is_file()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return not (status.is_file() and status.read_text().split(")")[-1].split()[0] == "Z")  # a zombie is gone


def test_workers_stop_when_the_compare_process_is_killed(tmp_path):
    """kill -9 of the compare process: its workers notice within seconds and exit (no orphan keeps training)."""
    script = (
        "import sys; from pathlib import Path; from types import SimpleNamespace\n"
        "from test_compare_workers import toy_work\n"
        "from depthlab.compare.parallel import run_in_parallel\n"
        f"root = Path({str(tmp_path)!r})\n"
        "run_in_parallel(toy_work, SimpleNamespace(preset='vit-tiny'), [('victim', k, root / f'v{k}') for k in (0, 1)],"
        " jobs=2, command=None)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    parent = subprocess.Popen([sys.executable, "-c", script], env=env)
    pid_files = [tmp_path / f"v{k}" / "pid" for k in (0, 1)]
    deadline = time.monotonic() + 120
    while not all(f.is_file() and f.read_text() for f in pid_files):
        assert time.monotonic() < deadline and parent.poll() is None, "the workers did not start"
        time.sleep(0.05)
    workers = [int(f.read_text()) for f in pid_files]
    assert all(_alive(pid) for pid in workers)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 20
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in workers), "a worker outlived its compare"
