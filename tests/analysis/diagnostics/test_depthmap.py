"""The depth-attention map of Attention Residuals (``depth_attention``): each reader's softmax weights over the
sources before it, averaged over tokens, as ``diagnose`` reports them and the trainer's depth probes track them,
against the weights computed naively from the sources here; absent for every other scheme."""

import pytest
import torch

import depthlab as d
from depthlab.analysis.diagnostics.depthmap import DepthMap
from depthlab.analysis.diagnostics.probes import depth_probe
from depthlab.analysis.monitor.names import probe_scalars


def small(scheme, **kw):
    return d.from_preset("llama-9m", scheme=scheme, **{"n_layers": 3, "d_model": 32, "n_heads": 2, "d_ff": 48,
                                                         "vocab_size": 61, **kw})


def rms(v, w=1.0, eps=1e-6):
    return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * w


def naive_weights(model, ids):
    """Full AttnRes by hand: each reader's softmax(w . RMSNorm(v_i)) over the list of sources, mean over tokens."""
    rope, sources, rows = model.rope(ids.shape[1], ids.device), [model.embed(ids)], []

    def read(op):
        V = torch.stack(sources)  # [K, B, T, D]
        alpha = torch.einsum("d,kbtd->kbt", op.query, rms(V, op.key_gain)).softmax(0)
        rows.append(alpha.mean(dim=(1, 2)))
        return torch.einsum("kbt,kbtd->btd", alpha, V)

    for b in model.blocks:
        sources.append(b.attn(rms(read(b.attn_depth), b.attn_norm.weight), rope))
        sources.append(b.ffn(rms(read(b.ffn_depth), b.ffn_norm.weight)))
    read(model.norm.depth)
    return rows


@pytest.fixture
def attnres():
    torch.manual_seed(0)
    model = d.build_model(small("attnres")).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


def test_probe_map_is_the_mean_softmax_weight_of_each_reader(attnres):
    ids = torch.randint(0, 61, (2, 9))
    out = depth_probe(attnres, ids, ids.roll(-1, 1))
    dm = out["depth_attention"]
    assert dm["readers"] == ["attn 1", "ffn 1", "attn 2", "ffn 2", "attn 3", "ffn 3", "final"]
    assert dm["sources"] == ["embedding", "attn 1", "ffn 1", "attn 2", "ffn 2", "attn 3", "ffn 3"] and dm["tokens"] == 18
    with torch.no_grad():
        expected = naive_weights(attnres, ids)
    for row, exp in zip(dm["weights"], expected):
        assert row[len(exp):] == [None] * (7 - len(exp))  # a reader cannot read what comes after it
        torch.testing.assert_close(torch.tensor(row[:len(exp)], dtype=torch.float64), exp.double(), rtol=1e-5, atol=1e-6)
    assert out["layer_removal"] and len(out["layer_variance"]) == 3  # the removal replays do not add to the map
    assert probe_scalars(out) == probe_scalars({k: v for k, v in out.items() if k != "depth_attention"})


class Batches:
    """Held-out windows given as tensors (B, T + 1), served as diagnose's batches are."""

    def __init__(self, windows):
        self.windows, self.seq_len, self.split, self.short = windows, windows[0].shape[1] - 1, "val", False
        self.requested = sum(w[:, :-1].numel() for w in windows)

    def __iter__(self):
        for w in self.windows:
            yield w[:, :-1], w[:, 1:]


def test_diagnose_reports_the_map_over_its_tokens(attnres, tmp_path):
    """diagnose's map covers exactly its held-out tokens (one more forward each), and the report page shows it."""
    from depthlab.analysis.diagnostics import DiagnoseOptions, diagnose
    from depthlab.analysis.diagnostics.report import write_report
    from depthlab.targets.target import Target

    windows = [torch.randint(0, 61, (2, 10)) for _ in range(3)]
    target = Target(attnres, "attnres-test", "depthlab", None, batches_for=lambda opts: Batches(windows))
    report = diagnose(target, DiagnoseOptions(batch_size=2, progress=False, jacobian=False))
    acc = DepthMap.of(attnres)
    with acc.recording(), torch.no_grad():
        for w in windows:
            attnres(w[:, :-1])
    assert report["depth_attention"] == acc.result() and report["depth_attention"]["tokens"] == 54
    for row in report["depth_attention"]["weights"]:
        assert sum(v for v in row if v is not None) == pytest.approx(1.0)
    assert "Depth attention" in write_report(report, tmp_path).read_text()
    assert (tmp_path / "depth_attention.png").exists()


def test_no_map_for_schemes_without_depth_readers():
    model = d.build_model(small("pre"))
    assert DepthMap.of(model) is None
    ids = torch.randint(0, 61, (2, 9))
    assert "depth_attention" not in depth_probe(model, ids, ids)
