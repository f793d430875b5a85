"""One progress mechanism: a bar on a terminal, log lines with a rate and an ETA otherwise; library entry points
log to stderr when the caller configured no logging."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from depthlab.base import progress as P


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_log_lines_at_start_quarters_every_n_seconds_and_end(caplog):
    caplog.set_level(logging.INFO, logger="depthlab")
    clock = Clock()
    with P.LogProgress(100, "training x", "step", every_s=30, clock=clock) as bar:
        for i in range(1, 101):
            clock.t = i * 2.0  # 2 s a step: 15 steps between two timed lines
            bar.postfix(loss=f"{1 / i:.3f}", rate="512 tok/s")
            bar.update(1)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "training x: started (100 steps)"
    assert lines[-1] == "training x: done, 100 steps in 3m20s, loss 0.010, 512 tok/s"
    steps = [int(l.split("step ")[1].split("/")[0]) for l in lines[1:-1]]
    assert {25, 50, 75} <= set(steps)  # every quarter
    assert all(b - a <= 15 for a, b in zip([0, *steps], [*steps, 100]))  # and never 30 s without a line
    line = next(l for l in lines if "step 50/100" in l)
    assert line == "training x: step 50/100 (50%), loss 0.020, 512 tok/s, 1m40s elapsed, ETA 1m40s"


def test_a_resumed_count_rates_only_this_session():
    clock = Clock()
    bar = P.LogProgress(100, "t", "step", clock=clock, initial=60)
    clock.t = 10.0
    bar.update(20)  # 20 steps in 10 s: 20 left take 10 s more
    assert bar.line(clock.t).endswith("10s elapsed, ETA 10s") and "step 80/100 (80%)" in bar.line(clock.t)


def test_bar_on_a_terminal_lines_otherwise_nothing_when_off():
    class Tty:
        def isatty(self):
            return True

        def write(self, s):
            pass

        def flush(self):
            pass

    assert isinstance(P.progress(3, "x", stream=Tty()), P._Bar)
    assert isinstance(P.progress(3, "x", stream=Tty(), lines=True), P.LogProgress)
    assert isinstance(P.progress(3, "x", stream=sys.stderr), P.LogProgress)  # pytest's captured stderr
    assert isinstance(P.progress(3, "x", enabled=False), P._Off)


@pytest.mark.parametrize("n,text", [(0.4, "0s"), (59, "59s"), (61, "1m01s"), (3725, "1h02m"), (float("nan"), "?")])
def test_duration(n, text):
    assert P.duration(n) == text


def test_user_logging_shows_info_only_when_nothing_is_configured(capsys):
    root, lib = logging.getLogger(), logging.getLogger("depthlab")
    saved, level = root.handlers[:], lib.level
    root.handlers.clear()  # as in a plain script (pytest installs its own handlers)
    lib.setLevel(logging.NOTSET)  # as in a fresh interpreter (another test's `depthlab -v` may have set DEBUG)
    try:
        with P.user_logging():
            logging.getLogger("depthlab.x").info("plan line")
        with P.user_logging(quiet=True):
            logging.getLogger("depthlab.x").info("hidden")
            logging.getLogger("depthlab.x").warning("a warning")
        assert not lib.handlers and lib.level == logging.NOTSET  # restored
    finally:
        root.handlers[:] = saved
        lib.setLevel(level)
    err = capsys.readouterr().err
    assert "plan line" in err and "hidden" not in err and "a warning" in err


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


TRAIN = ("from depthlab import from_preset; from depthlab.train import TrainConfig, train; import sys\n"
         "m = from_preset('tiny', n_layers=2, d_model=32, n_heads=2, d_ff=64)\n"
         "c = TrainConfig(data='builtin', tokenizer='bytes', steps=8, batch_size=4, seq_len=16, eval_tokens=256)\n"
         "train(m, c, sys.argv[1] if len(sys.argv) > 1 else '{out}', quiet={quiet})\n")


def test_the_python_api_shows_its_plan_and_progress_on_stderr_when_piped(tmp_path):
    """``train(...)`` in a script with no logging set up: the plan line and the step lines reach a piped stderr
    (a log file), through logging; quiet=True: nothing."""
    shown = _run(TRAIN.format(out=tmp_path / "a", quiet=False))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stderr.splitlines()
    assert any(l.startswith("training a: tiny (pre,") for l in lines)
    assert any(l.startswith("training a: measuring held-out evaluation") for l in lines)
    assert any(l.startswith("training a: step 2/8 (25%), loss") and "tok/s" in l and "ETA" in l for l in lines)
    assert any(l.startswith("training a: done, 8 steps in") for l in lines)
    quiet = _run(TRAIN.format(out=tmp_path / "b", quiet=True))
    assert quiet.returncode == 0 and "training" not in quiet.stderr
