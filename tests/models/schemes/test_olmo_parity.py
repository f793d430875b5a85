"""Parity with OLMo-core's own blocks (the released ``ai2-olmo-core`` 3.0.0): for every block type it
ships that depthlab has a scheme for, one block built by OLMo-core's ``TransformerBlockConfig`` and one
by depthlab's registry, with the same weights copied across, give the same output (fp32, CPU, OLMo-core's
plain torch SDPA attention backend, its RoPE with the same theta, RMSNorm with the same eps).

Skipped when OLMo-core is not installed (install line: scripts/install.sh --dev)."""

import pytest
import torch

import depthlab as d

pytest.importorskip("olmo_core.nn.transformer.config", reason="ai2-olmo-core is not installed")

from olmo_core.nn.attention import AttentionConfig  # noqa: E402
from olmo_core.nn.feed_forward import FeedForwardConfig  # noqa: E402
from olmo_core.nn.layer_norm import LayerNormConfig  # noqa: E402
from olmo_core.nn.rope import RoPEConfig  # noqa: E402
from olmo_core.nn.transformer.config import TransformerBlockConfig  # noqa: E402

#: OLMo-core's parameter prefixes -> depthlab's, shared by every block type
SHARED = {"attention.w_q": "attn.q_proj", "attention.w_k": "attn.k_proj", "attention.w_v": "attn.v_proj",
          "attention.w_out": "attn.o_proj", "feed_forward.w1": "ffn.gate_proj", "feed_forward.w3": "ffn.up_proj",
          "feed_forward.w2": "ffn.down_proj"}
PRE_NORMS = {"attention_norm": "attn_norm", "feed_forward_norm": "ffn_norm"}

#: depthlab scheme -> (OLMo-core block name, its norms -> depthlab's slots)
PAIRS = {
    "pre": ("default", PRE_NORMS),
    "lns": ("default_scaled", PRE_NORMS),
    "reordered": ("reordered_norm", {"attention_norm": "attn_out", "feed_forward_norm": "ffn_out"}),
    "peri-ln": ("peri_norm", {**PRE_NORMS, "post_attention_norm": "attn_out", "post_feed_forward_norm": "ffn_out"}),
}


def olmo_block(name: str, cfg: d.ModelConfig, block_idx: int) -> torch.nn.Module:
    attention = AttentionConfig(n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, bias=False,
                                rope=RoPEConfig(theta=int(cfg.rope_theta)), backend="torch")
    block = TransformerBlockConfig(name=name, sequence_mixer=attention,
                                   feed_forward=FeedForwardConfig(hidden_size=cfg.d_ff, bias=False),
                                   layer_norm=LayerNormConfig(name="rms", eps=cfg.norm_eps, bias=False))
    return block.build(d_model=cfg.d_model, block_idx=block_idx, n_layers=cfg.n_layers)


@pytest.mark.parametrize("scheme", sorted(PAIRS))
@pytest.mark.parametrize("block_idx", [0, 2])
def test_block_equals_olmo_cores_with_the_same_weights(scheme, block_idx):
    name, norms = PAIRS[scheme]
    cfg = d.from_preset("llama-9m", scheme=scheme, n_layers=4, d_model=32, n_heads=4, n_kv_heads=2, d_ff=48,
                        vocab_size=61)
    model = d.build_model(cfg)
    ours = model.blocks[block_idx]
    with torch.no_grad():  # norm weights away from 1, so a norm in the wrong slot shows
        for key, p in ours.named_parameters():
            if "norm" in key or key.endswith("_out.weight"):
                p.uniform_(0.5, 1.5)
    theirs = olmo_block(name, cfg, block_idx)
    mapping, state = {**SHARED, **norms}, ours.state_dict()
    copied = {}
    for key, _ in theirs.named_parameters():
        prefix, leaf = key.rsplit(".", 1)
        copied[key] = state[f"{mapping[prefix]}.{leaf}"]
    assert len(copied) == len(state), "every depthlab parameter has an OLMo-core counterpart"
    missing, unexpected = theirs.load_state_dict(copied, strict=False)
    assert not unexpected and all(k.endswith("ln_scale") for k in missing), missing  # LNS's constant buffer
    x = torch.randn(2, 7, cfg.d_model)
    with torch.no_grad():
        torch.testing.assert_close(ours(x, model.rope(7, x.device)), theirs(x))
