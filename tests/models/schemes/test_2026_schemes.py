"""The 2026 depth schemes (docs/paper.md §9.9-9.12), each against its source's definition computed naively here with
the same weights: Attention Residuals against a loop over the earlier outputs (the paper's eqs. 2-6 and its
pseudo-code), GPAS's gradients against a reference whose backward skips the scaling (and a negative control
without the stop-gradient), SiameseNorm against the authors' DeiT block, HybridNorm against QKV-norm attention
and a Post-Norm FFN written out. (That they compile is the contract's, tests/models/schemes/test_contract.py.)"""

import math

import pytest
import torch
import torch.nn.functional as F

import depthlab as d
from depthlab.models.schemes import attnres_slots


def small(scheme, **kw):
    return d.from_preset("llama-9m", scheme=scheme, **{"n_layers": 4, "d_model": 32, "n_heads": 2, "d_ff": 48,
                                                         "vocab_size": 61, **kw})


def rms(v, w=1.0, eps=1e-6):  # plain RMSNorm, independent of depthlab's
    return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * w


def randomize(model, scale=0.3):
    """Every parameter moved off its init (the zero pseudo-queries and gates included)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)


# ---------------------------------------------------------------------------------------- Attention Residuals
def depth_read(op, sources):
    """Paper eqs. 2-4 / the official pseudo-code: softmax over the stacked sources of w . RMSNorm(v_i)."""
    V = torch.stack(sources)  # [N, B, T, D]
    logits = torch.einsum("d,nbtd->nbt", op.query, rms(V, op.key_gain))
    return torch.einsum("nbt,nbtd->btd", logits.softmax(0), V)


def sub_layers(b, rope):
    """Block b's attention and FFN branches, each with its pre-norm."""
    return (lambda h: b.attn(rms(h, b.attn_norm.weight), rope)), (lambda h: b.ffn(rms(h, b.ffn_norm.weight)))


