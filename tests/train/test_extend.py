"""Extending a run (``train --resume RUN --steps M``) and the default measurement schedules.

The rule (depthlab.train.rundir.extension_rule): every step after the checkpoint gets the learning rate and the batch
a run planned for M steps gets at that step; the steps before it keep the schedule they were trained with.
"""

from __future__ import annotations

import json

import pytest
import torch

from depthlab import from_preset
from depthlab.base.errors import DepthlabError
from depthlab.cli import main
from depthlab.train import TrainConfig, list_checkpoints, lr_at, train
from depthlab.train.config import MEASURE_SHARE, measured_steps, measurement_costs, schedule_line


def small_model(**kw):
    return from_preset("tiny", **{"n_layers": 2, "d_model": 32, "n_heads": 2, "d_ff": 64, **kw})


def small_train(**kw):
    base = dict(data="builtin", tokenizer="bytes", steps=6, batch_size=4, seq_len=32, eval_tokens=512, eval_every=0,
                variance_every=0, log_every=1, ckpt_every=2, lr=3e-3)
    return TrainConfig(**{**base, **kw})


class Records:
    def __init__(self, stop: int | None = None) -> None:
        self.stop, self.records = stop, []

    def __call__(self, rec):
        self.records.append(rec)
        if rec["step"] == self.stop:
            raise KeyboardInterrupt


def weights(run):
    from safetensors.torch import load_file

    return load_file(list_checkpoints(run)[-1] / "model.safetensors")


def test_extending_inside_a_step_warmup_equals_the_run_planned_for_the_new_length(tmp_path):
    """Warm-up given in steps: the 6- and the 10-step schedules agree up to step 2, so a 6-step run stopped at its
    step-2 checkpoint and extended to 10 steps is the 10-step run, bit for bit."""
    planned = Records()
    train(small_model(), small_train(steps=10, warmup=2), tmp_path / "planned", progress=planned, quiet=True)
    with pytest.raises(KeyboardInterrupt):
        train(small_model(), small_train(steps=6, warmup=2), tmp_path / "ext", progress=Records(stop=2), quiet=True)
    extended = Records()
    train(small_model(), small_train(steps=10, warmup=2), tmp_path / "ext", resume=True, progress=extended, quiet=True)
    assert [(r["step"], r["loss"], r["lr"]) for r in extended.records] == \
        [(r["step"], r["loss"], r["lr"]) for r in planned.records[2:]]
    a, b = weights(tmp_path / "planned"), weights(tmp_path / "ext")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_extending_a_finished_run_follows_the_longer_schedule_from_its_last_step(tmp_path):
    """A finished 6-step run (warm-up 10 %, cosine to the floor at step 6) extended to 12 steps: steps 7-12 get
    the 12-step schedule's learning rates, the rates a run planned for 12 steps gets (the two runs differ in
    steps 1-6 only); config.json records the extension; a shorter --steps than the run has done is refused."""
    out = tmp_path / "run"
    short = Records()
    train(small_model(), small_train(warmup=0.1), out, progress=short, quiet=True)
    assert short.records[-1]["lr"] == pytest.approx(3e-3 * 0.1)  # the 6-step cosine ended at its floor
    extended = Records()
    train(small_model(), small_train(steps=12, warmup=0.1), out, resume=True, progress=extended, quiet=True)
    planned = small_train(steps=12, warmup=0.1)
    assert [r["step"] for r in extended.records] == list(range(7, 13))
    assert [r["lr"] for r in extended.records] == pytest.approx([lr_at(s - 1, planned) for s in range(7, 13)])
    assert extended.records[0]["lr"] > 3 * short.records[-1]["lr"]  # warmed back up at once, as stated
    config = json.loads((out / "config.json").read_text())
    assert config["train"]["steps"] == 12
    assert config["resume_changes"][-1]["changed"] == {"steps": [6, 12]} and config["resume_changes"][-1]["at_step"] == 6
    steps = [json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines() if "loss" in json.loads(l)]
    assert steps == list(range(1, 13))
    with pytest.raises(DepthlabError, match="already at step 12"):
        train(small_model(), small_train(steps=8), out, resume=True, quiet=True)


