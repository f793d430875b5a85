"""The paper's schemes (docs/paper.md §2): each builds from a shrunk preset, trains, counts its
parameters as computed by hand, and initialises / places its blocks as the paper says."""

import math

import pytest
import torch
from torch import nn

import depthlab as d
from depthlab.models.nn import ChannelGain, GroupRMSNorm, PostNormBlock, PreNormBlock, RMSNorm, ScalarGain, Scale
from depthlab.models.schemes import LNS_SLOTS, deepnorm_alpha, deepnorm_beta


def small(scheme, **kw):
    kw = {"n_layers": 4, "d_model": 64, "n_heads": 4, "d_ff": 96, "vocab_size": 97, **kw}
    return d.from_preset("llama-9m", scheme=scheme, **kw)


PAPER_SCHEMES = ["pre", "post", "lns", "mix", "deepnorm", "sandwich", "admin", "group-ln", "scaled-init",
                 "depth-scaled-init", "skipinit", "layerscale", "lns-scaled-init"]


def extra_params_by_hand(scheme, L, D):
    """Parameters a scheme adds to Pre-LN, from its equations (an independent count)."""
    return {"sandwich": 2 * L * D, "admin": 2 * L * D, "skipinit": 2 * L, "layerscale": 2 * L * D}.get(scheme, 0)


@pytest.mark.parametrize("scheme", PAPER_SCHEMES)
def test_scheme_builds_trains_and_counts_parameters(scheme):
    cfg = small(scheme)
    model = d.build_model(cfg)
    V, D, F, L = cfg.vocab_size, cfg.d_model, cfg.d_ff, cfg.n_layers
    pre_ln = 2 * V * D + L * (4 * D * D + 3 * D * F + 2 * D) + D
    assert model.num_params() == d.num_params(cfg) == pre_ln + extra_params_by_hand(scheme, L, D)
    ids = torch.randint(0, cfg.vocab_size, (2, 12))
    out = model(ids, labels=ids.roll(-1, 1))
    assert torch.isfinite(out.loss)
    out.loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_scheme_names_are_the_stable_public_ones():
    # the paper's names never go away; new schemes (tests/models/schemes/test_contract.py covers every one) may join
    assert set(PAPER_SCHEMES) <= set(d.SCHEMES)


def test_lns_scales_are_one_over_sqrt_l_in_both_prenorms_and_absent_from_state_dict():
    model = d.build_model(small("lns", n_layers=6))
    for l, block in enumerate(model.blocks, start=1):
        assert block.attn_norm.scale == pytest.approx(1 / math.sqrt(l))
        assert block.ffn_norm.scale == pytest.approx(1 / math.sqrt(l))
        assert isinstance(block.attn_out, nn.Identity) and isinstance(block.resid_scale, nn.Identity)
    assert isinstance(model.norm, RMSNorm) and model.norm.scale == 1.0  # final norm untouched
    pre = d.build_model(small("pre", n_layers=6))
    assert model.state_dict().keys() == pre.state_dict().keys()


def test_lns_block_one_is_exactly_pre_ln_and_deeper_blocks_differ():
    pre = d.build_model(small("pre"))
    lns = d.build_model(small("lns"))
    lns.load_state_dict(pre.state_dict())
    x = torch.randn(2, 10, 64)
    rope = pre.rope(10, x.device)
    torch.testing.assert_close(lns.blocks[0](x, rope), pre.blocks[0](x, rope), rtol=0, atol=0)
    assert not torch.allclose(lns.blocks[1](x, rope), pre.blocks[1](x, rope))


def test_lns_by_hand_matches_the_equation():
    model = d.build_model(small("lns"))
    block, l = model.blocks[2], 3
    x = torch.randn(2, 10, 64)
    rope = model.rope(10, x.device)
    def rms(v, w):  # plain RMSNorm, independent of depthlab's
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    h = x + block.attn(rms(x, block.attn_norm.weight) / math.sqrt(l), rope)
    y = h + block.ffn(rms(h, block.ffn_norm.weight) / math.sqrt(l))
    torch.testing.assert_close(block(x, rope), y)


@pytest.mark.parametrize("position", sorted(LNS_SLOTS))
def test_lns_positions_fill_exactly_their_slots(position):
    model = d.build_model(small("lns", lns_position=position))
    block = model.blocks[3]
    for slot in ["attn_prescale", "attn_out", "ffn_prescale", "ffn_out", "resid_scale"]:
        mod = getattr(block, slot)
        if slot in LNS_SLOTS[position]:
            assert isinstance(mod, Scale) and mod.scale == pytest.approx(0.5)
        else:
            assert isinstance(mod, nn.Identity)
    for slot in ["attn_norm", "ffn_norm"]:
        assert getattr(block, slot).scale == pytest.approx(0.5 if slot in LNS_SLOTS[position] else 1.0)


