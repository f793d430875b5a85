"""The GPU runbook's scripts (benchmarks/gpu/) in their dry-run mode (``--device cpu``, toy sizes), so the
runbook cannot rot: each runs end to end, writes what the device call would bring back (at most 8 files, the
device's limit) and records its results; and the corpus's trip through two calls (prepare.py splits it, call (a)
leaves a part on the machine, call (b) puts it back together, or trains on what it has)."""

from __future__ import annotations

import json
import shutil
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
    assert {"a.json", "a.log", "pytest.log", "throughput_130m.json", "throughput_1b.json"} <= set(files)
    collected = (tmp_path / "out" / "pytest.log").read_text()
    assert "test_sdpa_takes_flash_or_cudnn_for_the_causal_case" in collected  # the GPU tests are there
    assert "test_a_training_step_never_waits_for_the_gpu" in collected
    res = record["results"]
    table = res["throughput_130m"]
    assert set(table["variants"]) == {"pre", "pre+sync", "lns", "official"}  # the GPU variants, +bf16/+compile off
    assert all(v["tokens_per_s_median"] > 0 and v["of_matmul"] > 0 for v in table["variants"].values())
    assert table["device"] and "lns_over_pre" in table["paired_ratios"] and "pre_over_pre+sync" in table["paired_ratios"]
    assert set(res["throughput_1b"]["variants"]) == {"pre", "lns"}
    assert set(res["compile_s"]) == {"llama-130m pre", "llama-130m lns", "llama-130m pre+cudagraphs", "llama-1b pre",
                                     "llama-1b lns"}
    assert all(v > 0 for v in res["compile_s"].values())  # each background warm-up wrote its first step
    assert record["seconds"] < 250  # the hard deadline held


def test_b_dry_run_trains_both_schemes_with_depth_tracking_and_counts_epochs(tmp_path):
    record, files = dry_run("b_science_compare.py", tmp_path)
    assert set(files) == {"b.json", "b.log", "b-results.tar.gz"}
    res = record["results"]
    assert res["plan"]["steps"] == 3 and res["data"] == "builtin"
    assert {r["tokens"] for r in res["runs"].values()} == {192} and all(r["finished"] for r in res["runs"].values())
    assert res["corpus"]["train_tokens"] > 0 and res["corpus"]["epochs"] == pytest.approx(192 / res["corpus"]["train_tokens"])
    assert res["compare_summary"]["settings"]["schemes"] == ["pre", "lns"]
    # the regime's defaults (weight decay 0.1, AdamW; seq 1024 on the GPU, the toy's 32 here) reach every run
    assert res["plan"]["regime"] == {"weight_decay": 0.1, "seq_len": 32, "optimizer": "adamw"}
    trained = res["compare_summary"]["settings"]["train"]
    assert (trained["weight_decay"], trained["optimizer"]) == (0.1, "adamw")
    names = members(tmp_path / "out" / "b-results.tar.gz")
    assert "compare/summary.json" in names and not any("checkpoint" in n for n in names)
    for scheme in ("pre", "lns"):
        metrics = [n for n in names if n.startswith(f"compare/runs/{scheme}") and n.endswith("metrics.jsonl")]
        assert metrics, names


def test_b_takes_the_regime_as_flags_with_the_papers_batch_in_tokens(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))
    try:
        from b_science_compare import compare_cmd, parse_args
    finally:
        sys.path.pop(0)
    for argv, batch, micro in (([], 128, 16), (["--seq-len", "256"], 512, 64), (["--seq-len", "2048"], 64, 8)):
        args = parse_args([*argv, "--out", str(tmp_path)])
        assert (args.batch_size, args.micro_batch_size, args.batch_size * args.seq_len) == (batch, micro, 131_072)
    args = parse_args(["--optimizer", "muon", "--weight-decay", "0", "--out", str(tmp_path)])
    cmd = compare_cmd(args, {"preset": "llama-130m", "steps": 10, "seq_len": args.seq_len, "batch_size": args.batch_size,
                             "micro_batch_size": args.micro_batch_size}, tmp_path / "cmp")
    flags = dict(zip(cmd, cmd[1:]))
    assert (flags["--optimizer"], flags["--weight-decay"], flags["--seq-len"], flags["--batch-size"]) == \
        ("muon", "0.0", "1024", "128")


