import json

import pytest

import depthlab as d
from depthlab.models.presets import PRESETS


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_validates_and_round_trips_json(name):
    cfg = d.from_preset(name)
    again = d.ModelConfig.from_json(cfg.to_json())
    assert again == cfg
    assert again.name == name


def test_paper_preset_shapes():
    c = d.from_preset("llama-130m")
    assert (c.n_layers, c.d_model, c.n_heads, c.d_ff, c.vocab_size) == (12, 768, 12, 2048, 32000)
    assert not c.tie_embeddings and c.norm_eps == 1e-6 and c.rope_theta == 10000.0
    q = d.from_preset("qwen2.5-0.5b")
    assert (q.n_layers, q.d_model, q.n_heads, q.kv_heads, q.d_ff) == (24, 896, 14, 2, 4864)
    assert q.qkv_bias and q.tie_embeddings and q.rope_theta == 1e6


def test_llama_130m_parameter_count_by_hand():
    # embeddings + untied head: 2 * 32000 * 768; per block: 4*768^2 (attn) + 3*768*2048 (SwiGLU) + 2*768
    per_block = 4 * 768**2 + 3 * 768 * 2048 + 2 * 768
    expected = 2 * 32000 * 768 + 12 * per_block + 768
    assert d.num_params(d.from_preset("llama-130m")) == expected


def test_overrides_and_json_file(tmp_path):
    cfg = d.from_preset("llama-9m", scheme="lns", n_layers=2)
    assert cfg.n_layers == 2 and cfg.scheme == "lns"
    path = tmp_path / "c.json"
    cfg.to_json(path)
    assert json.loads(path.read_text())["scheme"] == "lns"
    assert d.ModelConfig.from_json(path) == cfg


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: d.from_preset("llama-13m"), ["'llama-13m'", "llama-130m", "tiny"]),
        (lambda: d.from_preset("tiny", scheme="prenorm"), ["'prenorm'", "pre", "lns", "deepnorm"]),
        (lambda: d.from_preset("tiny", scheme="lns", lns_position="middle"), ["'middle'", "after-norm", "before-norm"]),
        (lambda: d.from_preset("tiny", d_model=130), ["d_model=130", "n_heads=4"]),
        (lambda: d.from_preset("tiny", n_kv_heads=3), ["n_kv_heads=3"]),
        (lambda: d.from_preset("tiny", bogus=1), ["'bogus'", "n_layers"]),
        (lambda: d.from_preset("tiny", scheme="pre", lns_position="ffn-only"), ["'ffn-only'", "lns"]),
    ],
)
def test_bad_input_names_the_value_and_the_choices(call, words):
    with pytest.raises(ValueError) as err:
        call()
    for word in words:
        assert word in str(err.value)
