"""--dtype means one thing on every command (compute precision) and --weights another (weight dtype), with one
choice set; the old spelling keeps its result for one release, with a one-line note; evaluate and theory take
--config; every command records its command line the same way."""

from __future__ import annotations

import argparse
import json
import logging
import shlex

import pytest
from tiny_models import hf_dir

from depthlab.cli import build_parser, main

MEASURE = ["--tokens", "64", "--seq-len", "32", "--batch-size", "2", "--no-jacobian", "--no-joint-check", "--no-progress"]


@pytest.fixture(autouse=True)
def _fresh_logging(one_thread):
    """main() binds the root logger to the stderr of the test that calls it; drop that handler afterwards."""
    yield
    root = logging.getLogger()
    for handler in list(root.handlers):
        if type(handler) is logging.StreamHandler:
            root.removeHandler(handler)


def _flags(command: str) -> dict[str, argparse.Action]:
    sub = build_parser()._subparsers._group_actions[0].choices[command]
    return {s: a for a in sub._actions for s in a.option_strings}


@pytest.mark.parametrize("command", ["train", "finetune", "compare", "demo", "diagnose", "evaluate", "prune", "export"])
def test_every_command_gives_dtype_and_weights_one_meaning_and_one_choice_set(command):
    flags = _flags(command)
    dtype, weights = flags["--dtype"], flags["--weights"]
    assert dtype.help.startswith("compute precision"), dtype.help
    assert weights.help.startswith("weight dtype"), weights.help
    assert tuple(weights.choices) == ("auto", "fp32", "bf16")
    # export computes nothing: its --dtype is only the old spelling of --weights, fp16 included, for one release
    assert tuple(dtype.choices) == (("auto", "fp32", "bf16", "fp16") if command == "export" else ("auto", "fp32", "bf16"))


def test_commands_without_a_model_to_run_take_neither():
    for command in ("theory", "tokenize"):
        assert "--dtype" not in _flags(command) and "--weights" not in _flags(command)


def test_the_old_spelling_keeps_its_result_with_a_one_line_note(tmp_path, capsys):
    path = hf_dir(tmp_path, "llama", 2)
    capsys.readouterr()  # transformers' own lines while the model is written
    reports = {}
    for name, spelling in (("old", ["--dtype", "bf16"]), ("new", ["--weights", "bf16"])):
        out = tmp_path / name
        assert main(["diagnose", str(path), *spelling, "--out", str(out), *MEASURE]) == 0
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        if name == "old":
            assert len(err) == 1 and err[0].startswith("depthlab diagnose: note: --dtype bf16 without --weights")
            assert "write --weights bf16" in err[0]
        else:
            assert err == []
        reports[name] = json.loads((out / "report.json").read_text())
    old, new = reports["old"], reports["new"]
    assert old["model"]["dtype"] == new["model"]["dtype"] == "bfloat16"
    assert "upcast" in old["model"]["compute_dtype"] == new["model"]["compute_dtype"]  # compute: automatic (fp32 here)
    assert old["angular"] == new["angular"] and old["removal"] == new["removal"] and old["variance"] == new["variance"]


