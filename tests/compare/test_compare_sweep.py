"""compare --sweep: a 2 x 2 grid of training settings x 2 schemes x 2 seeds in one call (toy size), its report, resume
after an interrupted run, a failing cell recorded while the others finish, workers across cells, bad input."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys

import pytest

import depthlab.compare.experiment as C
from depthlab.analysis.diagnostics import DiagnoseOptions
from depthlab.base.errors import DepthlabError
from depthlab.compare import CompareConfig, compare
from depthlab.compare.config import parse_sweep
from depthlab.compare.sweep import MEASURES
from depthlab.models.schemes import SchemeSpec
from depthlab.train import TrainConfig

SWEEP = {"weight_decay": [0.0, 0.1], "optimizer": ["adamw", "muon"]}
CELLS = ["weight_decay-0_optimizer-adamw", "weight_decay-0_optimizer-muon", "weight_decay-0.1_optimizer-adamw",
         "weight_decay-0.1_optimizer-muon"]


def sweep_config(sweep=SWEEP, schemes=("pre", "lns"), seeds=(0, 1)) -> CompareConfig:
    """Toy size: 3 blocks of width 32, 4 steps, a small diagnosis (the grid is 16 runs)."""
    train = TrainConfig(data="builtin", tokenizer="bytes", steps=4, seq_len=32, batch_size=4, lr=3e-3, eval_tokens=256,
                        eval_every=2, variance_every=2, ckpt_every=2, device="cpu")
    diag = DiagnoseOptions(tokens=256, seq_len=32, batch_size=4, jacobian=False, joint_check=False, progress=False)
    return CompareConfig(schemes=list(schemes), preset="tiny", seeds=list(seeds), train=train, diagnose=diag,
                         model_overrides={"n_layers": 3, "d_model": 32, "n_heads": 2, "d_ff": 64}, sweep=dict(sweep))


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    return out, compare(sweep_config(), out, command="pytest")


def test_one_call_trains_every_cell_scheme_and_seed(swept):
    out, result = swept
    assert [e["dir"] for e in result["cells"]] == [f"cells/{c}" for c in CELLS]
    assert [e["cell"] for e in result["cells"]][1] == "weight_decay=0 optimizer=muon"
    for entry in result["cells"]:
        cell = out / entry["dir"]
        saved = json.loads((cell / "summary.json").read_text())
        assert entry["table"] == saved["table"]  # the sweep's table per cell is that cell's own compare
        assert [(r["scheme"], r["seed"]) for r in entry["runs"]] == [("pre", 0), ("lns", 0), ("pre", 1), ("lns", 1)]
        for row in entry["table"]:
            assert row["seeds"] == [0, 1] and "eval_loss_std" in row and "deep_contribution" in row
        for run in (cell / "runs").iterdir():  # each run trained with its cell's values
            train = json.loads((run / "config.json").read_text())["train"]
            assert (train["weight_decay"], train["optimizer"]) == tuple(entry["values"].values())
            assert ("optimizer_split" in json.loads((run / "config.json").read_text())) == (train["optimizer"] == "muon")
    losses = {e["cell"]: e["table"][0]["eval_loss"] for e in result["cells"]}
    assert len(set(losses.values())) == 4  # every cell trained differently


def test_report_has_a_table_per_cell_and_a_figure_per_measure(swept):
    out, result = swept
    for key in MEASURES:  # held-out loss, removal, swap, angular, contribution, effective depth
        assert (out / f"{key}_across_cells.png").stat().st_size > 0 and result["figures"][key] == f"{key}_across_cells.png"
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(MEASURES) == 6 and html.count("<h2>cell ") == 4 and "pytest" in html
    md = (out / "summary.md").read_text()
    assert md.count("## cell ") == 4 and "## held-out loss" in md and "## contribution deepest third" in md
    assert "## swap Δloss deepest third" in md and "## effective depth / L" in md
    pre = result["cells"][3]["table"][0]
    assert f"{pre['eval_loss']:.4f} ± {pre['eval_loss_std']:.4f}" in md
    assert json.loads((out / "compare.json").read_text())["settings"]["sweep"] == SWEEP


def test_an_interrupted_run_resumes_and_nothing_else_trains(swept, tmp_path, monkeypatch):
    """As after a kill -9 mid-run: one run of one cell has its step-2 checkpoint only; the same call again resumes it
    from there and reuses every other run of every cell."""
    out, result = swept
    again = tmp_path / "sweep"
    shutil.copytree(out, again)
    run = again / "cells" / CELLS[2] / "runs" / "lns-seed1"
    for name in ("summary.json", "diagnostics"):
        shutil.rmtree(run / name) if (run / name).is_dir() else (run / name).unlink()
    shutil.rmtree(run / "checkpoint" / "step-00000004")
    (again / "summary.json").unlink()
    calls = []
    original = C.train
    monkeypatch.setattr(C, "train", lambda m, t, d, **k: calls.append((d.parent.parent.name, d.name, k["resume"]))
                        or original(m, t, d, **k))
    resumed = compare(sweep_config(), again, command="pytest")
    assert calls == [(CELLS[2], "lns-seed1", True)]
    assert "command_resume" in json.loads((run / "checkpoint" / "step-00000004" / "config.json").read_text())
    def numbers(res):  # every column but the wall time (the resumed run's differs)
        return [[{k: v for k, v in row.items() if not k.startswith("wall_s")} for row in e["table"]] for e in res["cells"]]

    assert numbers(resumed) == numbers(result)  # bit-exact resume


def test_a_failing_cell_is_recorded_and_the_others_finish(tmp_path, monkeypatch):
    cfg = sweep_config({"weight_decay": [0.0, 0.1]}, schemes=("pre",), seeds=(0,))
    original = C.train

    def broken(model_cfg, train_cfg, run_dir, **kw):
        if train_cfg.weight_decay == 0.1:
            raise RuntimeError("the loss went to the moon\nsecond line")
        return original(model_cfg, train_cfg, run_dir, **kw)

    monkeypatch.setattr(C, "train", broken)
    with pytest.raises(DepthlabError, match=r"^1 of 2 cells failed \(weight_decay=0.1: RuntimeError: the loss went to "
                                            r"the moon\); the others are in .*report.html"):
        compare(cfg, tmp_path / "s", command="pytest")
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert "table" in summary["cells"][0] and summary["cells"][1]["error"] == "RuntimeError: the loss went to the moon"
    assert "failed: RuntimeError" in (tmp_path / "s" / "report.html").read_text()
    monkeypatch.setattr(C, "train", original)  # fixed: the same call trains the failed cell only
    said = []
    again = compare(cfg, tmp_path / "s", on_run=lambda scheme, seed, row: said.append((scheme, seed)))
    assert [("table" in e) for e in again["cells"]] == [True, True]
    assert said == [("weight_decay=0: pre", 0), ("weight_decay=0.1: pre", 0)]  # each line names its cell


def test_workers_across_cells_give_the_same_numbers(swept, tmp_path):
    """--jobs 2: the runs of different cells train side by side in worker processes: the same table."""
    out, result = swept
    cfg = dataclasses.replace(sweep_config({"weight_decay": [0.0, 0.1], "optimizer": ["muon"]}, ("pre",), (0,)), jobs=2)
    par = compare(cfg, tmp_path / "par")
    for entry in par["cells"]:
        ref = next(e for e in result["cells"] if e["cell"] == entry["cell"])
        assert entry["runs"][0]["eval_loss"] == pytest.approx(ref["runs"][0]["eval_loss"], rel=1e-6)


def test_a_plain_compare_and_a_sweep_do_not_share_a_directory(swept):
    out, _ = swept
    with pytest.raises(DepthlabError, match="holds a sweep"):
        compare(dataclasses.replace(sweep_config(), sweep={}), out)


def test_removal_not_measurable_in_the_deepest_third_is_left_out():
    report = {"angular": {"adjacent": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]},
              "removal": {"delta_loss": [0.5, 0.4, 0.3, 0.2, None, 0.1]}}
    summary = {"eval_loss": 3.0, "eval_ppl": 20.0, "layer_variance": [1.0], "tokens": 1, "wall_s": 1.0}
    row = C.run_row(SchemeSpec("pre"), 0, summary, report, {"layer_contribution": [1, 1, 1, 1, 0.2, 0.4]})
    assert row["deep_blocks"] == [5, 6] and row["deep_removal_drop"] == pytest.approx(0.1)
    assert row["deep_contribution"] == pytest.approx(0.3)
    report["removal"]["delta_loss"][-1] = None
    assert C.run_row(SchemeSpec("pre"), 0, summary, report)["deep_removal_drop"] is None


def test_sweep_parsing_from_flags_and_mappings():
    assert parse_sweep(["weight_decay=0,0.1", "seq_len=256,1e3", "optimizer=adamw, muon", "depth=4"]) == {
        "weight_decay": [0.0, 0.1], "seq_len": [256, 1000], "optimizer": ["adamw", "muon"], "depth": [4]}
    assert parse_sweep({"lr": [1e-3, "2e-3"]}) == {"lr": [1e-3, 2e-3]}
    cfg = sweep_config({"depth": [2, 3], "seq_len": [16]})
    cell = cfg.cells()[1]
    assert cell.label == "depth=3 seq_len=16" and cfg.cell_config(cell).model_overrides["n_layers"] == 3
    assert cfg.cell_config(cell).train.seq_len == 16 and cfg.cell_config(cell).sweep == {}


_TOY = ["--schemes", "pre,lns", "--set", "n_layers=2", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64",
        "--steps", "2", "--batch-size", "4", "--eval-tokens", "256", "--tokenizer", "bytes"]


@pytest.mark.parametrize("given, words", [
    (["--sweep", "momentum=0.9,0.95"], ["unknown sweep key 'momentum'", "weight_decay, seq_len, optimizer, lr, depth"]),
    (["--sweep", "weight_decay="], ["--sweep weight_decay: an empty value"]),
    (["--sweep", "weight_decay=0,,0.1"], ["--sweep weight_decay: an empty value"]),
    (["--sweep", "seq_len=16,16"], ["--sweep seq_len: value 16 listed twice"]),
    (["--sweep", "weight_decay=0,0.0"], ["--sweep weight_decay: value 0.0 listed twice"]),
    (["--sweep", "lr=1e-3", "--sweep", "lr=2e-3"], ["--sweep lr given twice"]),
    (["--sweep", "seq_len=short"], ["--sweep seq_len: 'short' is not an integer"]),
    (["--sweep", "weight_decay"], ["--sweep expects KEY=V1,V2"]),
    (["--sweep", "optimizer=adamw,sgd"], ["unknown optimizer 'sgd'", "muon"]),
    (["--sweep", "seq_len=16,4096"], ["seq_len=4096 exceeds"]),
    (["--sweep", "depth=2", "--set", "n_layers=3"], ["--set n_layers and --sweep depth both set n_layers"]),
    (["--sweep", "weight_decay=0,0.1", "--weight-decay", "0.1"], ["--weight-decay and --sweep weight_decay both"]),
    (["--config", "{dir}/bad_key.yaml"], ["unknown sweep key 'warmup'"]),
    (["--config", "{dir}/dupe.yaml"], ["--sweep optimizer: value muon listed twice"]),
    (["--config", "{dir}/empty.yaml"], ["--sweep seq_len: an empty value"]),
])
def test_bad_sweep_is_one_line_exit_2_before_training(tmp_path, given, words):
    (tmp_path / "bad_key.yaml").write_text("sweep:\n  warmup: [0.1, 0.2]\n")
    (tmp_path / "dupe.yaml").write_text("sweep: {optimizer: [muon, muon]}\n")
    (tmp_path / "empty.yaml").write_text("sweep:\n  seq_len: []\n")
    argv = [a.replace("{dir}", str(tmp_path)) for a in given]
    proc = subprocess.run([sys.executable, "-m", "depthlab", "compare", *_TOY, *argv, "--out", str(tmp_path / "o")],
                          capture_output=True, text=True)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("depthlab compare: error:") and all(w in lines[0] for w in words), lines[0]
    assert not (tmp_path / "o").exists()


def test_a_sweep_from_a_config_file_runs_the_grid(tmp_path):
    from depthlab.cli import build_parser
    from depthlab.cli._options import apply_config_file
    from depthlab.cli.compare import build_config

    (tmp_path / "grid.yaml").write_text("sweep:\n  weight_decay: [0, 0.1]\n  optimizer: [adamw, muon]\nschemes: pre,lns\n")
    args = build_parser().parse_args(["compare", "--config", str(tmp_path / "grid.yaml"), "--out", "x"])
    apply_config_file(args)
    assert build_config(args).sweep == SWEEP