def test_c_dry_run_diagnoses_at_two_token_counts(tmp_path):
    record, files = dry_run("c_diagnose.py", tmp_path)
    assert set(files) == {"c.json", "c.log", "c-reports.tar.gz"}
    res = record["results"]
    for tokens in (256, 512):
        assert res[f"diagnose_{tokens}"]["rc"] == 0 and "blocks" in res[f"diagnose_{tokens}"]["summary"]
    assert sum(n.endswith("report.json") for n in members(tmp_path / "out" / "c-reports.tar.gz")) == 2


def test_c_takes_streamed_args_that_start_with_a_dash():
    """The README's `--streamed-args '--stream'` once stopped argparse ("ambiguous option")."""
    sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))
    try:
        from c_diagnose import glue_dash_values
    finally:
        sys.path.pop(0)
    argv = glue_dash_values(["--streamed-8b", "--streamed-args", "--stream --tokens 4096", "--device", "cpu"],
                            "--streamed-args")
    assert argv == ["--streamed-8b", "--streamed-args=--stream --tokens 4096", "--device", "cpu"]
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--streamed-8b", action="store_true")
    p.add_argument("--streamed-args", default="--stream")
    p.add_argument("--device")
    assert p.parse_args(argv).streamed_args == "--stream --tokens 4096"


def fake_shards(root: Path) -> Path:
    """A shard directory in open-english's layout: two training parts, one held-out part, a tokenizer folder."""
    import hashlib

    src = root / "shards"
    (src / "tokenizer").mkdir(parents=True)
    (src / "tokenizer" / "tokenizer.json").write_text("{}")
    parts = {"train": [], "val": []}
    for split, name, n in (("train", "train-00000.bin", 6), ("train", "train-00001.bin", 4), ("val", "val-00000.bin", 2)):
        data = bytes(range(2 * n))
        (src / name).write_bytes(data)
        parts[split].append({"file": name, "tokens": n, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    (src / "shards.json").write_text(json.dumps({"dtype": "uint16", "train_tokens": 10, "parts": parts}))
    return src


def test_the_corpus_travels_in_two_calls_and_is_put_back_together(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))
    try:
        from b_science_compare import assemble_corpus
        from prepare import split_corpus
    finally:
        sys.path.pop(0)
    gpu, stash = tmp_path / ".gpu", tmp_path / "stash"
    split_corpus(fake_shards(tmp_path), gpu)
    assert sorted(p.name for p in (gpu / "a" / "corpus").iterdir()) == ["train-00001.bin"]
    assert sorted(p.name for p in (gpu / "b" / "corpus").iterdir()) == ["shards.json", "tokenizer", "train-00000.bin",
                                                                         "val-00000.bin"]
    # the machine was given back between the calls: part 0 alone
    alone = assemble_corpus(gpu / "b" / "corpus", stash, tmp_path / "c1")
    assert alone["train_tokens"] == 6 and alone["missing"] == ["train-00001.bin"]
    assert json.loads((tmp_path / "c1" / "shards.json").read_text())["parts"]["train"][0]["file"] == "train-00000.bin"
    # call (a) left part 1 in the stash: the whole corpus; a damaged copy there counts as missing
    stash.mkdir()
    shutil.copy2(gpu / "a" / "corpus" / "train-00001.bin", stash / "train-00001.bin")
    whole = assemble_corpus(gpu / "b" / "corpus", stash, tmp_path / "c2")
    assert whole["train_tokens"] == 10 and whole["missing"] == []
    assert (tmp_path / "c2" / "train-00001.bin").read_bytes() == bytes(range(8))
    (stash / "train-00001.bin").write_bytes(b"\0" * 8)
    assert assemble_corpus(gpu / "b" / "corpus", stash, tmp_path / "c2")["missing"] == ["train-00001.bin"]
