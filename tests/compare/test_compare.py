"""depthlab compare / demo: files, numbers traceable to each run, identical data, resume, bad input."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

import depthlab.compare.experiment as C
from depthlab.analysis.diagnostics import DiagnoseOptions
from depthlab.compare import CompareConfig, compare
from depthlab.models.decoder import DecoderLM
from depthlab.train import TrainConfig


def small_config(schemes=("pre", "lns"), seeds=(0,)):
    train = TrainConfig(data="builtin", tokenizer="bytes", steps=6, seq_len=32, batch_size=4, lr=3e-3,
                        eval_tokens=512, eval_every=3, variance_every=2, ckpt_every=3, device="cpu")
    diag = DiagnoseOptions(tokens=512, seq_len=32, batch_size=4, jacobian=True, jac_samples=2, jac_context=8,
                           joint_check=False, progress=False)
    return CompareConfig(schemes=list(schemes), preset="tiny", seeds=list(seeds), train=train, diagnose=diag,
                         model_overrides={"n_layers": 3, "d_model": 32, "n_heads": 2, "d_ff": 64})


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("cmp")
    seen: dict[str, list[torch.Tensor]] = {}
    original = DecoderLM.forward

    def spy(self, input_ids, *args, **kwargs):  # every batch each scheme's model sees, in order
        seen.setdefault(self.cfg.scheme, []).append(input_ids.detach().clone())
        return original(self, input_ids, *args, **kwargs)

    DecoderLM.forward = spy
    try:
        result = compare(small_config(), out, command="pytest")
    finally:
        DecoderLM.forward = original
    return out, result, seen


def test_compare_writes_every_file(finished):
    out, result, _ = finished
    for name in ["compare.json", "summary.json", "summary.md", "report.html", "loss_curves.png",
                 "variance_by_depth.png", "variance_over_training.png", "angular_heatmaps.png", "removal_drops.png"]:
        assert (out / name).is_file(), name
    for scheme in ("pre", "lns"):
        run = out / "runs" / f"{scheme}-seed0"
        for name in ["config.json", "metrics.jsonl", "summary.json", "diagnostics/report.json", "diagnostics/report.html"]:
            assert (run / name).is_file(), f"{scheme}: {name}"
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 5 and "pytest" in html


def test_table_numbers_are_those_of_each_run(finished):
    out, result, _ = finished
    table = {row["scheme"]: row for row in result["table"]}
    assert set(table) == {"pre", "lns"}
    for scheme, row in table.items():
        run = out / "runs" / f"{scheme}-seed0"
        summary = json.loads((run / "summary.json").read_text())
        report = json.loads((run / "diagnostics" / "report.json").read_text())
        assert row["eval_loss"] == summary["eval_loss"] and row["eval_ppl"] == summary["eval_ppl"]
        assert row["last_layer_variance"] == summary["layer_variance"][-1]
        L = len(report["angular"]["adjacent"])
        assert L == 3 and C.deepest_third(L) == [3]
        assert row["deep_angular"] == pytest.approx(report["angular"]["adjacent"][2])
        assert row["deep_removal_drop"] == pytest.approx(report["removal"]["delta_loss"][2])
        assert row["deep_swap_drop"] == pytest.approx(report["swap"]["delta_loss"][1])  # block 3 swapped with block 2
        assert row["effective_depth"] == report["effective_depth"]["n"]
        assert row["effective_share"] == pytest.approx(report["effective_depth"]["n"] / 3)
    assert table["pre"]["delta_ppl_vs_pre"] == 0
    assert table["lns"]["delta_ppl_vs_pre"] == pytest.approx(table["lns"]["eval_ppl"] - table["pre"]["eval_ppl"])
    md = (out / "summary.md").read_text()
    assert f"{table['lns']['eval_ppl']:.2f}" in md and "| lns |" in md


def test_every_scheme_sees_the_same_batches_in_the_same_order(finished):
    _, _, seen = finished
    pre, lns = seen["pre"], seen["lns"]
    assert len(pre) == len(lns) > 6  # train steps + evals + variance probes (+ diagnostics)
    for a, b in zip(pre, lns):
        assert torch.equal(a, b)


def test_resume_skips_finished_runs(finished, tmp_path, monkeypatch, caplog):
    out, result, _ = finished
    import logging
    import shutil

    caplog.set_level(logging.INFO, logger="depthlab")

    resumed = tmp_path / "cmp"
    shutil.copytree(out, resumed)
    shutil.rmtree(resumed / "runs" / "lns-seed0")  # as if interrupted before lns ran
    (resumed / "summary.json").unlink()
    calls = []
    original = C.train
    monkeypatch.setattr(C, "train", lambda model_cfg, *a, **k: calls.append(model_cfg.scheme) or original(model_cfg, *a, **k))
    again = compare(small_config(), resumed, command="pytest")
    assert calls == ["lns"]
    said = [r.getMessage() for r in caplog.records]
    assert "compare: started (2 runs, 1 done before)" in said
    assert any(l.startswith("compare: done, 1 run (to 2/2) in") for l in said)
    assert any(l.startswith("pre-seed0: trained by an earlier compare, reusing") for l in said)
    assert not any("lns-seed0: trained by an earlier" in l for l in said)  # the run it has just trained
    assert any(l.startswith("training lns-seed0: step 3/6 (50%)") for l in said)
    pre_row = next(r for r in again["table"] if r["scheme"] == "pre")
    assert pre_row["eval_loss"] == next(r for r in result["table"] if r["scheme"] == "pre")["eval_loss"]
    lns_row = next(r for r in again["table"] if r["scheme"] == "lns")
    assert lns_row["eval_loss"] == pytest.approx(next(r for r in result["table"] if r["scheme"] == "lns")["eval_loss"])


def test_adding_a_seed_trains_only_the_new_runs(finished, tmp_path, monkeypatch):
    out, result, _ = finished
    import shutil

    grown = tmp_path / "cmp"
    shutil.copytree(out, grown)
    calls = []
    original = C.train
    monkeypatch.setattr(C, "train", lambda model_cfg, *a, **k: calls.append(model_cfg.scheme) or original(model_cfg, *a, **k))
    cfg = small_config()
    cfg.seeds = [0, 1]
    again = compare(cfg, grown, command="pytest")
    assert sorted(calls) == ["lns", "pre"]  # seed 1 of each scheme; seed 0 reused
    assert (grown / "runs" / "pre-seed1" / "diagnostics" / "report.json").is_file()
    by_seed = {(r["scheme"], r["seed"]): r for r in again["runs"]}
    for row in result["runs"]:
        assert by_seed[(row["scheme"], 0)]["eval_loss"] == row["eval_loss"]
    pre = next(r for r in again["table"] if r["scheme"] == "pre")
    assert pre["seeds"] == [0, 1] and pre["eval_loss"] == pytest.approx(
        (by_seed[("pre", 0)]["eval_loss"] + by_seed[("pre", 1)]["eval_loss"]) / 2)
    assert json.loads((grown / "compare.json").read_text())["settings"]["seeds"] == [0, 1]


def test_a_scheme_variant_is_parsed_once_and_compare_json_keeps_its_labels(finished, tmp_path, monkeypatch):
    """CompareConfig parses each variant when it is made; a compare that reuses every run parses none again."""
    import shutil

    import depthlab.models.configure as configure
    import depthlab.models.schemes as schemes
    from depthlab.models.schemes import SchemeSpec

    calls = []
    original = schemes.parse_scheme_spec

    def counting(text):
        calls.append(text)
        return original(text)

    monkeypatch.setattr(schemes, "parse_scheme_spec", counting)
    monkeypatch.setattr(configure, "parse_scheme_spec", counting)
    cfg = small_config(("pre", "lns:position=after-norm"))  # a default option: the plain lns variant
    assert calls == ["pre", "lns:position=after-norm"] and cfg.schemes == [SchemeSpec("pre"), SchemeSpec("lns")]
    assert cfg.to_dict()["schemes"] == ["pre", "lns"] and cfg.to_dict()["train"]["weights"] == "fp32"
    out, result, _ = finished
    reused = tmp_path / "cmp"
    shutil.copytree(out, reused)
    calls.clear()
    monkeypatch.setattr(C, "train", lambda *a, **k: pytest.fail("a finished run was trained again"))
    again = compare(cfg, reused)
    assert calls == []  # nothing downstream parses a scheme string again
    assert [r["eval_loss"] for r in again["runs"]] == [r["eval_loss"] for r in result["runs"]]


def test_an_older_compare_json_still_resumes(finished, tmp_path, monkeypatch):
    """compare.json as older releases wrote it: each variant as typed (an alias, a default option), and the train
    settings without the automatic weights: the runs are found and reused."""
    import shutil

    out, result, _ = finished
    old = tmp_path / "old"
    shutil.copytree(out, old)
    saved = json.loads((old / "compare.json").read_text())
    saved["settings"]["schemes"] = ["pre", "lns:lns_position=after-norm"]
    saved["settings"]["train"]["weights"] = "fp32"
    (old / "compare.json").write_text(json.dumps(saved))
    monkeypatch.setattr(C, "train", lambda *a, **k: pytest.fail("a finished run was trained again"))
    again = compare(small_config(("pre", "lns:lns_position=after-norm")), old)
    assert [r["scheme"] for r in again["table"]] == ["pre", "lns"]
    assert [r["eval_loss"] for r in again["runs"]] == [r["eval_loss"] for r in result["runs"]]


def test_other_settings_in_the_same_directory_are_refused(finished):
    out, _, _ = finished
    cfg = small_config()
    cfg.train = cfg.train.replace(steps=7)
    with pytest.raises(ValueError, match=r"other settings \(train\.steps: \d+ -> 7\)"):
        compare(cfg, out)


def test_a_setting_added_since_at_its_automatic_default_does_not_block_resume():
    saved = {"train": {"steps": 5}, "diagnose": {"tokens": 64}}
    assert C._changed_settings(saved, {"train": {"steps": 5, "compile": None}, "diagnose": {"tokens": 64}}) == []
    assert C._changed_settings(saved, {"train": {"steps": 5, "compile": True}, "diagnose": {"tokens": 64}}) == [
        "train.compile: '<absent>' -> True"]


def test_a_compare_saved_before_a_setting_existed_resumes_when_the_setting_is_at_its_default():
    """A compare saved before diagnose gained ``tower`` / ``images`` (defaults 'language', 64) resumes; the same
    setting given another value than its default is a change, named."""
    cfg = small_config()
    now = json.loads(json.dumps(cfg.to_dict()))
    saved = json.loads(json.dumps(now))
    for key in ("tower", "images"):
        saved["diagnose"].pop(key)
    defaults = C.field_defaults(cfg)
    assert (defaults["diagnose"]["tower"], defaults["diagnose"]["images"]) == ("language", 64)
    assert C._changed_settings(saved, now, defaults) == []
    now["diagnose"]["images"] = 8
    assert C._changed_settings(saved, now, defaults) == ["diagnose.images: '<absent>' -> 8"]


def test_aggregate_reports_mean_and_spread_over_seeds():
    rows = [{"scheme": s, "seed": k, "eval_loss": l, "eval_ppl": p, "last_layer_variance": 1.0, "deep_angular": 0.1,
             "tokens": 10, "wall_s": 1.0}
            for s, k, l, p in [("pre", 0, 3.0, 20.0), ("pre", 1, 3.2, 24.0), ("lns", 0, 2.9, 18.0), ("lns", 1, 3.0, 20.0)]]
    table = {r["scheme"]: r for r in C.aggregate(rows, ["pre", "lns"])}
    assert table["lns"]["eval_ppl"] == pytest.approx(19.0)
    assert table["lns"]["eval_ppl_std"] == pytest.approx(2 ** 0.5)
    assert table["lns"]["delta_ppl_vs_pre"] == pytest.approx(-3.0)  # mean of per-seed deltas -2 and -4
    assert "±" in C.markdown_table(C.aggregate(rows, ["pre", "lns"]))


@pytest.mark.parametrize("args, words", [
    (["--schemes", "pre,nope"], ["'nope'", "choose one of"]),
    (["--schemes", "pre,lns,pre"], ["listed twice", "pre"]),
    (["--schemes", "pre,lns", "--steps", "0"], ["steps", "0"]),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, args, words):
    proc = subprocess.run([sys.executable, "-m", "depthlab", "compare", *args, "--out", str(tmp_path / "o")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    for w in words:
        assert w in lines[0]
    assert not (tmp_path / "o").exists()


def test_runs_side_by_side_give_the_same_numbers(finished, tmp_path, caplog, capfd):
    """jobs=2 trains the runs in parallel worker processes (one thread each): same table. Each worker's training
    progress reaches the shared (non-terminal) stderr as lines; the compare logs a line per finished run."""
    import logging

    caplog.set_level(logging.INFO, logger="depthlab")
    _, result, _ = finished
    parallel = compare(dataclasses.replace(small_config(), jobs=2), tmp_path / "par")
    workers = capfd.readouterr().err.splitlines()
    for run in ("pre-seed0", "lns-seed0"):
        assert any(l.startswith(f"training {run}: step 3/6 (50%), loss") and "ETA" in l for l in workers), run
        assert any(l.startswith(f"{run}: diagnosed in") for l in workers), run
    said = [r.getMessage() for r in caplog.records]
    assert any(l.startswith("compare: run 1/2 (50%), finished ") and "ETA" in l for l in said)
    assert not any("trained by an earlier compare" in l for l in said)
    for a, b in zip(result["runs"], parallel["runs"]):
        assert a["scheme"] == b["scheme"] and a["eval_loss"] == pytest.approx(b["eval_loss"], rel=1e-6)
        assert a["deep_angular"] == pytest.approx(b["deep_angular"], rel=1e-5)
    assert (tmp_path / "par" / "tracking_curves.png").stat().st_size > 0
    assert "Depth over training" in (tmp_path / "par" / "summary.md").read_text()


def test_each_run_is_diagnosed_on_the_device_it_trained_on(finished, tmp_path, monkeypatch):
    """--device reaches the diagnosis too (it used to run on the CPU whatever the runs trained on): through
    resolve_device, as every command's --device does."""
    out, _, _ = finished
    import shutil

    resumed = tmp_path / "cmp"
    shutil.copytree(out, resumed)
    shutil.rmtree(resumed / "runs" / "lns-seed0" / "diagnostics")  # trained, not yet diagnosed
    asked, loaded = [], []
    real_resolve, real_load = C.resolve_device, C.load_target
    monkeypatch.setattr(C, "resolve_device", lambda spec=None, rank=None: asked.append(spec) or real_resolve(spec, rank))
    monkeypatch.setattr(C, "load_target", lambda name, device="cpu", **k: loaded.append(device) or real_load(name, device, **k))
    compare(small_config(), resumed, command="pytest")
    assert asked == ["cpu"] and loaded == [torch.device("cpu")]


