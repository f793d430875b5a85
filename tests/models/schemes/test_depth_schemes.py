"""The depth schemes OLMo-core offers beyond its release (docs/paper.md §9.4-9.8): uniform LNS,
Depth-muP / CompleteP (block and trainer-side rules), KEEL and Hyper-Connections / mHC, each block
against its source's equations computed naively here, with the same weights."""

import math

import pytest
import torch

import depthlab as d
from depthlab.base.errors import ConfigError
from depthlab.models.nn.hyper import sinkhorn


def small(scheme, **kw):
    return d.from_preset("llama-9m", scheme=scheme, **{"n_layers": 4, "d_model": 32, "n_heads": 2, "d_ff": 48,
                                                         "vocab_size": 61, **kw})


def rms(v, w=1.0, eps=1e-6):  # plain RMSNorm, independent of depthlab's
    return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * w


def random_norms(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)


def block_io(model, i, T=6):
    """(input, output, rope) of block i (0-based) in a forward of random tokens."""
    out = model(torch.randint(0, model.cfg.vocab_size, (2, T)), output_hidden_states=True)
    return out.hidden_states[i], out.hidden_states[i + 1], model.rope(T, torch.device("cpu"))


# ---------------------------------------------------------------------------------------- lns-uniform
def test_lns_uniform_scales_every_block_by_one_over_sqrt_L():
    model = d.build_model(small("lns-uniform", n_layers=9))
    random_norms(model)
    for i in (0, 8):  # first and last block: the same factor 1/3
        x, y, rope = block_io(model, i)
        b = model.blocks[i]
        h = x + b.attn(rms(x, b.attn_norm.weight) / 3, rope)
        torch.testing.assert_close(y, h + b.ffn(rms(h, b.ffn_norm.weight) / 3))


# ---------------------------------------------------------------------------------------- completep
@pytest.mark.parametrize("base_depth,alpha", [(2, 1.0), (1, 0.5)])
def test_completep_block_multiplies_each_branch_by_depth_ratio_power(base_depth, alpha):
    model = d.build_model(small("completep", n_layers=8, base_depth=base_depth, alpha=alpha))
    random_norms(model)
    m = (8 / base_depth) ** -alpha  # 1/4 and 1/sqrt(8)
    x, y, rope = block_io(model, 5)
    b = model.blocks[5]
    h = x + m * b.attn(rms(x, b.attn_norm.weight), rope)
    torch.testing.assert_close(y, h + m * b.ffn(rms(h, b.ffn_norm.weight)))


