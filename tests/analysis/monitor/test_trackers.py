"""Trackers of depthlab runs: what `depthlab train --tensorboard --wandb P --trackio P` logged is read back
with each tracker's own reader and equals metrics.jsonl; a compare logs each run in one group and its
report.html; a missing tracker package fails before the run, naming its install command."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from monitor_readers import need, tb_scalars, tb_tags, wandb_history, wandb_records

from depthlab.analysis.monitor.names import record_scalars
from depthlab.analysis.monitor.trackers import TrackerSpec
from depthlab.base.errors import DepthlabError
from depthlab.cli import main as cli_main

TINY = ["--preset", "tiny", "--set", "n_layers=4", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=48",
        "--tokenizer", "bytes", "--seq-len", "32", "--batch-size", "4", "--eval-tokens", "512", "--probe-batch-size", "4"]
HAVE = [t for t in ("tensorboard", "wandb", "trackio") if importlib.util.find_spec(t)]


def env_for(tmp: Path) -> dict:
    """The test's configuration of the trackers (the library reads no environment): W&B offline, trackio's
    files in the test's folder."""
    return {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "TRACKIO_DIR": str(tmp / "trackio"),
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[3] / "src"),
                                           os.environ.get("PYTHONPATH", "")])}


def run_cli(args: list[str], tmp: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "depthlab", *args], cwd=tmp, env=env_for(tmp), capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]


def expected(run: Path) -> dict[int, dict[str, float]]:
    """step -> every scalar the run's metrics.jsonl lines at that step map to."""
    steps: dict[int, dict[str, float]] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        steps.setdefault(rec["step"], {}).update(record_scalars(rec))
    return steps


def by_step(rows: list[dict], step_key: str) -> dict[int, dict]:
    merged: dict[int, dict] = {}
    for row in rows:
        merged.setdefault(int(row[step_key]), {}).update(row)
    return merged