@pytest.mark.parametrize("argv, diag_data", [
    (["--data", "my.txt"], "my.txt"),  # diagnosed on the text the runs trained on (its held-out split)
    (["--data", "my.txt", "--diag-data", "builtin"], "builtin"),  # unless told otherwise
    ([], "builtin"),
])
def test_a_compare_is_diagnosed_on_its_training_data_unless_told_otherwise(argv, diag_data):
    """The diagnosis used to read the built-in Bible whatever --data the runs trained on: a compare on the
    open-english corpus was diagnosed on 34k Bible tokens. Flags, the library's default and ViT presets agree."""
    from depthlab.cli import build_parser
    from depthlab.cli.compare import build_config

    args = build_parser().parse_args(["compare", "--schemes", "pre,lns", "--out", "x", *argv])
    cfg = build_config(args)
    assert cfg.diagnose.data == diag_data and cfg.diagnose.tokens == 16384
    lib = CompareConfig(schemes=["pre"], train=TrainConfig(data="my.txt"))
    assert lib.diagnose.data == "my.txt" and lib.diagnose.tokens == 16384 and not lib.diagnose.progress
    vit = CompareConfig(schemes=["pre"], preset="vit-tiny", train=TrainConfig(data="digits"))
    assert vit.diagnose.data == DiagnoseOptions().data  # ViT runs diagnose on their own held-out images