@pytest.mark.parametrize("alpha,block_lr,eps", [(1.0, 1.0, 0.25), (0.5, 0.5, 0.5)])
def test_completep_optimizer_rules_scale_block_lr_and_adam_eps(alpha, block_lr, eps):
    """L = 8, L_base = 2: in-block lr x 4^(alpha-1), Adam eps x 4^(-alpha), everything else at lr. One Adam
    step moves each weight by about its group's lr (Adam's first step is lr * g / (|g| + eps))."""
    from depthlab.train import TrainConfig
    from depthlab.train.optim import build_optimizer, set_lr

    model = d.build_model(small("completep", n_layers=8, alpha=alpha))
    opt = build_optimizer(model, TrainConfig(lr=1e-2, adam_eps=1e-8), torch.device("cpu"))
    assert opt.defaults["eps"] == pytest.approx(1e-8 * eps)
    scales = {n: g["lr_scale"] for g in opt.param_groups for n, p in model.named_parameters()
              if any(p is q for q in g["params"])}
    assert scales == {n: (block_lr if n.startswith("blocks.") else 1.0) for n, _ in model.named_parameters()}
    set_lr(opt, 1e-2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = torch.randint(0, 61, (2, 8))
    model(ids, labels=ids.roll(-1, 1)).loss.backward()
    opt.step()
    for name in ("blocks.3.attn.q_proj.weight", "embed.weight", "lm_head.weight"):
        p = dict(model.named_parameters())[name]
        step = (p.detach() - before[name]).abs()
        moved = p.grad.abs() > 1e-4  # entries whose gradient dwarfs eps
        torch.testing.assert_close(step[moved], torch.full_like(step[moved], 1e-2 * scales[name]), rtol=1e-3, atol=0)


def test_schemes_without_rules_keep_one_group_at_the_scheduled_lr():
    from depthlab.train import TrainConfig
    from depthlab.train.optim import build_optimizer, set_lr

    opt = build_optimizer(d.build_model(small("lns")), TrainConfig(lr=1e-3), torch.device("cpu"))
    set_lr(opt, 5e-4)
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["lr"] == 5e-4 and opt.defaults["eps"] == 1e-8


def test_completep_resumes_exactly_with_two_learning_rates(tmp_path, tmp_path_factory, monkeypatch, one_thread):
    """alpha = 0.5 makes two param groups; a resume from the step-2 checkpoint restores each group's lr
    multiplier and reproduces the straight run's losses."""
    import shutil

    from depthlab.train import TrainConfig, list_checkpoints, train

    monkeypatch.setenv("DEPTHLAB_CACHE", str(tmp_path_factory.getbasetemp() / "depthlab-cache"))
    cfg = d.from_preset("tiny", scheme="completep", alpha=0.5, n_layers=4, d_model=16, n_heads=2, d_ff=32)
    tc = TrainConfig(data="builtin", tokenizer="bytes", steps=4, batch_size=2, seq_len=16, eval_tokens=64,
                     eval_every=4, ckpt_every=2, keep_last=2, lr=3e-3, device="cpu")
    straight, resumed = [], []
    train(cfg, tc, tmp_path / "a", quiet=True, progress=lambda r: straight.append((r["step"], r["loss"])))
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(list_checkpoints(tmp_path / "b")[-1])
    train(cfg, tc, tmp_path / "b", resume=True, quiet=True, progress=lambda r: resumed.append((r["step"], r["loss"])))
    assert resumed == straight[2:]
    groups = torch.load(list_checkpoints(tmp_path / "b")[-1] / "optimizer.pt", weights_only=True)["param_groups"]
    assert sorted(g["lr_scale"] for g in groups) == pytest.approx([2 ** -0.5, 1.0])  # (4/2)^(0.5-1) in the blocks
    assert {round(g["lr"] / g["lr_scale"], 12) for g in groups} == {round(groups[0]["lr"] / groups[0]["lr_scale"], 12)}


# ---------------------------------------------------------------------------------------- keel
def test_keel_blocks_follow_their_equations():
    """Block l >= 2: h = N(2L x + A(N(x))), y = N(2L h + F(N(h))). Block 1: h = x + A(N(x)),
    y = N(h + F(N(h))) (Pre-LN attention, Post-LN FFN without alpha; OLMo-core main)."""
    model = d.build_model(small("keel"))
    random_norms(model)
    a = 2.0 * 4
    x, y, rope = block_io(model, 2)
    b = model.blocks[2]
    h = rms(a * x + b.attn(rms(x, b.attn_in.weight), rope), b.attn_norm.weight)
    torch.testing.assert_close(y, rms(a * h + b.ffn(rms(h, b.ffn_in.weight)), b.ffn_norm.weight))
    x, y, rope = block_io(model, 0)
    b = model.blocks[0]
    h = x + b.attn(rms(x, b.attn_in.weight), rope)
    torch.testing.assert_close(y, rms(h + b.ffn(rms(h, b.ffn_in.weight)), b.ffn_norm.weight))
    assert "blocks.0.attn_norm.weight" not in model.state_dict()  # block 1 has no norm after attention


def test_reordered_block_normalises_only_the_branch_output():
    model = d.build_model(small("reordered"))
    random_norms(model)
    x, y, rope = block_io(model, 1)
    b = model.blocks[1]
    h = x + rms(b.attn(x, rope), b.attn_out.weight)
    torch.testing.assert_close(y, h + rms(b.ffn(h), b.ffn_out.weight))


# ---------------------------------------------------------------------------------------- HC / mHC
def naive_sinkhorn(logits, iters, floor=0.0):
    """DeepSeek-V4's hc_split_sinkhorn on [out, in]: softmax over the output streams (+ floor), normalise over the
    input streams, then iters - 1 rounds of (output streams, input streams), every denominator + floor."""
    m = logits.exp() / logits.exp().sum(-2, keepdim=True) + floor
    m = m / (m.sum(-1, keepdim=True) + floor)
    for _ in range(iters - 1):
        m = m / (m.sum(-2, keepdim=True) + floor)
        m = m / (m.sum(-1, keepdim=True) + floor)
    return m


def test_sinkhorn_is_doubly_stochastic_and_mixes_streams_convexly():
    logits = torch.randn(5, 4, 4)
    m = sinkhorn(logits, 50)
    assert (m > 0).all()
    torch.testing.assert_close(m.sum(-1), torch.ones(5, 4))  # rows: exact after the last step
    torch.testing.assert_close(m.sum(-2), torch.ones(5, 4), atol=1e-4, rtol=0)
    v = torch.randn(5, 1, 16)
    torch.testing.assert_close(m @ v.expand(5, 4, 16), v.expand(5, 4, 16))  # equal streams stay equal
    H = torch.randn(5, 4, 16)
    torch.testing.assert_close((m @ H).sum(-2), H.sum(-2), atol=1e-3, rtol=1e-3)  # the streams' sum, nearly
    torch.testing.assert_close(sinkhorn(logits, 3), naive_sinkhorn(logits, 3))


def randomize(model, scale=0.3):
    """Every parameter moved off its init (zero-initialised dynamic weights included)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)


def streams_io(model, i, T=5):
    n = model.cfg.scheme_options.get("streams", 4)
    x, y, rope = block_io(model, i, T)
    return x.unflatten(-1, (n, -1)), y.unflatten(-1, (n, -1)), rope


def test_mhc_dynamic_block_follows_the_mhc_equations():
    """x~ = RMSNorm(vec x); H~ = alpha * (x~ phi) + b; H_pre = sigmoid (+ floor), H_post = 2 sigmoid, H_res = Sinkhorn;
    x_{l+1} = H_res x_l + H_post^T F(H_pre x_l), for each of the two sub-layers (mHC, Xie et al. 2025)."""
    model = d.build_model(small("mhc", streams=3))
    randomize(model)
    X, Y, rope = streams_io(model, 2)
    b = model.blocks[2]

    def sublayer(X, hc, f):
        n = X.shape[-2]
        x = rms(X.flatten(-2))
        m = x @ hc.phi
        pre = torch.sigmoid(hc.alpha[0] * m[..., :n] + hc.pre) + 1e-6  # DeepSeek-V4's floor hc_eps
        post = 2 * torch.sigmoid(hc.alpha[1] * m[..., n:2 * n] + hc.post)
        res = naive_sinkhorn(hc.alpha[2] * m[..., 2 * n:].reshape(*m.shape[:-1], n, n) + hc.res, 20, 1e-6)
        out = f(torch.einsum("bti,btid->btd", pre, X))
        return torch.einsum("btij,btjd->btid", res, X) + post[..., None] * out[..., None, :]

    H = sublayer(X, b.attn_hc, lambda h: b.attn(rms(h, b.attn_norm.weight), rope))
    torch.testing.assert_close(Y, sublayer(H, b.ffn_hc, lambda h: b.ffn(rms(h, b.ffn_norm.weight))))


def test_hc_dynamic_block_follows_the_hc_equations():
    """H- = norm(H); A_m = s_a tanh(H- W_m) + A_m; A_r = s_a tanh(H- W_r) + A_r; B = s_b tanh(H- W_b)^T + B;
    h = A_m^T H; H' = B^T T(h) + A_r^T H (Hyper-Connections, Zhu et al. 2024)."""
    model = d.build_model(small("mhc", constraint="none"))
    randomize(model)
    X, Y, rope = streams_io(model, 1)
    b = model.blocks[1]

    def sublayer(H, hc, f):
        Hn = rms(H, hc.norm.weight)
        a_m = hc.s_alpha * torch.tanh(torch.einsum("btid,d->bti", Hn, hc.w_pre)) + hc.pre
        a_r = hc.s_alpha * torch.tanh(torch.einsum("btid,dj->btij", Hn, hc.w_res)) + hc.res
        beta = hc.s_beta * torch.tanh(torch.einsum("btid,d->bti", Hn, hc.w_post)) + hc.post
        h = torch.einsum("bti,btid->btd", a_m, H)
        return torch.einsum("bti,btd->btid", beta, f(h)) + torch.einsum("btij,btid->btjd", a_r, H)

    H = sublayer(X, b.attn_hc, lambda h: b.attn(rms(h, b.attn_norm.weight), rope))
    torch.testing.assert_close(Y, sublayer(H, b.ffn_hc, lambda h: b.ffn(rms(h, b.ffn_norm.weight))))


@pytest.mark.parametrize("variant", [{}, {"mode": "static"}, {"constraint": "none"},
                                     {"constraint": "none", "mode": "static", "streams": 2}])
def test_fresh_hyper_connection_model_computes_pre_ln(variant):
    """At init n equal copies of the stream stay equal (pre reads stream k mod n, res = I, post = 1), so
    a fresh HC / mHC model with Pre-LN's weights gives Pre-LN's logits (mHC to within its e^-8 gap)."""
    hyper = d.build_model(small("mhc", **variant)).eval()
    pre = d.build_model(small("pre")).eval()
    state = {k.replace("norm.norm.", "norm."): v for k, v in hyper.state_dict().items()}
    pre.load_state_dict({k: state[k] for k in pre.state_dict()})
    ids = torch.randint(0, 61, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(hyper(ids).logits, pre(ids).logits, rtol=1e-3, atol=1e-4)


def test_mhc_residual_state_is_n_streams_side_by_side():
    """Blocks pass (B, T, n*D): the embedding copied into n streams; the head reads their sum."""
    model = d.build_model(small("mhc", streams=3))
    randomize(model)
    ids = torch.randint(0, 61, (2, 5))
    out = model(ids, output_hidden_states=True)
    assert [h.shape for h in out.hidden_states] == [(2, 5, 96)] * 5
    torch.testing.assert_close(out.hidden_states[0], model.embed(ids).repeat(1, 1, 3))
    last = out.hidden_states[-1].unflatten(-1, (3, 32)).sum(-2)
    torch.testing.assert_close(out.logits, model.lm_head(rms(last, model.norm.norm.weight)))


@pytest.mark.parametrize("option,value,says", [("streams", 1, "[2, 16], got 1"), ("mode", "sometimes", "one of: dynamic, static"),
                                               ("constraint", "birkhoff", "one of: sinkhorn, none"),
                                               ("sinkhorn_iters", 0, "[1, 100], got 0")])
def test_mhc_bad_options_name_the_value_and_the_choices(option, value, says):
    with pytest.raises(ConfigError, match=f"{option}.*{repr(value) if isinstance(value, str) else ''}") as err:
        small("mhc", **{option: value})
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("option,value", [("base_depth", 0), ("base_depth", 2.5), ("alpha", 1.5), ("alpha", -0.1)])
def test_completep_bad_options_are_refused(option, value):
    with pytest.raises(ConfigError, match=f"completep option '{option}'.*got {value!r}"):
        small("completep", **{option: value})


def test_depth_dependent_constants_follow_the_model_depth():
    assert d.build_model(small("lns-uniform", n_layers=16)).blocks[3].attn_norm.scale == pytest.approx(0.25)
    assert d.build_model(small("keel", n_layers=6)).blocks[4].attn_resid.scale == 12.0
    assert d.build_model(small("completep", n_layers=6, base_depth=3)).blocks[0].attn_out.scale == 0.5
    assert math.isclose(d.build_model(small("completep", n_layers=4, base_depth=4)).blocks[1].ffn_out.scale, 1.0)