def trackio_logs(tmp: Path, project: str, run: str) -> dict:
    code = ("import json; from trackio.sqlite_storage import SQLiteStorage as S; "
            f"print(json.dumps({{'logs': S.get_logs({project!r}, {run!r}), "
            f"'config': S.get_run_config({project!r}, {run!r})}}, default=str))")
    out = subprocess.run([sys.executable, "-c", code], env=env_for(tmp), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    if not HAVE:
        pytest.skip("no tracker package installed")
    tmp = tmp_path_factory.mktemp("tracked")
    flags = {"tensorboard": ["--tensorboard"], "wandb": ["--wandb", "depthlab-test"], "trackio": ["--trackio", "depthlab-test"]}
    run_cli(["train", *TINY, "--steps", "6", "--variance-every", "2", "--track-removal", "--eval-every", "3",
             "--log-every", "1", "-q", "--no-plots", *[f for t in HAVE for f in flags[t]], "--out", str(tmp / "run")], tmp)
    return tmp, tmp / "run"


@need("tensorboard")
def test_tensorboard_holds_exactly_the_metrics_jsonl_numbers_the_heatmap_and_the_config(tracked_run):
    _, run = tracked_run
    want = expected(run)
    got = tb_scalars(run / "tensorboard")
    assert set(got) == {tag for values in want.values() for tag in values}  # no more, no fewer series
    for step, values in want.items():
        for tag, value in values.items():
            assert got[tag][step] == np.float32(value), (step, tag)
    assert {"train/loss", "train/lr", "train/tokens_per_s", "eval/loss", "eval/ppl", "depth/angular/block_04",
            "depth_deepest_third/removal"} <= set(got)
    tags = tb_tags(run / "tensorboard")
    assert "depth_heatmap" in tags["images"] and "config/text_summary" in tags["tensors"]


@need("wandb")
def test_wandb_offline_run_holds_exactly_the_metrics_jsonl_numbers_the_heatmap_and_the_config(tracked_run):
    _, run = tracked_run
    rows = by_step(wandb_history(run / "wandb"), "_step")
    for step, values in expected(run).items():
        for tag, value in values.items():
            assert rows[step][tag] == value, (step, tag)
    assert rows[6]["depth_heatmap._type"] == "image-file"  # W&B's reader flattens media records
    assert next(run.glob("wandb/offline-run-*/files/" + rows[6]["depth_heatmap.path"])).stat().st_size > 1000
    config = [r["run"]["config"]["update"] for r in wandb_records(run / "wandb") if r.get("type") == "run"][0]
    saved = json.loads((run / "config.json").read_text())
    assert config["train"]["lr"] == saved["train"]["lr"] and config["model"]["n_layers"] == 4


@need("trackio")
def test_trackio_holds_exactly_the_metrics_jsonl_numbers_through_the_same_code_path(tracked_run):
    tmp, run = tracked_run
    got = trackio_logs(tmp, "depthlab-test", "run")
    rows = by_step(got["logs"], "step")
    for step, values in expected(run).items():
        for tag, value in values.items():
            assert rows[step][tag] == value, (step, tag)
    assert "depth_heatmap" in rows[6]
    assert got["config"]["train"]["steps"] == 6


@need("tensorboard")
def test_finetune_mirrors_its_metrics_to_tensorboard(tracked_run, tmp_path):
    from depthlab.train import TrainConfig
    from depthlab.train.finetune import finetune

    _, run = tracked_run
    cfg = TrainConfig(data="builtin-sft", steps=2, batch_size=2, seq_len=256, pack=False, eval_every=0, variance_every=1,
                      log_every=1, probe_batch_size=2, tensorboard=True)
    finetune(str(run), cfg, tmp_path / "sft", quiet=True)
    got = tb_scalars(tmp_path / "sft" / "tensorboard")
    want = expected(tmp_path / "sft")
    assert {"train/loss", "eval/loss", "depth/angular/block_04"} <= {t for v in want.values() for t in v}
    for step, values in want.items():
        for tag, value in values.items():
            assert got[tag][step] == np.float32(value), (step, tag)


@need("wandb")
def test_compare_logs_every_run_in_one_group_and_its_report(tmp_path):
    run_cli(["compare", "--schemes", "pre,lns", *TINY, "--steps", "2", "--variance-every", "1", "--eval-every", "0",
             "--diag-tokens", "128", "--diag-seq-len", "32", "--no-jacobian", "--wandb", "depthlab-test",
             "--tensorboard", "--out", str(tmp_path / "cmp")], tmp_path)
    cmp = tmp_path / "cmp"
    groups = {}
    for wandb_dir in (cmp / "runs" / "pre-seed0" / "wandb", cmp / "runs" / "lns-seed0" / "wandb", cmp / "wandb"):
        run = [r["run"] for r in wandb_records(wandb_dir) if r.get("type") == "run"][0]
        groups[run["display_name"]] = run.get("run_group")
    assert groups == {"pre-seed0": "cmp", "lns-seed0": "cmp", "cmp-compare": "cmp"}
    rows = by_step(wandb_history(cmp / "wandb"), "_step")
    summary = json.loads((cmp / "summary.json").read_text())
    for row in summary["table"]:
        assert rows[0][f"compare/{row['scheme']}/eval_ppl"] == row["eval_ppl"]
    assert rows[0]["report._type"] == "html-file"
    html = next(cmp.glob("wandb/offline-run-*/files/" + rows[0]["report.path"])).read_text()
    assert "<html" in html.lower() and "lns" in html
    if importlib.util.find_spec("tensorboard"):
        assert "report/text_summary" in tb_tags(cmp / "tensorboard")["tensors"]


def test_a_missing_tracker_package_fails_before_the_run_naming_its_install_command(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(DepthlabError, match=r"--wandb needs the wandb package, which is not installed: pip install wandb"):
        TrackerSpec(wandb="p").require()
    code = cli_main(["train", *TINY, "--steps", "2", "--wandb", "p", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "pip install wandb" in err[0]
    assert not (tmp_path / "run").exists()  # nothing written
