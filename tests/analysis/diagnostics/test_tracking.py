"""Depth tracking's quantities against naive computations and the weights themselves."""

import math

import pytest
import torch

import depthlab as d
from depthlab.analysis.diagnostics.probes import TRACKED, deep_mean, deepest_third, depth_probe


def model(scheme="lns"):
    cfg = d.from_preset("tiny", scheme=scheme, n_layers=5, d_model=32, n_heads=2, d_ff=48, vocab_size=50)
    m = d.build_model(cfg).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 2.0)
    return m


def test_probe_equals_naive_computations():
    m = model()
    ids = torch.randint(0, 50, (3, 12))
    labels = ids.roll(-1, 1)
    got = depth_probe(m, ids, labels)
    assert set(got) == set(TRACKED) - {"layer_grad_norm"} and all(len(v) == 5 for v in got.values())
    with torch.no_grad():
        hs = m(ids, output_hidden_states=True).hidden_states
        base = m(ids, labels=labels).loss.item()
    for l in range(1, 6):
        a, b = hs[l - 1].double(), hs[l].double()
        contrib = ((b - a).norm(dim=-1) / a.norm(dim=-1)).mean().item()
        assert got["layer_contribution"][l - 1] == pytest.approx(contrib, rel=1e-9)
        cos = torch.nn.functional.cosine_similarity(a, b, dim=-1).clamp(-1, 1)
        assert got["layer_angular"][l - 1] == pytest.approx((cos.acos() / math.pi).mean().item(), abs=1e-3)
        assert got["layer_variance"][l - 1] == pytest.approx(b.var(unbiased=False).item(), rel=1e-6)
        with torch.no_grad():  # removal by hand: run the remaining blocks on x^l
            h = hs[l - 1]
            for blk in m.blocks[l:]:
                h = blk(h, m.rope(12, h.device))
            loss = torch.nn.functional.cross_entropy(m.head(h).flatten(0, 1), labels.flatten()).item()
        assert got["layer_removal"][l - 1] == pytest.approx(loss - base, abs=1e-4)
        with torch.no_grad():  # the logit lens by hand: block l's output through the final norm and head
            lens = m.head(hs[l])
        lens_loss = torch.nn.functional.cross_entropy(lens.flatten(0, 1), labels.flatten()).item()
        assert got["layer_lens_loss"][l - 1] == pytest.approx(lens_loss, abs=1e-5)
        agree = (lens.argmax(-1) == m(ids).logits.argmax(-1)).double().mean().item()
        assert got["layer_lens_agreement"][l - 1] == pytest.approx(agree, abs=1e-9)
    assert got["layer_lens_agreement"][-1] == 1.0


def test_grad_norms_equal_the_norm_of_each_blocks_gradient_and_reach_the_monitor():
    from depthlab.analysis.diagnostics.probes import grad_norms
    from depthlab.analysis.monitor import DepthMonitor

    m = model().train()
    ids = torch.randint(0, 50, (2, 9))
    monitor = DepthMonitor(m, ids, every=1, removal=False)
    assert grad_norms(m.blocks) is None and "depth/grad_norm/block_01" not in monitor.step(0)  # no gradient yet
    m(ids[:, :-1], labels=ids[:, 1:]).loss.backward()
    want = [math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in b.parameters())) for b in m.blocks]
    assert grad_norms(m.blocks) == pytest.approx(want, rel=1e-5)
    torch.optim.SGD(m.parameters(), lr=0.1).step()  # the loop's order: backward, step, probe, zero_grad
    scalars = monitor.step(1)
    assert [scalars[f"depth/grad_norm/block_0{b}"] for b in range(1, 6)] == pytest.approx(want, rel=1e-5)


def test_norm_gain_is_the_mean_abs_weight_of_both_pre_norms():
    m = model()
    got = depth_probe(m, torch.randint(0, 50, (1, 6)), removal=False)
    assert "layer_removal" not in got
    for block, g in zip(m.blocks, got["layer_norm_gain"]):
        w = torch.cat([block.attn_norm.weight, block.ffn_norm.weight]).abs().mean().item()
        assert g == pytest.approx(w)


def test_deepest_third():
    assert deepest_third(16) == [12, 13, 14, 15, 16] and deepest_third(2) == [2]
    assert deep_mean([0, 0, 3.0, None, 5.0]) == pytest.approx(5.0)
