"""HF checkpoints load as their config says, or are refused in one line (never a silently different model)."""

import json

import pytest
import torch

from depthlab.base.errors import DepthlabError
from depthlab.cli import main

transformers = pytest.importorskip("transformers")


def _save(path, layers=4, tie=False):
    from depthlab.hf.tiny import tiny_model

    model = tiny_model("llama", vocab_size=64, num_hidden_layers=layers, tie_word_embeddings=tie)
    model.save_pretrained(path)
    return model


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, **changes}))


def test_a_config_claiming_more_layers_than_the_weights_is_refused_naming_them(tmp_path):
    from depthlab.hf import from_hf

    _save(tmp_path)
    _edit_config(tmp_path, num_hidden_layers=6)
    with pytest.raises(DepthlabError, match=r"says 6 layers, but the weights lack layer\(s\) \[4, 5\]") as err:
        from_hf(tmp_path)
    assert "\n" not in str(err.value)
    _edit_config(tmp_path, num_hidden_layers=3)
    with pytest.raises(DepthlabError, match=r"layer\(s\) \[3\] beyond num_hidden_layers"):
        from_hf(tmp_path)


def test_another_width_and_nan_weights_are_refused_in_one_line(tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    from depthlab.hf import from_hf

    _save(tmp_path / "a")
    _edit_config(tmp_path / "a", hidden_size=48)
    with pytest.raises(DepthlabError) as err:
        from_hf(tmp_path / "a")
    assert "\n" not in str(err.value) and "shape" in str(err.value)
    _save(tmp_path / "b")
    state = load_file(str(tmp_path / "b" / "model.safetensors"))
    state["model.layers.1.mlp.up_proj.weight"][0, 0] = float("nan")
    save_file(state, str(tmp_path / "b" / "model.safetensors"), metadata={"format": "pt"})
    capsys.readouterr()  # the test's own saving and loading above
    assert main(["diagnose", str(tmp_path / "b"), "--tokens", "64", "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err.strip()
    assert "NaN/inf" in err and "model.layers.1.mlp.up_proj.weight" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "rep").exists()


def test_a_tied_checkpoint_loads_without_a_head_tensor(tmp_path):
    from depthlab.hf import from_hf

    hf = _save(tmp_path, tie=True).eval()
    model = from_hf(tmp_path)
    ids = torch.randint(0, 64, (1, 9))
    assert model.lm_head.weight is model.embed.weight
    torch.testing.assert_close(model(ids).logits, hf(ids).logits, rtol=1e-5, atol=1e-5)