def naive_attnres(model, ids, blocks):
    """Logits of an AttnRes model computed with Python lists of sources. Full: every sub-layer output is a
    source. Block: the official forward (a block boundary every ``size`` layers, counted from layer 0)."""
    T = ids.shape[1]
    rope, emb = model.rope(T, ids.device), model.embed(ids)
    size = -(-model.cfg.n_layers // blocks) if blocks else None
    done, partial = [emb], emb  # Full: done = every source; Block: done = completed blocks, partial = b_n^i
    if size is not None:
        done = []
    for i, b in enumerate(model.blocks):
        attn, ffn = sub_layers(b, rope)
        if size is None:
            done.append(attn(depth_read(b.attn_depth, done)))
            done.append(ffn(depth_read(b.ffn_depth, done)))
            continue
        h = depth_read(b.attn_depth, done + [partial])
        if i % size == 0:
            done, partial = done + [partial], None
        partial = attn(h) if partial is None else partial + attn(h)
        partial = partial + ffn(depth_read(b.ffn_depth, done + [partial]))
    final = depth_read(model.norm.depth, done if size is None else done + [partial])
    return model.lm_head(rms(final, model.norm.norm.weight))


@pytest.mark.parametrize("n_layers,blocks", [(4, 0), (5, 2), (6, 3), (3, 3)])  # 3 blocks of 3: one per layer
def test_attnres_equals_a_loop_over_the_earlier_outputs(n_layers, blocks):
    model = d.build_model(small("attnres", n_layers=n_layers, blocks=blocks))
    randomize(model)
    ids = torch.randint(0, 61, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, naive_attnres(model, ids, blocks), rtol=1e-4, atol=1e-4)


def test_attnres_sources_follow_paper_eq_6():
    """Block AttnRes over 5 layers in 2 blocks (3 + 2 layers): the first sub-layer of a block reads the
    completed blocks, the others also the block's partial sum; every sub-layer adds into its block's slot."""
    labels, layout = attnres_slots(5, 2)
    assert labels == ["embedding", "layers 1-3", "layers 4-5"]
    assert layout == [((1, 1), (2, 1)), ((2, 1), (2, 1)), ((2, 1), (2, 1)), ((2, 2), (3, 2)), ((3, 2), (3, 2))]
    labels, layout = attnres_slots(2, 0)  # Full: one slot per sub-layer, each reading all before it
    assert labels == ["embedding", "attn 1", "ffn 1", "attn 2", "ffn 2"]
    assert layout == [((1, 1), (2, 2)), ((3, 3), (4, 4))]


@pytest.mark.parametrize("blocks", [0, 2])
def test_fresh_attnres_computes_pre_ln(blocks):
    """Zero pseudo-queries: each reader averages its sources, whose sum is Pre-LN's residual stream, and the
    next RMSNorm removes the 1/K (exactly so with a negligible epsilon)."""
    attnres = d.build_model(small("attnres", blocks=blocks, norm_eps=1e-12)).eval()
    pre = d.build_model(small("pre", norm_eps=1e-12)).eval()
    state = {k.replace("norm.norm.", "norm."): v for k, v in attnres.state_dict().items()}
    pre.load_state_dict({k: state[k] for k in pre.state_dict()})
    ids = torch.randint(0, 61, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(attnres(ids).logits, pre(ids).logits, rtol=1e-4, atol=1e-5)


def test_attnres_state_stacks_the_sources():
    model = d.build_model(small("attnres", n_layers=2))
    ids = torch.randint(0, 61, (1, 5))
    states = model(ids, output_hidden_states=True).hidden_states
    assert [h.shape[-1] for h in states] == [5 * 32] * 3  # embedding + 2 x 2 sub-layer outputs
    torch.testing.assert_close(states[0][..., :32], model.embed(ids))
    assert states[0][..., 32:].abs().max() == 0 and states[1][..., 3 * 32:].abs().max() == 0  # not yet written


def test_attnres_refuses_a_pruned_model_in_one_line():
    from depthlab.base.errors import ConfigError

    with pytest.raises(ConfigError, match="attnres cannot run a pruned model") as err:
        small("attnres", n_layers=2, block_depths=[1, 3])
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------- GPAS
class ForwardOnlyScale(torch.autograd.Function):
    """The reference: y = (1 - SiLU(g)) x forward; backward dL/dx = dL/dy, dL/dg = -SiLU'(g) <x, dL/dy>."""

    @staticmethod
    def forward(ctx, x, g):
        ctx.save_for_backward(x, g)
        return (1 - F.silu(g)) * x

    @staticmethod
    def backward(ctx, grad):
        x, g = ctx.saved_tensors
        s = torch.sigmoid(g)
        return grad, -(s * (1 + g * (1 - s))) * (x * grad).sum().reshape(1)


def gpas_reference(model, ids, labels, scale):
    """Loss of a GPAS model computed block by block, the scaling done by ``scale(x, gate)``."""
    T = ids.shape[1]
    rope, x = model.rope(T, ids.device), model.embed(ids)
    for b in model.blocks:
        g = b.resid_scale.gate
        x = scale(x + b.attn(rms(x, b.attn_norm.weight), rope), g)
        x = scale(x + b.ffn(rms(x, b.ffn_norm.weight)), g)
    logits = model.lm_head(rms(x, model.norm.weight))
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def grads(model, loss):
    model.zero_grad()
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_gpas_gradients_pass_the_scaling_unscaled():
    """With gates at 0.5 (each residual add scaled by s = 1 - SiLU(0.5) = 0.69), every parameter's gradient is
    the reference's, whose backward skips the scaling. A plain scaling (no stop-gradient) multiplies the
    gradient reaching block 1's attention by s at each of the 8 scalings it crosses: the check would see it."""
    model = d.build_model(small("gpas"))
    randomize(model, 0.1)
    with torch.no_grad():
        for b in model.blocks:
            b.resid_scale.gate.fill_(0.5)
    ids = torch.randint(0, 61, (2, 9))
    labels = ids.roll(-1, 1)
    ours = grads(model, model(ids, labels=labels).loss)
    reference = grads(model, gpas_reference(model, ids, labels, ForwardOnlyScale.apply))
    for name in ours:
        torch.testing.assert_close(ours[name], reference[name], rtol=1e-4, atol=1e-5 * float(ours[name].abs().max()),
                                   msg=name)
    plain = grads(model, gpas_reference(model, ids, labels, lambda x, g: (1 - F.silu(g)) * x))
    s = 1 - F.silu(torch.tensor(0.5)).item()
    first = "blocks.0.attn.q_proj.weight"
    torch.testing.assert_close(plain[first], ours[first] * s ** 8, rtol=1e-4, atol=1e-5 * float(ours[first].abs().max()))


def test_gpas_gradient_at_each_scaling_equals_the_gradient_after_it():
    model = d.build_model(small("gpas", n_layers=2))
    with torch.no_grad():
        for b in model.blocks:
            b.resid_scale.gate.fill_(0.7)
    seen = []

    def hook(_m, inputs, output):
        inputs[0].retain_grad()
        output.retain_grad()
        seen.append((inputs[0], output))

    for b in model.blocks:
        b.resid_scale.register_forward_hook(hook)
    ids = torch.randint(0, 61, (2, 6))
    out = model(ids, labels=ids)
    out.loss.backward()
    assert len(seen) == 4
    for x, y in seen:
        torch.testing.assert_close(y, (1 - F.silu(torch.tensor(0.7))) * x)  # forward: scaled
        torch.testing.assert_close(x.grad, y.grad, rtol=0, atol=0)  # backward: the gradient passes unchanged


def test_fresh_gpas_is_pre_ln():
    gpas, pre = d.build_model(small("gpas")).eval(), d.build_model(small("pre")).eval()
    pre.load_state_dict({k: v for k, v in gpas.state_dict().items() if "resid_scale" not in k})
    ids = torch.randint(0, 61, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(gpas(ids).logits, pre(ids).logits, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------- SiameseNorm
def test_siamese_block_and_read_out_follow_the_authors_deit_code():
    """x (Post-Norm-like), y (Pre-Norm-like): x = N(x); z = f(N(x + N(y))); x += z / sqrt(2l); y += z;
    twice per block; the head reads N_f(N(x) + N(y)); both streams start as the embedding."""
    model = d.build_model(small("siamese"))
    randomize(model)
    ids = torch.randint(0, 61, (2, 6))
    out = model(ids, output_hidden_states=True)
    e = model.embed(ids)
    torch.testing.assert_close(out.hidden_states[0], torch.cat((e, e), -1))
    rope = model.rope(6, e.device)
    for i in (0, 2):
        b, (y, x) = model.blocks[i], out.hidden_states[i].chunk(2, -1)
        c = math.sqrt(2 * (i + 1))
        x = rms(x, b.attn_post.weight)
        z = b.attn(rms(x + rms(y, b.attn_pre.weight), b.attn_in.weight), rope)
        x, y = x + z / c, y + z
        x = rms(x, b.ffn_post.weight)
        z = b.ffn(rms(x + rms(y, b.ffn_pre.weight), b.ffn_in.weight))
        torch.testing.assert_close(out.hidden_states[i + 1], torch.cat((y + z, x + z / c), -1))
    y, x = out.hidden_states[-1].chunk(2, -1)
    n = model.norm
    torch.testing.assert_close(out.logits, model.lm_head(rms(rms(x, n.post.weight) + rms(y, n.pre.weight), n.final.weight)))


# ---------------------------------------------------------------------------------------- HybridNorm
def qkv_norm_attention(a, x, rope):
    """Multi-head attention with q, k and v each RMS-normalised per head (before RoPE), written out."""
    B, T, _ = x.shape

    def heads(proj, norm):
        return rms(proj(x).view(B, T, -1, a.head_dim), norm.weight).transpose(1, 2)

    cos, sin = rope
    q, k, v = heads(a.q_proj, a.q_norm), heads(a.k_proj, a.k_norm), heads(a.v_proj, a.v_norm)
    rot = lambda t: torch.cat((-t[..., t.shape[-1] // 2:], t[..., :t.shape[-1] // 2]), -1)  # noqa: E731
    q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
    att = (q @ k.transpose(-1, -2) / math.sqrt(a.head_dim)).masked_fill(torch.ones(T, T).triu(1).bool(), -math.inf)
    return a.o_proj((att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, -1))


@pytest.mark.parametrize("first_block", ["hybrid", "pre"])
def test_hybridnorm_blocks_follow_their_equations(first_block):
    """x' = x + A_qkv(x); y = N(x') + F(N(x')). HybridNorm*: block 1 is x' = x + A_qkv(N(x)); y = x' + F(N(x'))."""
    model = d.build_model(small("hybridnorm", first_block=first_block))
    randomize(model)
    ids = torch.randint(0, 61, (2, 6))
    states = model(ids, output_hidden_states=True).hidden_states
    rope = model.rope(6, ids.device)
    for i in (0, 2):
        b, x = model.blocks[i], states[i]
        if i == 0 and first_block == "pre":
            h = x + qkv_norm_attention(b.attn, rms(x, b.attn_norm.weight), rope)
            torch.testing.assert_close(states[1], h + b.ffn(rms(h, b.ffn_norm.weight)))
            continue
        h = rms(x + qkv_norm_attention(b.attn, x, rope), b.ffn_norm.weight)
        torch.testing.assert_close(states[i + 1], h + b.ffn(h))


def test_attnres_blocks_beyond_the_depth_are_refused_not_silently_capped():
    """Issue 49, cause 12: ``attnres:blocks=99`` on 4 layers trained (the option's 0..4096 range ignores the depth;
    99 blocks silently became 4); the check holds it against the model's layer count, by preset or by --set."""
    from depthlab.base.errors import ConfigError
    from depthlab.models.configure import configure, from_preset

    with pytest.raises(ConfigError, match=r"attnres blocks=99 exceeds the model's 4 layers; give 0 .* or 1\.\.4"):
        from_preset("tiny", n_layers=4, scheme="attnres:blocks=99")
    cfg = from_preset("tiny", n_layers=8, scheme="attnres:blocks=8")
    with pytest.raises(ConfigError, match="exceeds the model's 4 layers"):
        configure(cfg, n_layers=4)  # a depth lowered under the blocks afterwards
    assert from_preset("tiny", n_layers=4, scheme="attnres:blocks=4").scheme_options == {"blocks": 4}