def test_bf16_compute_on_a_cpu_is_bf16_arithmetic_and_fp32_weights_cannot_have_it(tmp_path, capsys):
    path = hf_dir(tmp_path, "llama", 2)
    assert main(["diagnose", str(path), "--weights", "bf16", "--dtype", "bf16", "--out", str(tmp_path / "b"),
                 *MEASURE]) == 0
    rep = json.loads((tmp_path / "b" / "report.json").read_text())
    assert rep["model"]["dtype"] == "bfloat16" and "compute_dtype" not in rep["model"]  # no upcast: bf16 arithmetic
    capsys.readouterr()
    assert main(["diagnose", str(path), "--weights", "fp32", "--dtype", "bf16", "--out", str(tmp_path / "c"),
                 *MEASURE]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "give --weights bf16" in err and not (tmp_path / "c").exists()


def test_export_reads_the_old_dtype_as_weights_and_refuses_both(tmp_path, capsys):
    import depthlab as d
    from depthlab.train import TrainConfig, train

    run = tmp_path / "run"
    train(d.from_preset("tiny", n_layers=2, d_model=32, n_heads=4, d_ff=64, scheme="lns"),
          TrainConfig(data="builtin", tokenizer="bytes", steps=1, batch_size=2, seq_len=16, eval_every=0, eval_tokens=64,
                      variance_every=0, ckpt_every=0, device="cpu"), run, quiet=True)
    from safetensors import safe_open

    assert main(["export", str(run), "--hf", str(tmp_path / "fp16"), "--dtype", "fp16"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "write --weights fp16" in err[0]
    with safe_open(str(tmp_path / "fp16" / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F16"}
    argv = ["export", str(run), "--hf", str(tmp_path / "auto")]
    assert main(argv) == 0  # auto: the run's own weights, fp32
    with safe_open(str(tmp_path / "auto" / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}
    marker = json.loads((tmp_path / "auto" / "config.json").read_text())["depthlab"]
    assert marker["exported_by"] == "depthlab " + shlex.join(argv)  # its command line, as every command records it
    capsys.readouterr()
    assert main(["export", str(run), "--hf", str(tmp_path / "x"), "--weights", "bf16", "--dtype", "bf16"]) == 2
    assert "export computes nothing" in capsys.readouterr().err


def test_evaluate_takes_a_config_file_and_records_its_command_line(tmp_path, capsys):
    path = hf_dir(tmp_path, "llama", 2)
    config = tmp_path / "eval.yaml"
    config.write_text("evaluate: {tasks: builtin-mc, limit: 3}\nbatch_size: 2\nprogress: false\n")
    argv = ["evaluate", str(path), "--config", str(config), "--out", str(tmp_path / "ev")]
    assert main(argv) == 0
    result = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert result["limit"] == 3 and result["batch_size"] == 2 and result["results"]["builtin-mc"]["n"] == 3
    assert result["command"] == "depthlab " + shlex.join(argv)


def test_theory_takes_a_config_file_by_flag_or_section(tmp_path, capsys):
    config = tmp_path / "theory.yaml"
    config.write_text("depth: 40\nrecursion: {c: 2.0}\nempirical: {depth: 4, seeds: [0]}\nwidth: 16\nheads: 2\n"
                      "seq_len: 8\n")
    argv = ["theory", "--config", str(config), "--out", str(tmp_path / "th")]
    assert main(argv) == 0
    result = json.loads((tmp_path / "th" / "theory.json").read_text())
    assert result["recursion"]["depth"] == 40 and result["recursion"]["params"]["c"] == 2.0
    setup = result["empirical"]["setup"]
    assert (setup["depth"], setup["d_model"], setup["n_heads"], setup["seeds"]) == (4, 16, 2, [0])
    assert result["provenance"]["command"] == "depthlab " + shlex.join(argv)
    assert main(["theory", "--config", str(config), "--no-empirical", "--depth", "30", "--out", str(tmp_path / "t2")]) == 0
    again = json.loads((tmp_path / "t2" / "theory.json").read_text())
    assert again["empirical"] is None and again["recursion"]["depth"] == 30  # the command line over the file


def test_tokenize_records_its_command_line(tmp_path, capsys):
    argv = ["tokenize", "--data", "builtin", "--tokenizer", "bytes", "--out", str(tmp_path / "shards")]
    assert main(argv) == 0
    assert json.loads((tmp_path / "shards" / "shards.json").read_text())["command"] == "depthlab " + shlex.join(argv)


def test_prune_records_its_command_line_as_every_command_does(tmp_path, capsys):
    path = hf_dir(tmp_path, "llama", 3)
    argv = ["prune", str(path), "--remove", "1", "--method", "angular-block", "--out", str(tmp_path / "p"),
            "--tokens", "64", "--seq-len", "32", "--batch-size", "2", "--latency-tokens", "2", "--no-progress"]
    assert main(argv) == 0
    assert json.loads((tmp_path / "p" / "prune.json").read_text())["command"] == "depthlab " + shlex.join(argv)
