"""One run loader (depthlab.targets.runs.open_run) for both engines: the same checkpoint chosen (a damaged newest one
passed over), the same refusal of weights of another scheme, the same report of the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from depthlab.base.errors import DepthlabError
from depthlab.base.fileio import sha256_file
from depthlab.targets import load_target
from depthlab.targets.runs import load_run_checkpoint, open_run
from depthlab.targets.stream.open import locate


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny LNS run with two checkpoints (steps 2 and 4)."""
    import depthlab as d
    from depthlab.train import TrainConfig, train

    out = tmp_path_factory.mktemp("runs") / "lns"
    cfg = d.from_preset("tiny", n_layers=3, d_model=32, n_heads=4, d_ff=64, scheme="lns")
    train(cfg, TrainConfig(data="builtin", tokenizer="bytes", steps=4, batch_size=4, seq_len=32, eval_every=0,
                           eval_tokens=256, variance_every=0, ckpt_every=2, keep_last=2, device="cpu"), out, quiet=True)
    return out


def _copy(run: Path, tmp_path: Path) -> Path:
    import shutil

    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


def test_both_engines_open_the_same_checkpoint_and_say_the_same_of_the_model(run):
    opened = open_run(run, weights=False)
    assert opened.weights is None and opened.path.name == "step-00000004"  # the newest, its tensors not read
    in_memory, streamed = load_target(str(run)), load_target(str(run), stream=True)
    assert streamed.info == {k: v for k, v in in_memory.info.items() if k != "compute_dtype"}
    assert streamed.path == load_run_checkpoint(run)[3] == opened.path
    assert streamed.tokenizer.encode("In the beginning") == in_memory.tokenizer.encode("In the beginning")


def test_a_damaged_newest_checkpoint_is_passed_over_by_both_engines(run, tmp_path, caplog):
    run = _copy(run, tmp_path)
    newest = run / "checkpoint" / "step-00000004" / "model.safetensors"
    data = bytearray(newest.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes: only the checksum tells
    newest.write_bytes(bytes(data))
    found = locate(str(run))
    assert found.path.name == "step-00000002" and "step-00000004 is damaged" in caplog.text
    assert load_run_checkpoint(run)[3] == found.path
    assert load_target(str(run), stream=True).path == found.path


def test_weights_of_another_scheme_are_refused_by_both_engines_in_the_same_words(run, tmp_path):
    run = _copy(run, tmp_path)
    for ckpt in (run / "checkpoint").iterdir():  # the config says pre, the weights were trained as lns
        cfg = json.loads((ckpt / "config.json").read_text())
        cfg["model"]["scheme"] = "pre"
        (ckpt / "config.json").write_text(json.dumps(cfg))
        state = json.loads((ckpt / "trainer_state.json").read_text())
        state["files"]["config.json"] = (ckpt / "config.json").stat().st_size
        state["sha256"]["config.json"] = sha256_file(ckpt / "config.json")
        (ckpt / "trainer_state.json").write_text(json.dumps(state))
    messages = []
    for stream in (False, True):
        with pytest.raises(DepthlabError, match="holds weights of scheme 'lns', but its config says 'pre'") as err:
            load_target(str(run), stream=stream)
        messages.append(str(err.value))
    assert messages[1].endswith(messages[0])  # streamed: "--stream: cannot stream RUN: " + the same sentence
