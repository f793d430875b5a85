"""Bad input to every command: exit 2, one stderr line naming the bad value, no traceback, nothing
created or changed. In-process through ``depthlab.cli.main`` (fast); a few through a real interpreter."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from depthlab import from_preset
from depthlab.cli import main
from depthlab.fileio import sha256_file
from depthlab.train import TrainConfig, train

SRC = str(Path(__file__).resolve().parents[2] / "src")
TINY = ["--set", "n_layers=2", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64", "--tokenizer", "bytes",
        "--seq-len", "16", "--batch-size", "4", "--eval-tokens", "128", "--steps", "2", "--device", "cpu", "-q"]


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """A workspace: a trained tiny run, a copy whose weights do not match its config, and bad files."""
    ws = tmp_path_factory.mktemp("ws")
    data = ws / "corpus.jsonl"
    data.write_text("\n".join(json.dumps({"text": f"Line {i} of a small corpus, words and words. " * 6})
                              for i in range(80)) + "\n")
    model = from_preset("tiny", n_layers=2, d_model=32, n_heads=2, d_ff=64, max_seq_len=64)
    train(model, TrainConfig(data=str(data), tokenizer="bytes", steps=2, seq_len=16, batch_size=4, eval_tokens=128,
                             device="cpu"), ws / "run", quiet=True)
    shutil.copytree(ws / "run", ws / "mismatch")
    for ckpt in (ws / "mismatch" / "checkpoint").iterdir():
        config = json.loads((ckpt / "config.json").read_text())
        config["model"]["d_model"] = 64  # the config now disagrees with the weights (checksums kept consistent)
        (ckpt / "config.json").write_text(json.dumps(config))
        state = json.loads((ckpt / "trainer_state.json").read_text())
        state["files"]["config.json"] = (ckpt / "config.json").stat().st_size
        state["sha256"]["config.json"] = sha256_file(ckpt / "config.json")
        (ckpt / "trainer_state.json").write_text(json.dumps(state))
    (ws / "a_file").write_text("I am a file\n")
    (ws / "empty.txt").write_text("\n\n")
    (ws / "latin1.jsonl").write_bytes(b'{"question": "caf\xe9?", "choices": ["a", "b"], "answer": 0}\n')
    (ws / "garbage.parquet").write_bytes(b"this is not parquet at all" * 10)
    (ws / "full").mkdir()
    (ws / "full" / "x").write_text("x")
    return ws


def snapshot(root: Path) -> dict:
    """Every path under root with its size and mtime (.lock: the PID of its last holder, not run content)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
            if p.name != ".lock"}


