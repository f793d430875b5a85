"""Issue 33, cases 6 and 10: a ``--config`` value goes through what its flag goes through: its type (YAML's quoted
``"false"`` is false, JSON's ``1e3`` an integer), then the same range checks (tests/cli/test_bad_inputs.py)."""

from __future__ import annotations

import json

import pytest

from depthlab.base.errors import DepthlabError
from depthlab.cli import build_parser
from depthlab.cli._options import apply_config_file


def _args(tmp_path, data: dict, argv: list[str] | None = None, command: str = "train"):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    args = build_parser().parse_args([command, "--config", str(path), *(argv or [])])
    apply_config_file(args)
    return args


@pytest.mark.parametrize("word,value", [("false", False), ("no", False), ("Off", False), ("true", True),
                                        ("yes", True), (False, False)])
def test_boolean_keys_read_yaml_words_as_they_say(tmp_path, word, value):
    assert _args(tmp_path, {"no_plots": word, "quiet": word}).no_plots is value
    assert _args(tmp_path, {"quiet": word}).quiet is value


def test_numbers_take_the_flags_types(tmp_path):
    args = _args(tmp_path, {"steps": 1e3, "lr": 1, "seed": "7"})
    assert args.__dict__["train.steps"] == 1000 and isinstance(args.__dict__["train.steps"], int)
    assert args.__dict__["train.lr"] == 1.0 and args.__dict__["train.seed"] == 7
    assert _args(tmp_path, {"steps": 5}, ["--steps", "9"]).__dict__["train.steps"] == 9  # the command line wins


@pytest.mark.parametrize("data,needle", [
    ({"steps": 2.5}, "steps must be an integer, got 2.5"),
    ({"steps": "ten"}, "steps='ten'"),
    ({"steps": True}, "steps must be an integer, got True"),
    ({"lr": [1]}, "lr must be a number, got [1]"),
    ({"data": {"a": 1}}, "data must be a string"),
    ({"no_plots": 1.5}, "no_plots must be true or false"),
    ({"optimizer": "sgd"}, "choose one of"),
])
def test_a_value_of_the_wrong_type_names_the_file_and_the_key(tmp_path, data, needle):
    with pytest.raises(DepthlabError) as err:
        _args(tmp_path, data)
    text = str(err.value)
    assert needle in text and "c.json" in text and "\n" not in text


def test_list_flags_take_lists_strings_and_single_integers(tmp_path):
    assert _args(tmp_path, {"seeds": [0, 1]}, command="compare").__dict__["compare.seeds"] == [0, 1]
    assert _args(tmp_path, {"seeds": "0,1"}, command="compare").__dict__["compare.seeds"] == [0, 1]
    assert _args(tmp_path, {"seeds": 3}, command="compare").__dict__["compare.seeds"] == [3]
    with pytest.raises(DepthlabError, match="seeds must be a list of integers"):
        _args(tmp_path, {"seeds": ["a"]}, command="compare")


def test_a_toml_config_is_read_as_toml(tmp_path):
    """Issue 49, also seen: a ``.toml`` --config was read as YAML and refused as "got str"; it is read as TOML, with
    its sections, and a broken one is named as TOML."""
    path = tmp_path / "c.toml"
    path.write_text('steps = 12\nlr = 0.5\n[model]\nn_layers = 3\n')
    args = build_parser().parse_args(["train", "--config", str(path)])
    apply_config_file(args)
    assert args.__dict__["train.steps"] == 12 and args.__dict__["train.lr"] == 0.5
    assert args.model_section == {"n_layers": 3}
    path.write_text("steps = = 1\n")
    args = build_parser().parse_args(["train", "--config", str(path)])
    with pytest.raises(DepthlabError, match=r"c.toml' is not valid TOML"):
        apply_config_file(args)
