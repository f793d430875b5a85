"""The 2025 schemes (docs/paper.md §9): Peri-LN, DyT and QK-norm, each against its equation computed
by hand, and QK-norm against transformers' Qwen3."""

import pytest
import torch

import depthlab as d
from depthlab.models.nn.dyt import DyT


def small(scheme, **kw):
    return d.from_preset("llama-9m", scheme=scheme, **{"n_layers": 3, "d_model": 32, "n_heads": 2, "d_ff": 48,
                                                         "vocab_size": 61, **kw})


def rms(v, w, eps=1e-6):  # plain RMSNorm, independent of depthlab's
    return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * w


def test_peri_ln_block_and_embedding_norm_by_hand():
    model = d.build_model(small("peri-ln"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    ids = torch.randint(0, 61, (2, 6))
    out = model(ids, output_hidden_states=True)
    x = rms(model.embed(ids), model.embed_norm.weight)
    torch.testing.assert_close(out.hidden_states[0], x)
    b, rope = model.blocks[1], model.rope(6, x.device)
    h = out.hidden_states[1]
    h2 = h + rms(b.attn(rms(h, b.attn_norm.weight), rope), b.attn_out.weight)
    y = h2 + rms(b.ffn(rms(h2, b.ffn_norm.weight)), b.ffn_out.weight)
    torch.testing.assert_close(out.hidden_states[2], y)


def test_peri_ln_differs_from_sandwich_only_by_the_embedding_norm():
    peri, sand = d.build_model(small("peri-ln")), d.build_model(small("sandwich"))
    extra = set(peri.state_dict()) - set(sand.state_dict())
    assert extra == {"embed_norm.weight"} and set(sand.state_dict()) < set(peri.state_dict())


def test_dyt_replaces_every_norm_and_matches_its_equation():
    model = d.build_model(small("dyt", alpha_init=0.7))
    dyts = [m for m in model.modules() if isinstance(m, DyT)]
    assert len(dyts) == 2 * 3 + 1  # two per block and the final norm
    assert not any("RMSNorm" in type(m).__name__ for m in model.modules())
    norm = model.blocks[0].attn_norm
    assert norm.alpha.item() == pytest.approx(0.7)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(4, 32) * 3
    torch.testing.assert_close(norm(x), norm.weight * torch.tanh(0.7 * x) + norm.bias)


def test_dyt_default_alpha_is_the_papers():
    assert d.get_scheme("dyt").resolve({})["alpha_init"] == 0.5
    assert d.build_model(small("dyt")).norm.alpha.item() == pytest.approx(0.5)


def test_qk_norm_normalises_each_head_before_rope():
    model = d.build_model(small("pre", qk_norm=True))
    attn = model.blocks[0].attn
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(1, 5, 32)
    q = attn.q_proj(x).view(1, 5, 2, 16)
    torch.testing.assert_close(attn.q_norm(q), rms(q, attn.q_norm.weight))
    assert attn.q_norm.weight.shape == (16,) and attn.k_norm.weight.shape == (16,)


@pytest.mark.parametrize("scheme", ["pre", "lns"])
def test_qk_norm_round_trips_through_transformers_qwen3(tmp_path, scheme):
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from depthlab.hf import from_hf, to_hf

    cfg = Qwen3Config(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-6,
                      tie_word_embeddings=False, attention_bias=False)
    hf = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)  # make q/k norms matter
    model = from_hf(hf, scheme=scheme).eval()
    assert model.cfg.qk_norm and model.cfg.head_dim == 16
    ids = torch.randint(0, 61, (2, 11))
    with torch.no_grad():
        if scheme == "pre":
            torch.testing.assert_close(model(ids).logits, hf(ids).logits, rtol=1e-5, atol=1e-5)
        to_hf(model, tmp_path / "out")
        back = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
        assert type(back).__name__ == "Qwen3ForCausalLM"
        torch.testing.assert_close(back(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)