def test_cli_extends_a_finished_run_and_replans_its_default_schedules(tmp_path, capsys):
    out = tmp_path / "run"
    common = ["--set", "n_layers=2", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64", "--batch-size", "4",
              "--seq-len", "16", "--eval-tokens", "256", "--tokenizer", "bytes", "--no-plots", "-q"]
    assert main(["train", *common, "--steps", "4", "--out", str(out)]) == 0
    before = json.loads((out / "config.json").read_text())
    assert set(before["defaulted"]) == {"eval_every", "variance_every", "ckpt_every", "track_removal"}
    assert main(["train", "--resume", str(out), "--steps", "40", "-q", "--no-plots"]) == 0  # refused before
    after = json.loads((out / "config.json").read_text())
    replanned = TrainConfig(**{**before["train"], "steps": 40, "eval_every": None, "variance_every": None,
                               "ckpt_every": None, "track_removal": None}).resolve(small_model(vocab_size=256))
    for key in before["defaulted"]:
        assert after["train"][key] == getattr(replanned, key), key
    assert after["train"]["ckpt_every"] == 10 != before["train"]["ckpt_every"]
    assert json.loads((out / "summary.json").read_text())["steps"] == 40


@pytest.mark.parametrize("preset,over,kw", [
    ("tiny", {}, {}), ("tiny", {"n_layers": 24}, {"steps": 6}), ("tiny", {}, {"steps": 64, "batch_size": 8}),
    ("tiny", {}, {"steps": 3000}), ("llama-130m", {}, {}), ("tiny", {"n_layers": 48}, {"steps": 40}),
])
def test_default_schedules_keep_each_kind_of_measurement_within_its_share(preset, over, kw):
    """Estimated by token count (train/config.py): the periodic evaluations, and the periodic probes, each cost at
    most MEASURE_SHARE of the training steps; only the measurements every run makes (the evaluation at the end,
    the probes at step 0 and at the end) may exceed it, and the plan line states the cost."""
    model = from_preset(preset, **over)
    cfg = TrainConfig(**kw).resolve(model)
    evaluation, probe, removal = measurement_costs(cfg.to_dict(), model.n_layers)
    n_eval = len(measured_steps(cfg.eval_every, cfg.steps))
    assert (n_eval - 1) * evaluation <= MEASURE_SHARE * cfg.steps + 1e-9
    probes = [0, *measured_steps(cfg.variance_every, cfg.steps)]
    sweeps = [t for t in probes if t in (0, cfg.steps) or (t // cfg.variance_every) % cfg.removal_every == 0]
    cost = (len(probes) - 2) * probe + (len(sweeps) - 2) * removal * cfg.track_removal
    assert cost <= MEASURE_SHARE * cfg.steps + 1e-9
    if cfg.track_removal:
        assert 2 * (probe + removal) <= MEASURE_SHARE * cfg.steps
    line = schedule_line(cfg, model.n_layers)
    assert "held-out evaluation" in line and "% of training" in line and "depth probes" in line


def test_schedules_a_user_sets_are_kept():
    cfg = TrainConfig(steps=6, eval_every=1, variance_every=1, track_removal=True, eval_tokens=99_999).resolve(
        from_preset("tiny", n_layers=24))
    assert (cfg.eval_every, cfg.variance_every, cfg.track_removal, cfg.eval_tokens) == (1, 1, True, 99_999)


def test_out_on_a_folder_that_is_not_a_run_names_the_real_problem(tmp_path, capsys):
    """A folder of other files is not a run to resume: the message says what it holds, and does not suggest
    --resume; an existing run gets the --resume hint."""
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("x")
    args = ["train", "--set", "n_layers=2", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64",
            "--steps", "2", "--batch-size", "4", "--seq-len", "16", "--eval-tokens", "256", "--tokenizer", "bytes",
            "--no-plots", "-q"]
    assert main([*args, "--out", str(other)]) == 2
    err = capsys.readouterr().err
    assert "not a depthlab run (it holds todo.txt)" in err and "--resume" not in err
    run = tmp_path / "run"
    assert main([*args, "--out", str(run)]) == 0
    assert main([*args, "--out", str(run)]) == 2
    assert f"is already a run (at step 2); continue it with --resume '{run}'" in capsys.readouterr().err
