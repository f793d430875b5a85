"""config.json checked the same way for every family and both engines (``depthlab.hf.config_checks``), before anything
is built: issue 49's Gemma 4 sharing keys and values in every layer (cause 7), DeepSeek-V4 with more ``layer_types``
than layers (cause 13), a layer count of 1e9 (under GPT-2's own name too), and transformers' own validation put in
depthlab's sentence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from depthlab.base.errors import DepthlabError
from depthlab.cli import main
from depthlab.hf.config_checks import check_model_dir
from depthlab.hf.tiny import save_tiny
from depthlab.targets.load import load_target

CASES = {
    # cause 7: transformers accepts it, then the in-memory passes end on KeyError: 'sliding_attention'
    "gemma4-kv-every-layer": ("gemma4_text", {"num_kv_shared_layers": 4},
                              r"num_kv_shared_layers=4 with num_hidden_layers=4: .*give at most 3"),
    # cause 13: Gemma 2/3/4 and Qwen3-Next refuse it, DeepSeek-V4 was diagnosed
    "deepseek-v4-six-layer-types": ("deepseek_v4", {"layer_types": ["sliding_attention"] * 6},
                                    r"layer_types holds 6 entries for 4 layers; give one per layer"),
    # a config that grew in memory for minutes
    "layers-1e9": ("llama", {"num_hidden_layers": 1e9}, r"num_hidden_layers=1e\+09 is not a size depthlab builds"),
    "gpt2-n-layer-1e9": ("gpt2", {"n_layer": 10 ** 9}, r"n_layer=1000000000 is not a size depthlab builds"),
    # transformers' strict validation, in depthlab's sentence (not a raw StrictDataclassClassValidationError)
    "hidden-not-multiple-of-heads": ("llama", {"hidden_size": 30, "num_attention_heads": 4},
                                     r"is not a valid config: The hidden size \(30\) is not a multiple"),
}


def _dir(tmp_path: Path, model_type: str, edit: dict) -> Path:
    path = save_tiny(model_type, tmp_path / model_type)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, **edit}))
    return path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("configs")
    return {name: _dir(root / name, model_type, edit) for name, (model_type, edit, _) in CASES.items()}


@pytest.mark.parametrize("case", CASES)
def test_a_bad_config_is_refused_by_the_check_naming_the_file_and_field(dirs, case):
    with pytest.raises(DepthlabError, match=CASES[case][2]) as err:
        check_model_dir(dirs[case])
    assert str(dirs[case] / "config.json") in str(err.value)


@pytest.mark.parametrize("case", ["gemma4-kv-every-layer", "deepseek-v4-six-layer-types", "layers-1e9"])
@pytest.mark.parametrize("stream", [False, True])
def test_either_engine_refuses_before_building_the_model(dirs, case, stream, monkeypatch):
    """The load of either engine refuses at its plan: no model is built (transformers' loader is never called)."""
    import transformers

    def never(*args, **kwargs):
        raise AssertionError("a model was built before the refusal")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", never)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", never)
    with pytest.raises(DepthlabError, match=CASES[case][2]):
        load_target(str(dirs[case]), stream=stream)


def test_the_cli_refuses_gemma4_kv_sharing_every_layer_in_one_line_and_writes_nothing(dirs, tmp_path, capsys):
    out = tmp_path / "report"
    capsys.readouterr()
    assert main(["diagnose", str(dirs["gemma4-kv-every-layer"]), "--device", "cpu", "--out", str(out)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "num_kv_shared_layers=4" in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "gemma4_text", "deepseek_v4", "qwen3_next", "mixtral"])
def test_the_registry_tiny_models_pass_the_check(tmp_path, model_type):
    """No false refusal of a valid config."""
    check_model_dir(save_tiny(model_type, tmp_path / model_type))


# ---------------------------------------------------------------------------------------------- the towers' fields
#: The attack re-run on the wrappers and the inferred layouts (docs/reliability.md): config fields that point at
#: blocks or tokens beyond the model. Qwen3-VL's deepstack index beyond its vision tower was measured and pruned with
#: a deepstack feature silently dropped; LLaVA's vision_feature_layer and image token ended on a raw IndexError /
#: ValueError after the load.
TOWER_CASES = {
    "qwen3vl-deepstack-beyond": ("qwen3_vl", {"vision_config": {"deepstack_visual_indexes": [0, 5]}},
                                 r"vision_config\.deepstack_visual_indexes=\[0, 5\] names block\(s\) \[5\], but the "
                                 r"vision tower has 3 blocks; give indices in 0\.\.2"),
    "llava-feature-layer-beyond": ("llava", {"vision_feature_layer": 7},
                                   r"vision_feature_layer=7 names no state of the vision tower's 3 blocks \(give -4\.\.3\)"),
    "llava-image-token-beyond": ("llava", {"image_token_index": 5000},
                                 r"image_token_index=5000 is not a token of the text vocabulary \(text_config\.vocab_size"
                                 r"=300\); give an id in 0\.\.299"),
    "gemma3-image-token-negative": ("gemma3", {"image_token_index": -1},
                                    r"image_token_index=-1 is not a token .*give a non-negative id"),
    "qwen3moe-mlp-only-beyond": ("qwen3_moe", {"mlp_only_layers": [1, 4]},
                                 r"mlp_only_layers=\[1, 4\] names block\(s\) \[4\], but the model has 4 blocks"),
}


