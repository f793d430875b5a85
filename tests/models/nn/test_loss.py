"""The LM head's cross-entropy in chunks of rows equals the plain path (the head, F.cross_entropy on fp32 logits):
the loss and the gradients of its input and of the head's weight, with ignored targets, a last chunk shorter than
the others, under bf16 autocast, traced whole by torch.compile; and in the trainer's loss module, a whole model's
gradients."""

import pytest
import torch
import torch.nn.functional as F

from depthlab import build_model, from_preset
from depthlab.models.nn.loss import IGNORE_INDEX, default_rows, linear_cross_entropy
from depthlab.train.distributed import LMLoss


def plain(x, w, labels):
    return F.cross_entropy((x @ w.t()).float(), labels, ignore_index=IGNORE_INDEX)


def grads(fn, x, w, labels):
    x, w = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    loss = fn(x, w, labels)
    loss.backward()
    return loss.detach(), x.grad, w.grad


def inputs(n=37, d=16, v=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(n, d, generator=g), torch.randn(v, d, generator=g) * 0.3
    labels = torch.randint(v, (n,), generator=g)
    labels[::5] = IGNORE_INDEX  # padding and masked prompts count in no loss
    return x, w, labels


@pytest.mark.parametrize("rows", [1, 8, 37, 64])  # one row, an uneven last chunk, exactly one chunk, more than N
def test_chunked_loss_and_gradients_equal_the_plain_path(rows):
    x, w, labels = inputs()
    want = grads(plain, x, w, labels)
    got = grads(lambda a, b, c: linear_cross_entropy(a, b, c, rows), x, w, labels)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_gradient_is_scaled_by_what_comes_after_the_loss():
    x, w, labels = inputs()
    want = grads(lambda a, b, c: 2.5 * plain(a, b, c), x, w, labels)
    got = grads(lambda a, b, c: 2.5 * linear_cross_entropy(a, b, c, 8), x, w, labels)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_bf16_autocast_matches_the_plain_path_to_bf16_rounding():
    x, w, labels = inputs(n=64, d=32, v=96)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = grads(plain, x, w, labels)
        got = grads(lambda a, b, c: linear_cross_entropy(a, b, c, 16), x, w, labels)
    assert got[1].dtype == x.dtype and got[2].dtype == w.dtype  # fp32 inputs get fp32 gradients, as autocast's
    torch.testing.assert_close(got[0], want[0], rtol=1e-3, atol=1e-3)
    for a, b in zip(got[1:], want[1:]):  # the matmuls in bf16 (same rounding of the logits); dW summed in fp32
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3)


def test_no_counted_target_gives_nan_loss_and_zero_gradients():
    x, w, labels = inputs()
    labels[:] = IGNORE_INDEX
    loss, gx, gw = grads(lambda a, b, c: linear_cross_entropy(a, b, c, 8), x, w, labels)
    assert torch.isnan(loss) and torch.isnan(plain(x, w, labels))
    assert not gx.any() and not gw.any()


def test_torch_compile_traces_it_whole():
    """No graph break: the compiled trainer step stays one graph with the chunked loss in it."""
    x, w, labels = inputs()
    want = grads(lambda a, b, c: linear_cross_entropy(a, b, c, 8), x, w, labels)
    compiled = torch.compile(lambda a, b, c: linear_cross_entropy(a, b, c, 8), backend="aot_eager", fullgraph=True)
    for a, b in zip(grads(compiled, x, w, labels), want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_default_rows_keep_a_chunk_near_the_size_of_the_heads_input():
    assert default_rows(16_384, 32_000, 768) == 512  # llama-130m: 42 chunks of ~390 rows -> 512
    assert default_rows(16_384, 32_000, 2048) == 1024  # llama-1b
    assert default_rows(3, 10, 100) == 4 and default_rows(1, 32_000, 768) == 1


def test_bad_shapes_are_refused_in_one_line():
    x, w, labels = inputs()
    with pytest.raises(ValueError, match="x \\(N, D\\), weight \\(V, D\\)"):
        linear_cross_entropy(x[None], w, labels)


@pytest.mark.parametrize("scheme", ["pre", "lns"])
def test_the_trainers_loss_module_gives_the_same_loss_and_gradients(scheme):
    cfg = from_preset("tiny", n_layers=2, d_model=32, n_heads=2, d_ff=64, vocab_size=97, scheme=scheme)
    model = build_model(cfg)
    ids = torch.randint(97, (3, 11), generator=torch.Generator().manual_seed(1))
    labels = torch.roll(ids, -1, 1)
    labels[:, -1] = IGNORE_INDEX
    results = []
    for module in (LMLoss(model), LMLoss(model, chunked_ce=True, ce_rows=8)):
        model.zero_grad(set_to_none=True)
        out = module(ids, labels, output_hidden_states=True)
        out.loss.backward()
        results.append((out.loss.detach(), len(out.hidden_states), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (l0, h0, g0), (l1, h1, g1) = results
    torch.testing.assert_close(l1, l0, rtol=1e-6, atol=1e-6)
    assert h0 == h1 == 3 and set(g0) == set(g1)
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-4, atol=1e-6, msg=name)
    assert LMLoss(model, chunked_ce=True)(ids, labels, return_logits=True).logits.shape == (3, 11, 97)
