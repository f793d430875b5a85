"""The streamed engine's whole-checkpoint check (``targets.stream.verify``) under issue 49's attacks: an untied model
without its head, a layer count under GPT-2's own field name, one expert stored one by one missing, a weight of the
wrong shape. Each is refused in one line by ``open_streamed``, before any weight is read (the finiteness pass is the
first read: it must not run), and the CLI writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from depthlab.base.errors import DepthlabError
from depthlab.cli import main
from depthlab.hf.tiny import save_tiny
from depthlab.targets.stream import verify
from depthlab.targets.stream.open import open_streamed


def _tiny(tmp_path: Path, model_type: str, name: str | None = None, **config) -> Path:
    return save_tiny(model_type, tmp_path / (name or model_type), **config)


def _edit_weights(path: Path, edit) -> None:
    file = path / "model.safetensors"
    weights = load_file(str(file))
    edit(weights)
    save_file(weights, str(file), metadata={"format": "pt"})


def _edit_config(path: Path, **values) -> None:
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, **values}))


@pytest.fixture
def no_weight_read(monkeypatch):
    """Fails the test if the check reaches its first weight read (the finiteness pass)."""
    def read(*args, **kwargs):
        raise AssertionError("a weight was read before the refusal")

    monkeypatch.setattr(verify, "_check_finite", read)


def test_an_untied_model_without_its_head_is_refused_not_streamed_with_the_embedding_as_head(tmp_path, capsys,
                                                                                               no_weight_read):
    """Issue 49, cause 1: ``tie_word_embeddings: false`` and no ``lm_head.weight``: the streamed engine used to read
    the embedding as the head and prune into a checkpoint without one ("export check ... ok", exit 0)."""
    path = _tiny(tmp_path, "llama", tie_word_embeddings=False)
    _edit_weights(path, lambda w: w.pop("lm_head.weight"))
    with pytest.raises(DepthlabError, match="its head is not tied to the embedding.*'lm_head.weight'"):
        open_streamed(str(path))
    out = tmp_path / "pruned"
    capsys.readouterr()  # the fixture's own writing bars
    assert main(["prune", str(path), "--stream", "--remove", "1", "--device", "cpu", "--out", str(out)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "lm_head.weight" in err[0], err
    assert not out.exists()


def test_an_untied_model_with_its_head_streams_its_own_head(tmp_path, monkeypatch):
    """The head of an untied model is its stored ``lm_head.weight``, not an alias of the embedding."""
    path = _tiny(tmp_path, "llama", tie_word_embeddings=False)
    source = open_streamed(str(path)).source
    assert source.aliases == {}
    assert "lm_head.weight" in verify._expected(source).direct


@pytest.mark.parametrize("case", ["fewer", "stray"])
def test_gpt2_layer_count_under_its_own_name_is_held_against_the_weights(tmp_path, case, no_weight_read):
    """Issue 49, cause 3: GPT-2 counts its layers in ``n_layer``; a config of 3 over 4 stored layers and a stray
    tensor of layer 9 are refused, as every other family's and GPT-2 in memory are."""
    path = _tiny(tmp_path, "gpt2")
    if case == "fewer":
        _edit_config(path, n_layer=3)
        needle = r"config.json says 3 layers, but the weights hold layer\(s\) \[3\]"
    else:
        _edit_weights(path, lambda w: w.__setitem__("transformer.h.9.ln_1.weight", w["transformer.h.0.ln_1.weight"]
                                                    .clone()))
        needle = r"config.json says 4 layers, but the weights hold layer\(s\) \[9\]"
    with pytest.raises(DepthlabError, match=needle):
        open_streamed(str(path))


@pytest.mark.parametrize("model_type, key", [
    ("mixtral", "model.layers.2.block_sparse_moe.experts.1.w3.weight"),
    ("qwen3_next", "model.layers.2.mlp.experts.1.up_proj.weight"),
    ("deepseek_v4", "model.layers.2.ffn.experts.1.w3.weight"),
])
def test_one_missing_expert_stored_one_by_one_is_refused_before_any_layer(tmp_path, model_type, key, no_weight_read):
    """Issue 49, cause 4: experts stored one by one (fused by transformers on load), one of them missing: named
    before the sweep, not by layer 3 after the layers before it were read."""
    path = _tiny(tmp_path, model_type)
    assert key in load_file(str(path / "model.safetensors"))  # the fixture stores experts one by one
    _edit_weights(path, lambda w: w.pop(key))
    with pytest.raises(DepthlabError, match=f"the weights lack tensor '{key}'"):
        open_streamed(str(path))


def test_a_complete_moe_checkpoint_stored_one_by_one_streams(tmp_path):
    """The dry conversion accepts what transformers itself loads (no false refusal)."""
    open_streamed(str(_tiny(tmp_path, "mixtral")))


def test_a_wrong_shaped_gpt_neox_weight_is_refused_before_any_layer(tmp_path, no_weight_read):
    """Issue 49, cause 5."""
    path = _tiny(tmp_path, "gpt_neox")
    key = "gpt_neox.layers.2.mlp.dense_h_to_4h.weight"
    _edit_weights(path, lambda w: w.__setitem__(key, w[key][:-1].clone()))
    with pytest.raises(DepthlabError, match=rf"tensor '{key}' in 'model.safetensors' is \[63, 32\], the config "
                                            r"makes it \[64, 32\]"):
        open_streamed(str(path))