def _config_dir(tmp_path: Path, model_type: str, edit: dict) -> Path:
    """config.json alone (the check reads nothing else) of the tiny model of ``model_type``, ``edit`` merged into it
    (one level deep)."""
    from depthlab.hf.tiny import tiny_config, tiny_wrapper_config
    from depthlab.hf.wrappers import WRAPPERS

    config = tiny_wrapper_config(model_type)[0] if model_type in WRAPPERS else tiny_config(model_type)
    config.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    for key, value in edit.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) else value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


@pytest.mark.parametrize("case", TOWER_CASES)
def test_a_field_pointing_past_a_tower_is_refused_naming_it(tmp_path, case):
    model_type, edit, needle = TOWER_CASES[case]
    with pytest.raises(DepthlabError, match=needle):
        check_model_dir(_config_dir(tmp_path, model_type, edit))


def test_every_wrappers_tiny_config_passes_the_tower_check(tmp_path):
    """No false refusal: every wrapper's config (both towers' index lists, vision_feature_layer, image tokens)."""
    from depthlab.hf.wrappers import WRAPPERS

    for model_type in WRAPPERS:
        check_model_dir(_config_dir(tmp_path / model_type, model_type, {}))
    check_model_dir(_config_dir(tmp_path / "oov", "gemma3", {"image_token_index": 400}))  # padded by its forward


def _no_wrapper_built(monkeypatch) -> None:
    """Building an image-text model fails the test: a refusal must come first."""
    import transformers

    def never(*args, **kwargs):
        raise AssertionError("a model was built before the refusal")

    monkeypatch.setattr(transformers.AutoModelForImageTextToText, "from_config", never)
    monkeypatch.setattr(transformers.AutoModelForImageTextToText, "from_pretrained", never)


def test_a_streamed_vision_diagnose_with_deepstack_beyond_the_tower_writes_nothing(tmp_path, capsys, monkeypatch):
    """The attack's silent wrong result: a report was written. Now one line, exit 2, before a model is built."""

    from depthlab.hf.tiny import save_tiny_wrapper

    path = save_tiny_wrapper("qwen3_vl", tmp_path / "qwen3_vl")
    cfg = json.loads((path / "config.json").read_text())
    cfg["vision_config"]["deepstack_visual_indexes"] = [0, 5]
    (path / "config.json").write_text(json.dumps(cfg))

    _no_wrapper_built(monkeypatch)
    out = tmp_path / "report"
    capsys.readouterr()
    assert main(["diagnose", str(path), "--tower", "vision", "--stream", "--device", "cpu", "--out", str(out)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "deepstack_visual_indexes=[0, 5]" in err[0], err
    assert not out.exists() and not list(tmp_path.glob(".report*"))


def test_a_config_with_two_text_configs_is_refused_in_one_line(tmp_path):
    """MusicGen holds a text encoder and a decoder: transformers' get_text_config raises a ValueError for it, which
    reached the user as a raw error; now one line naming the file."""
    from transformers import AutoConfig

    AutoConfig.for_model("musicgen").save_pretrained(tmp_path)
    with pytest.raises(DepthlabError, match=r"config\.json.*one text decoder.*Multiple valid text configs"):
        check_model_dir(tmp_path)


@pytest.mark.parametrize("engine", ["--stream", "--no-stream"])
def test_an_image_token_that_is_not_the_processors_is_refused_before_the_load(tmp_path, capsys, monkeypatch, engine):
    """LLaVA's image_token_index inside the vocabulary but not the id of the processor's <image>: the forward found no
    image token in the processor's inputs and failed after the load, in transformers' words; now one line naming the
    processor's id, before a model is built. The wrappers' own tiny directories pass the same check."""

    from depthlab.hf.processors import check_image_token, processor_image_token
    from depthlab.hf.tiny import save_tiny_wrapper

    for model_type in ("llava", "gemma3"):
        good = save_tiny_wrapper(model_type, tmp_path / model_type)
        text, token = processor_image_token(good)
        assert json.loads((good / "config.json").read_text())["image_token_index"] == token, (model_type, text)
        check_image_token(good)
    path = tmp_path / "llava"
    cfg = json.loads((path / "config.json").read_text())
    cfg["image_token_index"] = 5
    (path / "config.json").write_text(json.dumps(cfg))

    _no_wrapper_built(monkeypatch)
    out = tmp_path / "report"
    capsys.readouterr()
    assert main(["diagnose", str(path), "--tower", "vision", engine, "--device", "cpu", "--out", str(out)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "image_token_index=5 is not the image token its processor writes ('<image>'" in err[0], err
    assert not out.exists()
