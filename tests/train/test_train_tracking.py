"""Depth tracking in the trainer: the tracked numbers are diagnose's, and a resumed run's series is
continuous (no duplicate or missing probe steps)."""

import json

import pytest

import depthlab as d
from depthlab.analysis.diagnostics import DiagnoseOptions, diagnose, load_target
from depthlab.analysis.diagnostics.probes import TRACKED
from depthlab.train import TrainConfig, train

SEQ, PROBE = 32, 4


def small():
    return d.from_preset("tiny", scheme="lns", n_layers=4, d_model=32, n_heads=2, d_ff=48)


def cfg(steps, **kw):
    return TrainConfig(data="builtin", tokenizer="bytes", steps=steps, seq_len=SEQ, batch_size=4, lr=3e-3,
                       variance_every=3, eval_every=0, eval_tokens=1024, probe_batch_size=PROBE,
                       **{"track_removal": True, **kw})


def stop_at(step):
    def progress(record):
        if record["step"] == step:
            raise KeyboardInterrupt

    return progress


def probes(run):
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if "layer_angular" in r]


def test_tracked_angular_and_removal_equal_diagnose_on_the_same_checkpoint_and_batch(tmp_path):
    run = tmp_path / "run"
    train(small(), cfg(6), run, quiet=True)
    last = probes(run)[-1]
    assert last["step"] == 6 and set(TRACKED) <= set(last)
    report = diagnose(load_target(str(run)), DiagnoseOptions(data="builtin", tokens=PROBE * SEQ, seq_len=SEQ,
                                                             batch_size=PROBE, jacobian=False, progress=False))
    assert report["data"]["tokens"] == PROBE * SEQ
    assert last["layer_angular"] == pytest.approx(report["angular"]["adjacent"], abs=1e-6)
    assert last["layer_removal"] == pytest.approx(report["removal"]["delta_loss"], abs=1e-6)
    assert last["layer_variance"] == pytest.approx(report["variance"]["variance"][1:], rel=1e-6)


def test_resume_keeps_the_tracked_series_continuous(tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    train(small(), cfg(9), straight, quiet=True)
    with pytest.raises(KeyboardInterrupt):
        train(small(), cfg(9, ckpt_every=3), split, quiet=True, progress=stop_at(4))
    train(small(), cfg(9, ckpt_every=3), split, resume=True, quiet=True)
    a, b = probes(straight), probes(split)
    assert [r["step"] for r in a] == [0, 3, 6, 9] == [r["step"] for r in b]
    assert [r["layer_angular"] for r in a] == [r["layer_angular"] for r in b]  # exact resume, exact probes


def test_removal_can_be_turned_off(tmp_path):
    train(small(), cfg(3, track_removal=False), tmp_path / "r", quiet=True)
    last = probes(tmp_path / "r")[-1]
    assert "layer_removal" not in last and "layer_angular" in last