#: (id, argv with {ws} for the workspace, a string the error line must contain)
CASES = [
    # ---- train
    ("train-device", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--device", "tpu9", "--out", "{ws}/new"], "tpu9"),
    ("train-lr-huge", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--lr", "1e39", "--out", "{ws}/new"], "1e+39"),
    ("train-lr-nan", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--lr", "nan", "--out", "{ws}/new"], "nan"),
    ("train-lr-negative", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--lr", "-1", "--out", "{ws}/new"], "-1"),
    ("train-init-std-nan", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--set", "init_std=nan",
                            "--out", "{ws}/new"],
     "init_std"),
    ("train-unknown-field", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--set", "n_layerz=2", "--out", "{ws}/new"],
     "n_layerz"),
    ("train-seq-len", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--seq-len", "100000", "--out", "{ws}/new"],
     "100000"),
    ("train-missing-data", ["train", *TINY, "--data", "{ws}/nope.jsonl", "--out", "{ws}/new"], "nope.jsonl"),
    ("train-garbage-parquet", ["train", *TINY, "--data", "{ws}/garbage.parquet", "--out", "{ws}/new"],
     "garbage.parquet"),
    ("train-empty-data", ["train", *TINY, "--data", "{ws}/empty.txt", "--out", "{ws}/new"], "empty.txt"),
    ("train-out-is-file", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--out", "{ws}/a_file"], "a_file"),
    ("train-out-under-file", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--out", "{ws}/a_file/run"], "a_file"),
    ("train-out-existing", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--out", "{ws}/run"], "run"),
    ("train-tokenizer", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--tokenizer", "sentencepiece:9",
                         "--out", "{ws}/new"], "sentencepiece:9"),
    ("train-micro-batch", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--micro-batch-size", "3",
                           "--out", "{ws}/new"], "micro_batch_size=3"),
    ("train-steps-zero", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--steps", "0", "--out", "{ws}/new"], "steps"),
    ("train-resume-not-run", ["train", "--resume", "{ws}/full"], "full"),
    ("train-init-from-missing", ["train", "--init-from", "{ws}/nope", "--out", "{ws}/new"], "nope"),
    ("train-init-from-not-a-model", ["train", "--init-from", "{ws}/full", "--out", "{ws}/new"], "full"),
    ("train-init-from-and-preset", ["train", "--init-from", "{ws}/run", "--preset", "tiny", "--out", "{ws}/new"],
     "--preset"),
    ("train-init-from-and-resume", ["train", "--init-from", "{ws}/run", "--resume", "{ws}/run"], "--init-from"),
    ("train-resume-scheme", ["train", "--resume", "{ws}/run", "--scheme", "lns"], "scheme"),
    ("train-resume-lr", ["train", "--resume", "{ws}/run", "--lr", "0.5"], "lr=0.5"),
    ("train-resume-allow-steps", ["train", "--resume", "{ws}/run", "--steps", "9", "--allow-changed", "steps"],
     "steps"),
    ("train-allow-without-resume", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--allow-changed", "lr",
                                    "--out", "{ws}/new"], "allow-changed"),
    # ---- diagnose
    ("diagnose-seq-len-run", ["diagnose", "{ws}/run", "--seq-len", "4096", "--out", "{ws}/new"], "4096"),
    ("diagnose-seq-len-preset", ["diagnose", "preset:tiny", "--seq-len", "100000", "--out", "{ws}/new"], "100000"),
    ("diagnose-out-is-file", ["diagnose", "{ws}/run", "--out", "{ws}/a_file"], "a_file"),
    ("diagnose-mc-latin1", ["diagnose", "{ws}/run", "--mc", "{ws}/latin1.jsonl", "--tokens", "64", "--device", "cpu",
                            "--out", "{ws}/new"], "latin1.jsonl"),
    ("diagnose-mc-missing", ["diagnose", "{ws}/run", "--mc", "{ws}/nope.jsonl", "--out", "{ws}/new"], "nope.jsonl"),
    ("diagnose-missing-target", ["diagnose", "{ws}/no-such-run", "--out", "{ws}/new"], "no-such-run"),
    ("diagnose-device", ["diagnose", "{ws}/run", "--device", "tpu9", "--out", "{ws}/new"], "tpu9"),
    ("diagnose-tokens", ["diagnose", "{ws}/run", "--tokens", "0", "--out", "{ws}/new"], "--tokens"),
    ("diagnose-mismatch", ["diagnose", "{ws}/mismatch", "--device", "cpu", "--out", "{ws}/new"], "mismatch"),
    # ---- export
    ("export-hf-is-file", ["export", "{ws}/run", "--hf", "{ws}/a_file"], "a_file"),
    ("export-hf-under-file", ["export", "{ws}/run", "--hf", "{ws}/a_file/hf"], "a_file"),
    ("export-hf-not-empty", ["export", "{ws}/run", "--hf", "{ws}/full"], "full"),
    ("export-missing-run", ["export", "{ws}/no-such-run", "--hf", "{ws}/new"], "no-such-run"),
    ("export-mismatch", ["export", "{ws}/mismatch", "--hf", "{ws}/new"], "mismatch"),
    # ---- tokenize
    ("tokenize-empty", ["tokenize", "--data", "{ws}/empty.txt", "--tokenizer", "bytes", "--out", "{ws}/new"],
     "empty.txt"),
    ("tokenize-missing", ["tokenize", "--data", "{ws}/nope.txt", "--tokenizer", "bytes", "--out", "{ws}/new"],
     "nope.txt"),
    ("tokenize-tokenizer", ["tokenize", "--data", "{ws}/corpus.jsonl", "--tokenizer", "sentencepiece:9",
                            "--out", "{ws}/new"], "sentencepiece:9"),
    ("tokenize-out-is-file", ["tokenize", "--data", "{ws}/corpus.jsonl", "--tokenizer", "bytes",
                              "--out", "{ws}/a_file"], "a_file"),
    ("tokenize-garbage-parquet", ["tokenize", "--data", "{ws}/garbage.parquet", "--tokenizer", "bytes",
                                  "--out", "{ws}/new"], "garbage.parquet"),
    # ---- theory
    ("theory-out-is-file", ["theory", "--no-empirical", "--out", "{ws}/a_file"], "a_file"),
    ("theory-out-under-file", ["theory", "--no-empirical", "--out", "{ws}/a_file/t"], "a_file"),
    ("theory-depth", ["theory", "--depth", "1", "--no-empirical", "--out", "{ws}/new"], "depth"),
    ("theory-seeds", ["theory", "--seeds", "a,b", "--empirical-depth", "4", "--out", "{ws}/new"], "a,b"),
    # ---- compare
    ("compare-unknown-scheme", ["compare", "--schemes", "pre,foo", "--out", "{ws}/new"], "foo"),
    ("compare-twice", ["compare", "--schemes", "pre,pre", "--out", "{ws}/new"], "pre"),
    ("compare-seeds", ["compare", "--schemes", "pre", "--seeds", "x", "--out", "{ws}/new"], "x"),
    ("compare-out-is-file", ["compare", "--schemes", "pre", "--out", "{ws}/a_file"], "a_file"),
    ("compare-set-scheme", ["compare", "--schemes", "pre", "--set", "scheme=lns", "--out", "{ws}/new"], "scheme"),
    ("compare-preset", ["compare", "--schemes", "pre", "--preset", "llama-1z", "--out", "{ws}/new"], "llama-1z"),
    # ---- prune
    ("prune-out-is-file", ["prune", "{ws}/run", "--remove", "1", "--out", "{ws}/a_file"], "a_file"),
    ("prune-missing-target", ["prune", "{ws}/no-such-run", "--remove", "1", "--out", "{ws}/new"], "no-such-run"),
    ("prune-too-many", ["prune", "{ws}/run", "--remove", "5", "--device", "cpu", "--out", "{ws}/new"], "5"),
    ("prune-block-range", ["prune", "{ws}/run", "--blocks", "9", "--device", "cpu", "--out", "{ws}/new"], "9"),
    ("prune-mismatch", ["prune", "{ws}/mismatch", "--remove", "1", "--device", "cpu", "--out", "{ws}/new"],
     "mismatch"),
    # ---- finetune
    ("finetune-missing-source", ["finetune", "{ws}/no-such-run", "--data", "builtin-sft", "--out", "{ws}/new"],
     "no-such-run"),
    ("finetune-not-a-model", ["finetune", "{ws}/full", "--data", "builtin-sft", "--out", "{ws}/new"], "full"),
    ("finetune-bad-data", ["finetune", "{ws}/run", "--data", "{ws}/corpus.jsonl", "--device", "cpu",
                           "--out", "{ws}/new"], "corpus.jsonl"),
    ("finetune-out-is-file", ["finetune", "{ws}/run", "--data", "builtin-sft", "--out", "{ws}/a_file"], "a_file"),
    ("finetune-out-existing", ["finetune", "{ws}/run", "--data", "builtin-sft", "--out", "{ws}/run"], "run"),
    # ---- evaluate
    ("evaluate-missing-task", ["evaluate", "{ws}/run", "--tasks", "{ws}/nope.jsonl", "--out", "{ws}/new"],
     "nope.jsonl"),
    ("evaluate-out-is-file", ["evaluate", "{ws}/run", "--tasks", "builtin-mc", "--out", "{ws}/a_file"], "a_file"),
    ("evaluate-missing-target", ["evaluate", "{ws}/no-such-run", "--tasks", "builtin-mc", "--out", "{ws}/new"],
     "no-such-run"),
    ("evaluate-batch-size", ["evaluate", "{ws}/run", "--tasks", "builtin-mc", "--batch-size", "0",
                             "--out", "{ws}/new"], "batch-size"),
]


def _argv(argv, ws):
    return [a.replace("{ws}", str(ws)) for a in argv]


@pytest.mark.parametrize("argv,needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(ws, argv, needle, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("DEPTHLAB_CACHE", str(tmp_path / "cache"))  # outside the workspace
    monkeypatch.chdir(ws)  # a default output directory would show up in the snapshot
    torch.set_num_threads(1)
    before = snapshot(ws)
    try:
        code = main(_argv(argv, ws))
    except SystemExit as exit_:  # argparse refuses a value itself (one line, exit 2)
        code = exit_.code
    captured = capsys.readouterr()
    lines = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert code == 2, captured.err
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"depthlab {argv[0]}: error:"), lines
    assert needle in lines[0], lines[0]
    assert "Traceback" not in captured.err + captured.out
    assert snapshot(ws) == before


def test_there_are_enough_cases_for_every_command():
    from depthlab.cli import build_parser

    commands = set(build_parser()._subparsers._group_actions[0].choices) - {"demo"}  # demo = compare with defaults
    assert len(CASES) >= 40
    assert commands <= {c[1][0] for c in CASES}, commands - {c[1][0] for c in CASES}


@pytest.mark.parametrize("case", ["train-device", "export-mismatch", "diagnose-out-is-file"])
def test_bad_input_in_a_real_interpreter(ws, case):
    argv, needle = next(c[1:] for c in CASES if c[0] == case)
    before = snapshot(ws)
    proc = subprocess.run([sys.executable, "-m", "depthlab", *_argv(argv, ws)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": SRC}, cwd=ws)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr
    assert snapshot(ws) == before
