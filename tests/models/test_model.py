"""DecoderLM against the independent reference: transformers' LlamaForCausalLM / Qwen2ForCausalLM."""

import pytest
import torch

import depthlab as d
from depthlab.hf import from_hf


def _llama(**kw):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=112, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=kw.pop("kv", 4), rms_norm_eps=1e-6,
                      rope_theta=10000.0, max_position_embeddings=64, **kw)
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("kv_heads, tied", [(4, False), (2, False), (1, True)])
def test_pre_ln_matches_hf_llama_logits(kv_heads, tied):
    hf = _llama(kv=kv_heads, tie_word_embeddings=tied)
    model = from_hf(hf)
    assert model.cfg.scheme == "pre" and model.cfg.kv_heads == kv_heads and model.cfg.tie_embeddings == tied
    ids = torch.randint(0, 101, (2, 33))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, hf(ids).logits, rtol=1e-5, atol=1e-5)


def test_weights_copied_by_hand_match_hf_llama():
    """Independent of from_hf: copy parameters by name into a preset-built model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = d.from_preset("llama-9m", n_layers=2, vocab_size=120)
    hf = LlamaForCausalLM(LlamaConfig(vocab_size=120, hidden_size=128, intermediate_size=352, num_hidden_layers=2,
                                      num_attention_heads=4, rms_norm_eps=1e-6, rope_theta=10000.0)).eval()
    model = d.build_model(cfg)
    sd = hf.state_dict()
    with torch.no_grad():
        model.embed.weight.copy_(sd["model.embed_tokens.weight"])
        model.norm.weight.copy_(sd["model.norm.weight"])
        model.lm_head.weight.copy_(sd["lm_head.weight"])
        for i, b in enumerate(model.blocks):
            p = f"model.layers.{i}."
            b.attn_norm.weight.copy_(sd[p + "input_layernorm.weight"])
            b.ffn_norm.weight.copy_(sd[p + "post_attention_layernorm.weight"])
            for n in "qkvo":
                getattr(b.attn, f"{n}_proj").weight.copy_(sd[p + f"self_attn.{n}_proj.weight"])
            for n in ("gate", "up", "down"):
                getattr(b.ffn, f"{n}_proj").weight.copy_(sd[p + f"mlp.{n}_proj.weight"])
        ids = torch.randint(0, 120, (3, 20))
        torch.testing.assert_close(model(ids).logits, hf(ids).logits, rtol=1e-5, atol=1e-5)


def test_qwen2_shape_matches_hf_qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = d.from_preset("qwen2.5-0.5b", n_layers=2, d_model=112, n_heads=14, n_kv_heads=2, d_ff=160, vocab_size=150)
    hf = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=150, hidden_size=112, intermediate_size=160, num_hidden_layers=2, num_attention_heads=14,
        num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)  # make the q/k/v biases matter
    model = from_hf(hf)
    got = (model.cfg.qkv_bias, model.cfg.tie_embeddings, model.cfg.rope_theta)
    assert got == (shape.qkv_bias, shape.tie_embeddings, shape.rope_theta)
    assert model.num_params() == d.num_params(model.cfg) == sum(p.numel() for p in hf.parameters())
    ids = torch.randint(0, 150, (2, 25))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, hf(ids).logits, rtol=1e-5, atol=1e-5)


def test_hidden_states_are_the_residual_stream_at_block_boundaries():
    model = d.build_model(d.from_preset("tiny", n_layers=3, vocab_size=50))
    ids = torch.randint(0, 50, (2, 9))
    out = model(ids, output_hidden_states=True)
    hs = out.hidden_states
    assert len(hs) == 4
    torch.testing.assert_close(hs[0], model.embed(ids))
    for l in range(1, 4):
        torch.testing.assert_close(hs[l], model.run_blocks(hs[l - 1], l - 1, l))
    torch.testing.assert_close(out.logits, model.head(hs[-1]))  # last residual is pre-final-norm


def test_loss_is_mean_cross_entropy_and_ignores_minus_100():
    model = d.build_model(d.from_preset("tiny", n_layers=2, vocab_size=50))
    ids = torch.randint(0, 50, (2, 9))
    labels = ids.roll(-1, 1)
    labels[:, -3:] = -100
    out = model(ids, labels=labels)
    ref = torch.nn.functional.cross_entropy(out.logits[:, :-3].reshape(-1, 50), labels[:, :-3].reshape(-1))
    torch.testing.assert_close(out.loss, ref)


def test_attention_is_causal():
    model = d.build_model(d.from_preset("tiny", n_layers=2, vocab_size=50))
    ids = torch.randint(0, 50, (1, 12))
    changed = ids.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % 50
    torch.testing.assert_close(model(ids).logits[:, :8], model(changed).logits[:, :8])
