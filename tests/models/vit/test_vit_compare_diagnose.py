"""Scheme variants (``name:key=value``) in compare, a ViT compare on digits, and diagnose on a ViT run."""

import json

import pytest

from depthlab.base.errors import DepthlabError
from depthlab.cli import main
from depthlab.compare import CompareConfig, run_dirname, run_name
from depthlab.models.schemes import parse_scheme_spec

needs_sklearn = pytest.mark.skipif(__import__("importlib.util").util.find_spec("sklearn") is None,
                                   reason="the digits need scikit-learn")
TINY_SET = ["--set", "n_layers=3", "--set", "d_model=16", "--set", "n_heads=2", "--set", "d_ff=32"]


def test_scheme_spec_parses_labels_and_safe_names():
    spec = parse_scheme_spec("lns:position=after-branch")
    assert (spec.name, spec.options) == ("lns", {"position": "after-branch"})
    assert (spec.label, spec.dirname) == ("lns:position=after-branch", "lns-position-after-branch")
    assert parse_scheme_spec("lns:lns_position=after-norm").label == "lns"  # alias; a default is the plain scheme
    assert parse_scheme_spec("mix:alpha=0.5").options == {"alpha": 0.5}
    assert run_name(spec, 0) == "lns:position=after-branch-seed0"  # compare's names come from the parsed spec
    assert run_dirname(spec, 1) == "lns-position-after-branch-seed1"
    for bad, words in (("lns:bogus=1", ["'bogus'", "position"]), ("lns:position=middle", ["'middle'", "after-branch"]),
                       ("pre:x=1", ["'x'", "none"]), ("nope", ["unknown scheme"]), ("lns:position", ["key=value"])):
        with pytest.raises(DepthlabError) as err:
            parse_scheme_spec(bad)
        assert all(w in str(err.value) for w in words) and "\n" not in str(err.value)


def test_lm_position_ablation_validates_and_duplicates_use_the_full_spec():
    cfg = CompareConfig(schemes=["lns", "lns:position=after-branch", "lns:position=before-norm"], preset="tiny")
    cfg.validate()
    assert cfg.model_config("lns:position=before-norm").scheme_options == {"position": "before-norm"}
    with pytest.raises(DepthlabError, match="twice"):
        CompareConfig(schemes=["lns", "lns:position=after-norm"], preset="tiny").validate()


def test_cli_compare_rejects_bad_variants_in_one_line_writing_nothing(tmp_path, capsys):
    for spec in ("lns:bogus=1", "pre,lns:position=middle"):
        out = tmp_path / "cmp"
        assert main(["compare", "--preset", "vit-tiny", "--schemes", spec, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "scheme variant" in err and not out.exists()


@needs_sklearn
def test_vit_compare_names_variants_and_diagnose_reports_removal(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", "--preset", "vit-tiny", "--data", "digits", "--schemes", "pre,lns:position=after-branch",
                 "--steps", "2", "--batch-size", "16", "--diag-tokens", "340", "--no-jacobian", *TINY_SET,
                 "--out", str(out)]) == 0
    table = (out / "summary.md").read_text()
    assert "| lns:position=after-branch |" in table and "top-1 accuracy" in table and "Δ acc vs pre" in table
    assert "perplexity" not in table.split("\n\n")[2]
    summary = json.loads((out / "summary.json").read_text())
    assert [r["scheme"] for r in summary["table"]] == ["pre", "lns:position=after-branch"]
    assert summary["run_dirs"]["lns:position=after-branch-seed0"] == "runs/lns-position-after-branch-seed0"
    assert summary["table"][0]["delta_acc_vs_pre"] == 0.0 and "eval_ppl" not in summary["table"][1]
    assert "lns:position=after-branch" in (out / "report.html").read_text()
    assert (out / "variance_by_depth.png").stat().st_size > 0
    run = out / "runs" / "lns-position-after-branch-seed0"
    report = json.loads((run / "diagnostics" / "report.json").read_text())
    assert report["model"]["kind"] == "depthlab-vit" and len(report["angular"]["adjacent"]) == 3
    assert len(report["removal"]["delta_accuracy"]) == 3 and len(report["variance"]["variance"]) == 4
    rep = tmp_path / "rep"
    assert main(["diagnose", str(run), "--tokens", "340", "--no-jacobian", "--out", str(rep)]) == 0
    diag = json.loads((rep / "report.json").read_text())
    assert "removal" in diag and diag["loss"]["accuracy"] == diag["removal"]["base_accuracy"] and "ppl" not in diag["loss"]
    page = (rep / "report.html").read_text()
    assert "loss / top-1 accuracy" in page and "loss / ppl" not in page  # a classifier has no perplexity