def test_meta_device_build_keeps_lns_scales_and_materialises():
    cfg = small("lns", n_layers=5)
    model = d.build_model(cfg, device="meta")
    assert model.embed.weight.is_meta
    model.to_empty(device="cpu")
    model.reset_parameters()
    assert [b.attn_norm.scale for b in model.blocks] == pytest.approx([1 / math.sqrt(l) for l in range(1, 6)])
    assert model.embed.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert torch.all(model.blocks[0].attn_norm.weight == 1)
    ref = d.build_model(cfg)
    ref.load_state_dict(model.state_dict())
    ids = torch.randint(0, cfg.vocab_size, (1, 8))
    torch.testing.assert_close(model(ids).logits, ref(ids).logits)


def test_normal_init_std():
    model = d.build_model(small("pre", d_model=128, d_ff=256))
    for name, p in model.named_parameters():
        if p.dim() == 2:
            assert p.std().item() == pytest.approx(0.02, rel=0.1), name


def test_scaled_init_output_projections():
    L = 8
    model = d.build_model(small("scaled-init", n_layers=L, d_model=128, d_ff=256))
    for block in model.blocks:
        assert block.attn.o_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(2 * L), rel=0.1)
        assert block.ffn.down_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(2 * L), rel=0.1)
        assert block.attn.q_proj.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_depth_scaled_init_output_projections():
    model = d.build_model(small("depth-scaled-init", n_layers=6, d_model=128, d_ff=256))
    for l, block in enumerate(model.blocks, start=1):
        assert block.ffn.down_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(2 * l), rel=0.1)


def test_lns_scaled_init_combines_both():
    model = d.build_model(small("lns-scaled-init", n_layers=8, d_model=128, d_ff=256))
    assert model.blocks[3].ffn_norm.scale == pytest.approx(0.5)
    assert model.blocks[3].attn.o_proj.weight.std().item() == pytest.approx(0.02 / 4, rel=0.1)


@pytest.mark.parametrize("L, expected_post", [(12, 3), (24, 6), (4, 1), (10, 3)])
def test_mix_ln_puts_post_ln_exactly_in_the_first_round_alpha_L_blocks(L, expected_post):
    model = d.build_model(small("mix", n_layers=L))
    kinds = [type(b) for b in model.blocks]
    assert kinds == [PostNormBlock] * expected_post + [PreNormBlock] * (L - expected_post)


@pytest.mark.parametrize("L", [6, 24])
def test_deepnorm_constants_follow_L(L):
    assert deepnorm_alpha(L) == pytest.approx((2 * L) ** 0.25)
    assert deepnorm_beta(L) == pytest.approx((8 * L) ** -0.25)
    model = d.build_model(small("deepnorm", n_layers=L, d_model=128, d_ff=256))
    block = model.blocks[-1]
    assert block.attn_resid.scale == pytest.approx((2 * L) ** 0.25)
    # xavier normal with gain beta: std = beta * sqrt(2 / (fan_in + fan_out)); q/k use gain 1
    v = block.attn.v_proj.weight
    assert v.std().item() == pytest.approx(deepnorm_beta(L) * math.sqrt(2 / sum(v.shape)), rel=0.1)
    q = block.attn.q_proj.weight
    assert q.std().item() == pytest.approx(math.sqrt(2 / sum(q.shape)), rel=0.1)


def test_post_ln_normalises_after_the_residual_add():
    model = d.build_model(small("post"))
    x = torch.randn(2, 6, 64) * 5
    y = model.blocks[0](x, model.rope(6, x.device))
    torch.testing.assert_close(y.pow(2).mean(-1), torch.ones(2, 6), rtol=1e-4, atol=1e-4)


def test_sandwich_normalises_branch_outputs():
    model = d.build_model(small("sandwich"))
    assert isinstance(model.blocks[0].attn_out, RMSNorm) and isinstance(model.blocks[0].ffn_out, RMSNorm)


def test_admin_omega_comes_from_profiled_branch_variances():
    model = d.build_model(small("admin", n_layers=3))
    gains = [g for b in model.blocks for g in (b.attn_resid, b.ffn_resid)]
    assert all(isinstance(g, ChannelGain) for g in gains)
    inits = [g.init for g in gains]
    assert inits[0] == pytest.approx(1.0)
    assert all(b > a for a, b in zip(inits, inits[1:]))  # omega^2 accumulates variances
    assert all(torch.all(g.gain == g.init) for g in gains)


def test_group_ln_normalises_each_group():
    model = d.build_model(small("group-ln", norm_groups=4))
    norm = model.blocks[0].attn_norm
    assert isinstance(norm, GroupRMSNorm)
    x = torch.randn(3, 64)
    x[:, :16] *= 100  # one loud group must not shrink the others
    y = norm(x).unflatten(-1, (4, 16))
    torch.testing.assert_close(y.pow(2).mean(-1), torch.ones(3, 4), rtol=1e-4, atol=1e-4)


def test_skipinit_and_layerscale_gains():
    sk = d.build_model(small("skipinit", n_layers=9))
    assert isinstance(sk.blocks[0].attn_out, ScalarGain)
    assert sk.blocks[0].attn_out.gain.item() == pytest.approx(1 / 3)
    for L, eps in [(12, 0.1), (24, 1e-5), (32, 1e-6)]:
        ls = d.build_model(small("layerscale", n_layers=L, d_model=32, d_ff=32))
        assert torch.allclose(ls.blocks[-1].ffn_out.gain.detach(), torch.full((32,), eps))
