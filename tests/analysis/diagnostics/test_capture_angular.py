"""Residual capture, the angular-distance pass (vs a naive per-pair per-token loop), its memory."""

import gc
import math
import warnings

import torch

from depthlab.analysis.diagnostics import (
    AngularAccumulator,
    ResidualCapture,
    VarianceAccumulator,
    find_layers,
    pair_matrix_to_layout,
)


def _cap(model):
    return ResidualCapture(model, find_layers(model), lambda ids: model(ids).logits)


def test_capture_reads_the_raw_residual_stream_of_depthlab_and_hf(tiny_model, tiny_hf):
    ids = torch.randint(300, (2, 12))
    logits, states = _cap(tiny_model).run(ids)
    ref = tiny_model(ids, output_hidden_states=True)
    assert len(states) == tiny_model.cfg.n_layers + 1
    for a, b in zip(states, ref.hidden_states):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    hf = tiny_hf()
    cap = ResidualCapture(hf, find_layers(hf), lambda x: hf(input_ids=x, use_cache=False).logits)
    _, states = cap.run(ids)
    out = hf(input_ids=ids, output_hidden_states=True)
    for a, b in zip(states[:-1], out.hidden_states[:-1]):
        torch.testing.assert_close(a, b)
    # HF's last hidden state is after the final norm; the capture keeps the raw residual
    torch.testing.assert_close(hf.model.norm(states[-1]), out.hidden_states[-1])
    assert not torch.allclose(states[-1], out.hidden_states[-1])


def test_angular_equals_naive_per_pair_per_token(tiny_model):
    cap = _cap(tiny_model)
    acc = AngularAccumulator(tiny_model.cfg.n_layers + 1, dtype=torch.float64)
    fast = AngularAccumulator(tiny_model.cfg.n_layers + 1)  # the default float32 Gram
    batches = [torch.randint(300, (3, 10)), torch.randint(300, (2, 10))]
    per_pair: dict[tuple[int, int], list[float]] = {}
    for ids in batches:
        _, states = cap.run(ids)
        acc.update(states)
        fast.update(states)
        with torch.no_grad():
            hs = tiny_model(ids, output_hidden_states=True).hidden_states
        for i in range(len(hs)):
            for j in range(len(hs)):
                for b in range(ids.shape[0]):
                    for t in range(ids.shape[1]):
                        u, v = hs[i][b, t].double(), hs[j][b, t].double()
                        c = float(u @ v / (u.norm() * v.norm()))
                        per_pair.setdefault((i, j), []).append(math.acos(max(-1.0, min(1.0, c))) / math.pi)
    mean = acc.mean()
    assert acc.count == 5 * 10
    for (i, j), vals in per_pair.items():
        assert abs(float(mean[i, j]) - sum(vals) / len(vals)) < 1e-6, (i, j)
        assert abs(float(fast.mean()[i, j]) - sum(vals) / len(vals)) < 5e-4, (i, j)
    layout = pair_matrix_to_layout(mean)  # [n-1][l-1] = d(x^l, x^{l+n})
    L = tiny_model.cfg.n_layers
    assert layout[0][0] == float(mean[0, 1]) and layout[L - 1][0] == float(mean[0, L])
    assert layout[1][L - 1] is None  # l + n > L + 1


def _live_tensor_bytes() -> int:
    gc.collect()
    seen, total = set(), 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance() on some module proxies warns
        objs = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    for obj in objs:
        if isinstance(obj, torch.Tensor) and not obj.is_meta:
            try:  # fake tensors left by torch.compile in other tests have no storage
                st = obj.untyped_storage()
                ptr = st.data_ptr()
            except RuntimeError:
                continue
            if ptr not in seen:
                seen.add(ptr)
                total += st.nbytes()
    return total


def test_angular_pass_memory_does_not_grow_with_tokens(tiny_model):
    """Live tensor memory while streaming 40 batches stays at its 3-batch level: a pass that kept
    every state (or every per-token distance) would grow linearly and fail."""
    cap = _cap(tiny_model)
    acc = AngularAccumulator(tiny_model.cfg.n_layers + 1)
    var = VarianceAccumulator(tiny_model.cfg.n_layers + 1)
    samples = []

    def stream(n):
        for _ in range(n):
            samples.append(_live_tensor_bytes())
            yield torch.randint(300, (8, 32))

    with torch.no_grad():
        for ids in stream(40):
            _, states = cap.run(ids)
            acc.update(states)
            var.update(states)
            del states
    early, late = max(samples[2:5]), max(samples[-5:])
    per_batch_states = (tiny_model.cfg.n_layers + 1) * 8 * 32 * 32 * 4
    assert late - early < per_batch_states, (early, late)
    assert acc.count == 40 * 8 * 32
    # the accumulator's own state is the (L+1)^2 float64 matrix, whatever the token count
    assert acc.state_nbytes() == (tiny_model.cfg.n_layers + 1) ** 2 * 8


def test_variance_matches_direct_computation(tiny_model):
    ids = torch.randint(300, (4, 16))
    _, states = _cap(tiny_model).run(ids)
    var = VarianceAccumulator(len(states))
    var.update([s[:2] for s in states])
    var.update([s[2:] for s in states])
    res = var.result()
    for i, s in enumerate(states):
        x = s.double()
        assert abs(res["variance"][i] - float(x.var(unbiased=False))) < 1e-9 * max(1.0, float(x.var()))
        assert abs(res["mean_norm"][i] - float(x.norm(dim=-1).mean())) < 1e-9 * float(x.norm(dim=-1).mean())
    assert len(res["norm_growth"]) == len(states) - 1
