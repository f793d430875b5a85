"""The ViT family: parity with Hugging Face, LNS placements, config checks, every scheme of the registry."""

import math

import pytest
import torch

import depthlab as d
from depthlab.analysis.diagnostics.capture import ResidualCapture, find_layers
from depthlab.base.errors import ConfigError, DepthlabError
from depthlab.models.vit import ViTConfig, build_vit, vit_from_preset, vit_num_params
from depthlab.models.vit.hf import from_hf_vit

SCHEMES = sorted(d.SCHEMES)


def small(scheme="pre", **kw):
    return vit_from_preset("vit-tiny", scheme=scheme, **{"n_layers": 4, "d_model": 32, "n_heads": 2, "d_ff": 48,
                                                         **kw})


def pixels(cfg, b=3):
    return torch.randn(b, cfg.channels, cfg.image_size, cfg.image_size)


def hf_vit(eps=1e-6, layers=3):
    transformers = pytest.importorskip("transformers")
    hc = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=48, num_hidden_layers=layers,
                                num_attention_heads=4, intermediate_size=96, hidden_act="gelu", layer_norm_eps=eps,
                                qkv_bias=True, num_labels=7, hidden_dropout_prob=0.0,
                                attention_probs_dropout_prob=0.0, attn_implementation="eager")
    torch.manual_seed(1)
    hf = transformers.ViTForImageClassification(hc).eval()
    with torch.no_grad():  # every weight random (HF inits biases/norms to 0/1; make the map prove itself)
        for p in hf.parameters():
            p.normal_(0, 0.2)
    return hf


@pytest.mark.parametrize("eps", [1e-6, 1e-12])
def test_pre_vit_matches_hugging_face_logits_and_hidden_states(eps):
    hf = hf_vit(eps)
    ours = from_hf_vit(hf)
    assert ours.cfg.scheme == "pre" and ours.cfg.norm_eps == eps and ours.cfg.num_classes == 7
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        ref = hf(pixel_values=x, output_hidden_states=True)
        out = ours(x, output_hidden_states=True)
    torch.testing.assert_close(out.logits, ref.logits, rtol=1e-5, atol=1e-5)
    assert len(out.hidden_states) == len(ref.hidden_states) == 4
    for a, b in zip(out.hidden_states, ref.hidden_states):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_lns_block_one_is_pre_and_every_block_scales_by_one_over_sqrt_l():
    cfg = small("lns")
    pre, lns = build_vit(small("pre")), build_vit(cfg)
    lns.load_state_dict(pre.state_dict())  # same keys: the scale is a float, not a parameter
    h = torch.randn(2, cfg.seq_len, cfg.d_model)
    with torch.no_grad():
        torch.testing.assert_close(lns.blocks[0](h, None), pre.blocks[0](h, None), rtol=0, atol=0)
    for block in lns.blocks:
        s = 1 / math.sqrt(block.layer)
        assert block.attn_norm.scale == pytest.approx(s) and block.ffn_norm.scale == pytest.approx(s)
        assert block.attn_out.__class__.__name__ == "Identity"
    # after-branch: norms unscaled, Scale(1/sqrt(l)) on each branch output; block l = pre's with branches / sqrt(l)
    ab = build_vit(small("lns", position="after-branch"))
    ab.load_state_dict(pre.state_dict())
    for block, ref in zip(ab.blocks, pre.blocks):
        s = 1 / math.sqrt(block.layer)
        assert block.attn_norm.scale == 1.0 and block.attn_out.scale == pytest.approx(s)
        assert block.ffn_out.scale == pytest.approx(s)
        with torch.no_grad():
            x1 = h + s * ref.attn(ref.attn_norm(h), None)
            want = x1 + s * ref.ffn(ref.ffn_norm(x1))
            torch.testing.assert_close(block(h, None), want, rtol=1e-5, atol=1e-5)


