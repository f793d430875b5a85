"""Refusals from config.json alone (:mod:`depthlab.hf.preflight`) and the committed class structure they read
(:mod:`depthlab.hf.structure`): each line equals the one the slow path (the class built on the meta device) says, at a
depth the table was not built at; the command line says it before torch or transformers is imported; the committed
table is what the installed transformers builds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from depthlab.base.errors import DepthlabError, first_line
from depthlab.hf import preflight, structure, structure_build
from depthlab.hf.families import refusal_before_load


def _model_dir(root, model_type: str, depth: int = 5, drop: tuple[str, ...] = (), **fields):
    """A config.json of ``model_type`` shrunk to ``depth`` blocks (not one of the table's depths), without the fields
    ``drop``, and a 1 GiB placeholder weights file that any read would trip on (its header is zeros)."""
    from transformers import AutoConfig

    from depthlab.hf.shrink import tiny_overrides

    default = AutoConfig.for_model(model_type)
    config = type(default).from_dict({**default.to_dict(), **tiny_overrides(default, depth), **fields})
    path = root / model_type
    config.save_pretrained(path)
    if drop:
        raw = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({k: v for k, v in raw.items() if k not in drop}))
    with open(path / "model.safetensors", "wb") as f:
        f.truncate(1 << 30)
    return path


#: (model type, config.json fields, {(capability, stream): whether the table alone must refuse}).
CASES = [
    ("xlm", {}, {("diagnose", False): True, ("diagnose", True): True, ("prune", None): True}),
    ("hrm_text", {}, {("diagnose", False): True, ("prune", None): True}),
    ("bert", {"architectures": ["BertModel"]}, {("diagnose", False): False, ("diagnose", True): True,
                                                 ("prune", None): True}),
    ("bert", {"architectures": ["BertLMHeadModel"], "is_decoder": True}, {("prune", None): False}),
    ("bert", {"architectures": ["BertLMHeadModel"], "drop": ("is_decoder",)}, {("prune", None): True}),  # class default
    ("cpmant", {}, {("diagnose", False): False, ("prune", None): False}),  # no is_decoder field at all: no encoder
    ("bart", {}, {("prune", None): True}),
    ("olmo", {}, {("diagnose", False): False, ("diagnose", True): False, ("prune", None): False}),
]


def _slow(path, capability: str, stream: bool | None) -> str | None:
    """The command's own later check, with the table switched off: the class built on the meta device."""
    from depthlab.targets.load import plan_target

    try:
        if capability == "prune":
            return refusal_before_load(path, "prune")
        plan_target(str(path), stream=stream)
    except DepthlabError as err:
        return first_line(err)
    return None


@pytest.mark.parametrize(("model_type", "fields", "asks"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_a_refusal_from_the_table_is_the_line_the_class_built_on_the_meta_device_gives(model_type, fields, asks,
                                                                                     tmp_path, monkeypatch):
    path = _model_dir(tmp_path, model_type, **fields)
    if structure.structure_of("xlm") is None:
        monkeypatch.setattr(structure, "structure_of", lambda t, version=None: structure_build.build_entry(t))
    fast = {ask: preflight.refusal(path, ask[0], stream=ask[1]) for ask in asks}
    monkeypatch.setattr(structure, "structure_of", lambda *a, **k: None)  # the slow path: nothing from the table
    for (capability, stream), decided in asks.items():
        line = fast[capability, stream]
        assert (line is not None) == decided, (capability, stream, line)
        if line is not None:
            assert _slow(path, capability, stream) == line, (capability, stream)


def test_the_committed_table_is_what_the_installed_transformers_builds():
    """A sample of entries rebuilt now (the refused ones, encoders, plain decoders, a shallow default): equal."""
    version = structure.transformers_version()
    path = structure.TABLES / structure.table_name(str(version))
    if not path.is_file():
        pytest.skip(f"no committed table for transformers {version}: python -m depthlab.hf.structure_build writes one")
    committed = json.loads(path.read_text())["model_types"]
    for model_type in ("xlm", "hrm_text", "xlstm", "bert", "electra", "olmo", "opt", "bloom", "falcon", "mpt"):
        assert committed.get(model_type) == structure_build.build_entry(model_type), model_type
    assert not {"llama", "qwen3", "gemma3", "t5"} & set(committed)  # table rows, wrappers, encoder-decoders: none


ARGVS = [
    (["diagnose", "{xlm}", "--no-stream"], "cannot find the layer list of XLMWithLMHeadModel"),
    (["diagnose", "{xlm}", "--stream"], "cannot find the layer list of XLMWithLMHeadModel"),
    (["evaluate", "{xlm}", "--tasks", "builtin-mc", "--out", "{o}"], "cannot find the layer list of XLMWithLMHeadModel"),
    (["prune", "{xlm}", "--remove", "1", "--out", "{o}"], "cannot prune xlm .*ModuleLists"),
    (["finetune", "{xlm}", "--data", "builtin-sft", "--out", "{o}"], "unsupported HF model_type 'xlm'"),
    (["export", "{xlm}", "--hf", "{o}"], "is a Hugging Face model directory .*not a depthlab run"),
    (["prune", "{bert}", "--remove", "1", "--out", "{o}"], "cannot prune bert .*an encoder"),
    (["diagnose", "{bert}", "--stream"], "--stream: cannot stream .*an encoder"),
    (["prune", "{llava}", "--remove", "1", "--out", "{o}"], "LLaVA .*no text_config"),
    (["evaluate", "{llava}", "--tasks", "builtin-mc", "--out", "{o}"], "LLaVA .*no text_config"),
]
DRIVER = ("import sys; from depthlab.cli import main; code = main(sys.argv[1:]); "
          "print('exit', code, 'torch' in sys.modules, 'transformers' in sys.modules)")


def test_every_refusal_from_config_json_comes_before_torch_or_transformers_is_imported(tmp_path):
    """diagnose (both engines), evaluate, prune, finetune and export of models they cannot read (XLM: no block list to
    tell; a BERT encoder asked to prune or stream) refuse in one line, exit 2, in a process that never imports
    torch or transformers: no weight read, nothing built (the 1 GiB placeholder weights are never opened); so does an
    image-text wrapper without a text decoder."""
    paths = {"xlm": _model_dir(tmp_path, "xlm"), "bert": _model_dir(tmp_path, "bert", architectures=["BertModel"]),
             "llava": tmp_path / "llava"}
    paths["llava"].mkdir()  # an image-text wrapper without a text decoder
    (paths["llava"] / "config.json").write_text(json.dumps({"model_type": "llava", "vision_config": {}}))
    src = str(Path(preflight.__file__).resolve().parents[2])  # the tree under test, whatever pip installed
    env = {**os.environ, "DEPTHLAB_CACHE": str(tmp_path / "cache"), "PYTHONPATH": src}
    if structure.structure_of("xlm") is None:  # a transformers with no committed table: the user's, built as documented
        table = tmp_path / "cache" / "structure" / structure.table_name(str(structure.transformers_version()))
        table.parent.mkdir(parents=True)
        table.write_text(json.dumps({"model_types": structure_build.build_table(["xlm", "bert"], progress=False)}))
    for argv, why in ARGVS:
        out = tmp_path / "out"
        args = [a.format(o=out, **paths) for a in argv]
        done = subprocess.run([sys.executable, "-c", DRIVER, *args], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=120)
        err = done.stderr.strip()
        assert done.stdout.strip() == "exit 2 False False", (argv, done.stdout, err)
        assert len(err.splitlines()) == 1 and re.search(why, err), (argv, err)
        assert not out.exists()
