"""Attention / MLP units and the logit lens against independent computations: transformers' own forward with a
projection zeroed, a naive per-block loop over depthlab's blocks, the final norm and head applied by hand."""

import copy

import torch
import torch.nn.functional as F

import depthlab as d
from depthlab.analysis.diagnostics import ResidualCapture, find_layers
from depthlab.analysis.diagnostics.lens import logit_lens
from depthlab.analysis.diagnostics.sublayers import SublayerAccumulator
from depthlab.targets.branches import branch_ends, zeroed


def _hf_cap(hf):
    return ResidualCapture(hf, find_layers(hf), lambda x: hf(input_ids=x, use_cache=False).logits)


def _sweep(cap, batches, L):
    acc = SublayerAccumulator(L)
    for ids in batches:
        x, y = ids[:, :-1], ids[:, 1:]
        logits, states, calls = cap.run(x, keep_calls=True)
        acc.update(cap, x, y, logits, states, calls)
    return acc.result()


def test_sublayer_removal_equals_transformers_with_the_output_projection_zeroed(tiny_hf):
    hf = tiny_hf(4)
    batches = [torch.randint(300, (2, 13)) for _ in range(2)]
    res = _sweep(_hf_cap(hf), batches, 4)
    with torch.no_grad():
        full = sum(float(hf(input_ids=ids, labels=ids).loss) for ids in batches) / 2
        assert abs(res["base_loss"] - full) < 1e-5
        for l in range(1, 5):
            for unit, proj in (("attn", "self_attn.o_proj"), ("mlp", "mlp.down_proj")):
                cut = copy.deepcopy(hf)
                cut.model.layers[l - 1].get_submodule(proj).weight.zero_()
                ref = sum(float(cut(input_ids=ids, labels=ids, use_cache=False).loss) for ids in batches) / 2
                assert abs(res[unit]["loss"][l - 1] - ref) < 1e-5, (unit, l)
                assert abs(res[unit]["delta_loss"][l - 1] - (ref - full)) < 1e-5


def test_sublayer_contribution_and_angle_equal_a_naive_loop_over_depthlab_blocks(make_cfg):
    torch.manual_seed(2)
    model = d.build_model(make_cfg("sandwich")).eval()  # an output norm in each branch: the branch end is after it
    cap = ResidualCapture(model, find_layers(model), lambda x: model(x).logits)
    ids = torch.randint(300, (2, 11))
    res = _sweep(cap, [ids], 4)
    x = ids[:, :-1]
    with torch.no_grad():
        h = model.embed_norm(model.embed(x))
        rope = model.rope(x.shape[1], h.device)
        for l, b in enumerate(model.blocks, 1):
            mid = b.resid_scale(h + b.attn_out(b.attn(b.attn_norm(b.attn_prescale(h)), rope)))
            out = b(h, rope)
            for unit, (a, c) in (("attn", (h, mid)), ("mlp", (mid, out))):
                ratio = ((c - a).norm(dim=-1) / a.norm(dim=-1)).mean()
                angle = (F.cosine_similarity(a.double(), c.double(), dim=-1).clamp(-1, 1).acos() / torch.pi).mean()
                assert abs(res[unit]["contribution"][l - 1] - float(ratio)) < 1e-5, (unit, l)
                assert abs(res[unit]["angular"][l - 1] - float(angle)) < 1e-5, (unit, l)
            # the MLP removed by hand: the block's output is mid; the loss of the rest of the model from there
            rest = model.head(model.run_blocks(mid, l, None))
            ref = float(F.cross_entropy(rest.flatten(0, 1), ids[:, 1:].flatten()))
            assert abs(res["mlp"]["loss"][l - 1] - ref) < 1e-5, l
            h = out


def test_zeroed_restores_the_model(tiny_hf):
    hf = tiny_hf(2)
    ids = torch.randint(300, (1, 7))
    with torch.no_grad():
        before = hf(input_ids=ids).logits
        with zeroed(*branch_ends(find_layers(hf)[0])):
            during = hf(input_ids=ids).logits
        after = hf(input_ids=ids).logits
    assert not torch.allclose(before, during)
    torch.testing.assert_close(before, after)


def test_logit_lens_equals_final_norm_and_head_by_hand(tiny_hf, make_cfg):
    hf = tiny_hf(4)
    ids = torch.randint(300, (2, 12))
    x, y = ids[:, :-1], ids[:, 1:]
    cap = _hf_cap(hf)
    lens = logit_lens(cap, x, y)
    with torch.no_grad():
        out = hf(input_ids=x, output_hidden_states=True)
        _, states = cap.run(x)
        for i in range(5):
            logits = hf.lm_head(hf.model.norm(states[i]))
            assert abs(lens["loss"][i] - float(F.cross_entropy(logits.flatten(0, 1), y.flatten()))) < 1e-5, i
            agree = float((logits.argmax(-1) == out.logits.argmax(-1)).double().mean())
            assert abs(lens["agreement"][i] - agree) < 1e-9, i
    # at the last layer the lens is the model itself
    assert lens["agreement"][-1] == 1.0 and abs(lens["kl"][-1]) < 1e-6
    assert abs(lens["loss"][-1] - float(hf(input_ids=ids, labels=ids).loss)) < 1e-5
    torch.manual_seed(3)
    model = d.build_model(make_cfg("lns")).eval()
    dcap = ResidualCapture(model, find_layers(model), lambda z: model(z).logits)
    _, states = dcap.run(x)
    with torch.no_grad():
        for i in range(5):
            torch.testing.assert_close(dcap.decode(x, states, i), model.head(states[i]))
