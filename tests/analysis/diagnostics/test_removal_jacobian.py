"""Layer removal vs transformers with the layer deleted; Jacobians vs torch.autograd."""

import copy

import torch

import depthlab as d
from depthlab.analysis.diagnostics import RemovalAccumulator, ResidualCapture, block_jacobian, block_jacobians, find_layers


def _hf_cap(hf):
    return ResidualCapture(hf, find_layers(hf), lambda x: hf(input_ids=x, use_cache=False).logits)


def test_removal_sweep_equals_transformers_with_the_layer_deleted(tiny_hf):
    hf = tiny_hf(4)
    cap = _hf_cap(hf)
    acc = RemovalAccumulator(4)
    batches = [torch.randint(300, (2, 17)) for _ in range(2)]
    for ids in batches:
        x, y = ids[:, :-1], ids[:, 1:]
        logits, states = cap.run(x)
        acc.update(cap, x, y, logits, states)
    res = acc.result()
    with torch.no_grad():
        full = sum(float(hf(input_ids=ids, labels=ids).loss) for ids in batches) / len(batches)
        assert abs(res["base_loss"] - full) < 1e-5
        for l in range(1, 5):
            cut = copy.deepcopy(hf)
            del cut.model.layers[l - 1]
            cut.config.num_hidden_layers = 3
            ref = sum(float(cut(input_ids=ids, labels=ids, use_cache=False).loss) for ids in batches) / len(batches)
            assert abs(res["loss"][l - 1] - ref) < 1e-5, (l, res["loss"][l - 1], ref)
            assert abs(res["delta_loss"][l - 1] - (ref - full)) < 1e-5


def test_removal_sweep_on_depthlab_lns_model_uses_its_own_blocks(make_cfg):
    torch.manual_seed(1)
    model = d.build_model(make_cfg("lns")).eval()
    cap = ResidualCapture(model, find_layers(model), lambda x: model(x).logits)
    ids = torch.randint(300, (2, 13))
    x, y = ids[:, :-1], ids[:, 1:]
    logits, states = cap.run(x)
    acc = RemovalAccumulator(4)
    acc.update(cap, x, y, logits, states)
    with torch.no_grad():
        for l in range(1, 5):
            h = model.embed(x)
            h = model.run_blocks(h, 0, l - 1)
            h = model.run_blocks(h, l, None)  # block l skipped
            ref = float(torch.nn.functional.cross_entropy(model.head(h).flatten(0, 1), y.flatten()))
            assert abs(acc.result()["loss"][l - 1] - ref) < 1e-5
        # skipping several blocks from scratch agrees with the cached replay
        a = cap.run_without(x, {2, 3})
        b = cap.run_skipping(x, states, {2, 3})
        torch.testing.assert_close(a, b)


def test_block_jacobian_equals_autograd_functional(tiny_model, tiny_hf):
    ids = torch.randint(300, (1, 9))
    cap = ResidualCapture(tiny_model, find_layers(tiny_model), lambda x: tiny_model(x).logits)
    _, states, calls = cap.run(ids, keep_calls=True)
    t, l = 6, 3
    rope = tiny_model.rope(9, "cpu")

    def f(v):
        h = states[l - 1].clone()
        h[0, t] = v
        return tiny_model.blocks[l - 1](h, rope)[0, t]

    ref = torch.autograd.functional.jacobian(f, states[l - 1][0, t])
    torch.testing.assert_close(block_jacobian(cap.layers[l - 1], calls[l - 1], states[l - 1], t), ref, rtol=1e-5, atol=1e-6)
    # the same on a transformers layer (kwargs-called, rotary tables and mask recorded by the hooks)
    hf = tiny_hf(4)
    hcap = _hf_cap(hf)
    _, hs, hcalls = hcap.run(ids, keep_calls=True)
    pe = hcalls[1].kwargs["position_embeddings"]

    def g(v):
        h = hs[1].clone()
        h[0, t] = v
        return hf.model.layers[1](h, attention_mask=None, position_embeddings=pe)[0, t]

    torch.testing.assert_close(block_jacobian(hcap.layers[1], hcalls[1], hs[1], t),
                               torch.autograd.functional.jacobian(g, hs[1][0, t]), rtol=1e-5, atol=1e-6)
    out = block_jacobians(cap, [ids[0], ids[0]], [t, t], layers=[l], keep=[l])
    torch.testing.assert_close(out["matrices"][l], ref, rtol=1e-5, atol=1e-6)
    eye = torch.eye(ref.shape[0])
    assert abs(out["per_layer"][0]["rel_dist_identity"] - float((ref - eye).norm() / ref.shape[0] ** 0.5)) < 1e-5