def test_scheme_options_by_name_or_alias_and_bad_values_are_refused():
    assert small("lns", position="after-branch").scheme_options == {"position": "after-branch"}
    assert small("lns", lns_position="after-branch").scheme_options == {"position": "after-branch"}
    assert small("lns", position="after-norm").scheme_options == {}
    assert small("pre", lns_position="after-norm").scheme == "pre"  # another scheme's default: a no-op
    with pytest.raises(ConfigError, match="'nowhere'"):
        small("lns", position="nowhere")
    with pytest.raises(ConfigError, match="'bogus'"):
        small("pre", bogus=1)
    with pytest.raises(ConfigError, match="unknown scheme 'nope'"):
        vit_from_preset("vit-tiny", scheme="nope")
    with pytest.raises(ConfigError, match="not divisible by norm_groups=5"):
        small("group-ln", groups=5)
    with pytest.raises(ConfigError, match="patch_size=3"):
        small(patch_size=3)
    with pytest.raises(ConfigError, match="pool"):
        small(pool="max")
    cfg = small("lns", position="after-branch")
    assert ViTConfig.from_json(cfg.to_json()) == cfg


def test_vit_s_has_the_size_of_vit_s_16():
    cfg = vit_from_preset("vit-s")
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.seq_len) == (12, 384, 6, 197)
    assert 22.0e6 < vit_num_params(cfg) < 22.1e6  # timm vit_small_patch16_224: 22.05M


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_builds_trains_and_round_trips_on_a_vit(scheme):
    cfg = small(scheme)
    model = build_vit(cfg)
    x, y = pixels(cfg), torch.tensor([0, 3, 9])
    out = model(x, labels=y, output_hidden_states=True)
    assert out.logits.shape == (3, 10) and torch.isfinite(out.loss) and len(out.hidden_states) == cfg.n_layers + 1
    out.loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert vit_num_params(cfg) == model.num_params()
    meta = build_vit(cfg, device="meta")
    meta.to_empty(device="cpu")
    meta.reset_parameters()
    assert all(torch.isfinite(p).all() for p in meta.parameters())
    assert [(n, type(m).__name__, getattr(m, "scale", None)) for n, m in meta.named_modules()] == \
        [(n, type(m).__name__, getattr(m, "scale", None)) for n, m in model.named_modules()]


def test_init_rules_reach_the_gelu_mlp():
    std, L = 0.02, 4
    pre = build_vit(small("pre", init_std=std))
    scaled = build_vit(small("scaled-init", init_std=std))
    depth = build_vit(small("depth-scaled-init", init_std=std))
    assert pre.blocks[0].ffn.fc2.weight.std().item() == pytest.approx(std, rel=0.1)
    assert scaled.blocks[0].ffn.fc2.weight.std().item() == pytest.approx(std / math.sqrt(2 * L), rel=0.1)
    assert depth.blocks[3].ffn.fc2.weight.std().item() == pytest.approx(std / math.sqrt(2 * 4), rel=0.1)
    assert "down_proj" not in str(list(scaled.state_dict()))  # aliases, not modules: keys stay fc1/fc2
    admin = build_vit(small("admin"))
    gains = [b.attn_resid.gain[0].item() for b in admin.blocks]
    assert gains[0] == 1.0 and all(g2 > g1 for g1, g2 in zip(gains, gains[1:]))  # profiled on random pixels


def test_residual_capture_reads_and_replays_a_vit():
    model = build_vit(small("lns")).eval()
    layers = find_layers(model)
    assert layers is model.blocks
    cap = ResidualCapture(model, layers, forward=lambda x: model(x).logits)
    x = pixels(model.cfg)
    with torch.no_grad():
        ref = model(x, output_hidden_states=True)
    logits, states = cap.run(x)
    torch.testing.assert_close(logits, ref.logits)
    for a, b in zip(states, ref.hidden_states):
        torch.testing.assert_close(a, b)
    with torch.no_grad():
        want = model.head(model.run_blocks(states[2], 3))  # blocks 1, 2 kept, block 3 removed, block 4 runs
    torch.testing.assert_close(cap.run_skipping(x, states, {3}), want)


def test_bad_pixels_shape_is_one_line():
    model = build_vit(small())
    with pytest.raises(DepthlabError) as err:
        model(torch.randn(2, 3, 8, 8))
    assert "\n" not in str(err.value) and "(2, 3, 8, 8)" in str(err.value)


def test_hf_vits_we_cannot_express_are_refused_in_one_line():
    hf = hf_vit(layers=1)
    hf.config.hidden_act = "gelu_new"
    with pytest.raises(DepthlabError) as err:
        from_hf_vit(hf)
    assert "hidden_act='gelu_new'" in str(err.value) and "\n" not in str(err.value)
