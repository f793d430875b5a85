"""The GPU runbook's three scripts (benchmarks/gpu/) in their dry-run mode (``--device cpu``, toy sizes), so the
runbook cannot rot: each runs end to end, writes what the device call would bring back (at most 8 files, the
device's limit) and records its results."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def dry_run(script: str, tmp_path: Path) -> tuple[dict, list[str]]:
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, f"benchmarks/gpu/{script}", "--device", "cpu", "--out", str(out),
                           "--carry", str(tmp_path / "no-carry")], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all(p.is_file() for p in out.iterdir())  # what the device returns from $OUT
    record = json.loads((out / f"{script[0]}.json").read_text())
    assert record["steps"] and all(s["rc"] == 0 for s in record["steps"])
    assert {"torch", "device_name", "git_commit"} <= set(record)
    return record, files


def members(path: Path) -> list[str]:
    with tarfile.open(path) as tar:
        return tar.getnames()


def test_a_dry_run_collects_gpu_tests_and_measures_every_variant(tmp_path):
    record, files = dry_run("a_setup_tests_throughput.py", tmp_path)
    assert {"a.json", "a.log", "pytest.log", "throughput_seq32.json"} <= set(files)
    collected = (tmp_path / "out" / "pytest.log").read_text()
    assert "test_sdpa_takes_flash_or_cudnn_for_the_causal_case" in collected  # the GPU tests are there
    table = record["results"]["throughput_seq32"]
    assert set(table["variants"]) == {"pre", "lns", "hf", "official"}
    assert all(v["tokens_per_s_median"] > 0 and v["of_matmul"] > 0 for v in table["variants"].values())
    assert table["device"] and "official_over_hf" in table["paired_ratios"] and "lns_over_pre" in table["paired_ratios"]


def test_b_dry_run_trains_both_schemes_with_depth_tracking_and_counts_epochs(tmp_path):
    record, files = dry_run("b_science_compare.py", tmp_path)
    assert set(files) == {"b.json", "b.log", "b-results.tar.gz"}
    res = record["results"]
    assert res["plan"]["steps"] == 3 and res["data"] == "builtin"
    assert res["corpus"]["train_tokens"] > 0 and res["corpus"]["epochs"] == pytest.approx(192 / res["corpus"]["train_tokens"])
    assert res["compare_summary"]["settings"]["schemes"] == ["pre", "lns"]
    names = members(tmp_path / "out" / "b-results.tar.gz")
    assert "compare/summary.json" in names and not any("checkpoint" in n for n in names)
    for scheme in ("pre", "lns"):
        metrics = [n for n in names if n.startswith(f"compare/runs/{scheme}") and n.endswith("metrics.jsonl")]
        assert metrics, names


def test_c_dry_run_diagnoses_at_two_token_counts(tmp_path):
    record, files = dry_run("c_diagnose.py", tmp_path)
    assert set(files) == {"c.json", "c.log", "c-reports.tar.gz"}
    res = record["results"]
    for tokens in (256, 512):
        assert res[f"diagnose_{tokens}"]["rc"] == 0 and "blocks" in res[f"diagnose_{tokens}"]["summary"]
    assert sum(n.endswith("report.json") for n in members(tmp_path / "out" / "c-reports.tar.gz")) == 2
