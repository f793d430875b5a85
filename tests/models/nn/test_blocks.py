"""Residual blocks: slots default to what the block's docstring draws, and refuse names they lack."""

import pytest
import torch
from torch import nn

from depthlab.models.nn import Attention, ChannelGain, PostNormBlock, PreNormBlock, RMSNorm, Scale, SwiGLU
from depthlab.models.nn.attention import RotaryEmbedding


def parts(d=16):
    return Attention(d, 2, 2, d // 2, False), SwiGLU(d, 24), (lambda: RMSNorm(d))


def rms(v, w):
    return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def test_post_norm_block_slots_compute_the_drawn_path():
    attn, ffn, norm = parts()
    block = PostNormBlock(3, attn, ffn, norm, attn_resid=Scale(2.0), attn_out=ChannelGain(16, 0.5),
                          ffn_out=Scale(3.0))
    x, rope = torch.randn(2, 5, 16), RotaryEmbedding(8, 10000.0)(5, torch.device("cpu"))
    h = rms(2.0 * x + 0.5 * attn(x, rope), block.attn_norm.weight)
    y = rms(h + 3.0 * ffn(h), block.ffn_norm.weight)
    torch.testing.assert_close(block(x, rope), y)
    assert isinstance(block.ffn_resid, nn.Identity) and block.layer == 3


def test_pre_norm_block_defaults_are_pre_ln():
    attn, ffn, norm = parts()
    block = PreNormBlock(1, attn, ffn, norm)
    x, rope = torch.randn(2, 5, 16), RotaryEmbedding(8, 10000.0)(5, torch.device("cpu"))
    h = x + attn(rms(x, 1.0), rope)
    torch.testing.assert_close(block(x, rope), h + ffn(rms(h, 1.0)))
    assert all(isinstance(getattr(block, s), nn.Identity) for s in PreNormBlock.SLOTS if not s.endswith("_norm"))


@pytest.mark.parametrize("cls", [PreNormBlock, PostNormBlock])
def test_unknown_slot_is_refused_naming_the_slots(cls):
    attn, ffn, norm = parts()
    with pytest.raises(TypeError, match="attn_norm"):
        cls(1, attn, ffn, norm, atn_out=Scale(1.0))


def test_layernorm_scale_multiplies_the_whole_output_and_matches_torch():
    from depthlab.models.nn import LayerNorm

    ln = LayerNorm(16, eps=1e-6, scale=0.5)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-1, 1)
    x = torch.randn(3, 16) * 4
    ref = torch.nn.functional.layer_norm(x, (16,), ln.weight, ln.bias, 1e-6) * 0.5
    torch.testing.assert_close(ln(x), ref)


def test_bidirectional_attention_sees_the_future_and_causal_does_not():
    torch.manual_seed(0)
    causal, bi = Attention(16, 2, 2, 8, True), Attention(16, 2, 2, 8, True, causal=False, out_bias=True)
    bi.load_state_dict({**causal.state_dict(), "o_proj.bias": torch.zeros(16)})
    x = torch.randn(1, 6, 16)
    y = x.clone()
    y[:, -1] += 1.0  # change only the last token
    assert torch.allclose(causal(x, None)[:, :-1], causal(y, None)[:, :-1])
    assert not torch.allclose(bi(x, None)[:, :-1], bi(y, None)[:, :-1])
