"""Run options defined once: CLI flags derived from the dataclasses, ``--config FILE``, and a light start-up."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from depthlab.analysis.diagnostics.options import DiagnoseOptions
from depthlab.cli import build_parser, main
from depthlab.cli._options import Section, field_docs
from depthlab.compare.config import CompareConfig
from depthlab.prune.options import HealOptions, PruneOptions
from depthlab.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--set", "n_layers=2", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64"]


def _subparser(name):
    return build_parser()._subparsers._group_actions[0].choices[name]


def _flags(parser):
    return {s for a in parser._actions for s in a.option_strings}


@pytest.mark.parametrize("command, cls, skip", [
    ("train", TrainConfig, set()),
    ("finetune", TrainConfig, {"tokenizer", "val_data", "text_field", "streaming"}),
    ("compare", TrainConfig, {"seed"}),
    ("diagnose", DiagnoseOptions, set()),
    ("prune", PruneOptions, {"heal"}),
])
def test_every_dataclass_field_is_a_flag_of_its_command(command, cls, skip):
    """A new field of an option dataclass reaches the command line with no edit there (no flag declared twice)."""
    import dataclasses

    flags = _flags(_subparser(command))
    section = Section("x", cls)
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in skip and section.flag(f.name) not in flags
               and f.name != "jacobian"]
    assert not missing, f"{command}: fields without a flag: {missing}"


def test_flag_help_is_the_field_comment_and_bools_get_a_negation():
    docs = field_docs(TrainConfig)
    assert docs["lr"][0] == "peak learning rate" and docs["seq_len"][1] == "data"
    p = _subparser("train")
    lr = next(a for a in p._actions if "--lr" in a.option_strings)
    assert lr.help.startswith("peak learning rate") and lr.default is None and lr.dest == "train.lr"
    assert {"--pack", "--no-pack", "--track-depth", "--no-track-depth"} <= _flags(p)
    heal = _flags(_subparser("prune"))
    assert {"--heal", "--heal-steps", "--heal-lr", "--heal-batch-size"} <= heal and "--heal-data" not in heal
    assert "--diag-tokens" in _flags(_subparser("compare")) and CompareConfig.__dataclass_fields__["jobs"]


def test_config_file_sets_options_command_line_overrides_and_unknown_keys_are_refused(tmp_path, capsys):
    from depthlab.cli._options import apply_config_file

    cfg = tmp_path / "run.yaml"
    cfg.write_text("steps: 7\nlr: '3e-3'\ntrain:\n  seq_len: 16\nheal: {steps: 2}\nout: runs/x\n")
    args = build_parser().parse_args(["prune", "smollm2", "--config", str(cfg)])
    with pytest.raises(Exception, match="unknown key 'train'.*valid keys: .*heal_steps"):
        apply_config_file(args)
    cfg.write_text("steps: 7\nlr: '3e-3'\ntrain:\n  seq_len: 16\nout: runs/x\nmodel: {n_layers: 3}\n")
    args = build_parser().parse_args(["train", "--config", str(cfg), "--steps", "9"])
    apply_config_file(args)
    assert getattr(args, "train.steps") == 9 and getattr(args, "train.lr") == 3e-3  # flag wins; '3e-3' parsed
    assert getattr(args, "train.seq_len") == 16 and args.out == "runs/x" and args.model_section == {"n_layers": 3}
    cfg.write_text("stepz: 7\n")
    assert main(["train", "--config", str(cfg), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown key 'stepz'" in err and "steps" in err and "\n" not in err and not (tmp_path / "r").exists()
    cfg.write_text("optimizer: sgd\n")
    assert main(["train", "--config", str(cfg), "--out", str(tmp_path / "r")]) == 2
    assert "'sgd'" in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_a_runs_config_json_is_a_valid_config_and_reproduces_its_losses_exactly(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    common = ["--tokenizer", "bytes", "--steps", "4", "--batch-size", "4", "--seq-len", "32", "--eval-tokens", "256",
              "--log-every", "1", "--lr", "3e-3", "--device", "cpu", "--no-plots", "-q"]
    assert main(["train", "--scheme", "lns", *TINY, *common, "--out", str(a)]) == 0
    assert main(["train", "--config", str(a / "config.json"), "--out", str(b), "--no-plots", "-q"]) == 0
    saved_a, saved_b = (json.loads((d / "config.json").read_text()) for d in (a, b))
    assert saved_a["model"] == saved_b["model"] and saved_a["train"] == saved_b["train"]
    losses = [[json.loads(ln)["loss"] for ln in (d / "metrics.jsonl").read_text().splitlines() if '"loss"' in ln]
              for d in (a, b)]
    assert len(losses[0]) == 4 and losses[0] == losses[1]


def test_help_and_argument_errors_import_no_torch():
    code = ("import sys\nfrom depthlab.cli import main\n"
            "for argv in (['--help'], ['train', '--help'], ['compare', '--help'], ['prune', '--help'],"
            " ['diagnose', '--help'], ['finetune', '--help'], ['train', '--lr', 'x'], ['--version']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "heavy = [m for m in ('torch', 'transformers', 'matplotlib', 'numpy') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_config_values_of_nested_options_reach_the_dataclasses(tmp_path):
    from depthlab.cli import prune as prune_cli
    from depthlab.cli._options import apply_config_file

    cfg = tmp_path / "prune.json"
    cfg.write_text(json.dumps({"prune": {"remove": 3, "method": "influence"}, "heal": {"steps": 5, "mode": "lora"}}))
    args = build_parser().parse_args(["prune", "smollm2", "--config", str(cfg), "--heal-steps", "6"])
    apply_config_file(args)
    assert PruneOptions(**prune_cli.PRUNE.given(args)).method == "influence"
    heal = HealOptions(**prune_cli.HEAL.given(args))
    assert (heal.steps, heal.mode) == (6, "lora")


def test_an_unknown_train_preset_is_refused_before_torch_is_imported():
    """Issue 49, cause 11: ``train --preset no-such-preset`` took 4-6 s (the check came after the heavy imports);
    it is now refused before torch is imported, as fast as a bad flag."""
    import os

    code = ("import sys\nfrom depthlab.cli import main\nrc = main(['train', '--preset', 'no-such-preset', '--out', 'x'])\n"
            "sys.exit(10 + rc if 'torch' in sys.modules else rc)")
    src = str(Path(__file__).resolve().parents[2] / "src")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": src})
    assert proc.returncode == 2, (proc.returncode, proc.stderr)  # 12: refused, but only after importing torch
    assert "unknown preset 'no-such-preset'" in proc.stderr
