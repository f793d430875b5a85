"""The streamed engine's attention / MLP units and logit lens equal the in-memory engine's (which
test_sublayers_lens.py checks against transformers with a projection zeroed and the head applied by hand), in the
same one pass over the weights: a depthlab run, Llama and two MoE families of the registry (Qwen3-MoE, Mixtral).

Equality: max |Δ| over every number of the ``sublayers`` and ``lens`` sections (contribution, angular, loss and
Δloss of each unit per block; lens loss, top-1 agreement, KL per state)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import family_dir, flat, hf_dir

from depthlab.analysis.diagnostics import DiagnoseOptions, diagnose, load_target
from depthlab.targets.stream.open import open_streamed
from depthlab.targets.stream.sweep import SweepSettings

OPTS = dict(tokens=96, seq_len=32, batch_size=2, jacobian=False, progress=False, joint_check=False)
TOL = {"run": 1e-5, "llama": 1e-5, "qwen3_moe": 1e-4, "mixtral": 1e-4}  # MoE routing sums in another order


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def units_lens_diff(a: dict, b: dict) -> float:
    """max |Δ| over the sublayers and lens sections of two reports (each must have both, with the same keys)."""
    pairs = [(a["sublayers"][u][k], b["sublayers"][u][k]) for u in ("attn", "mlp")
             for k in ("contribution", "angular", "loss", "delta_loss")]
    pairs += [([a["sublayers"]["base_loss"]], [b["sublayers"]["base_loss"]])]
    pairs += [(a["lens"][k], b["lens"][k]) for k in ("loss", "agreement", "kl")]
    assert a["sublayers"]["tokens"] == b["sublayers"]["tokens"] and a["lens"]["tokens"] == b["lens"]["tokens"]
    worst = 0.0
    for x, y in pairs:
        x, y = flat(x), flat(y)
        assert len(x) == len(y) > 0
        worst = max([worst, *(abs(u - v) for u, v in zip(x, y))])
    return worst


def _run(tmp_path: Path) -> Path:
    import depthlab as d
    from depthlab.train import TrainConfig, train

    out = tmp_path / "run"
    cfg = d.from_preset("tiny", n_layers=4, d_model=32, n_heads=4, d_ff=64, scheme="lns")
    train(cfg, TrainConfig(data="builtin", tokenizer="bytes", steps=2, batch_size=4, seq_len=32, eval_every=0,
                           eval_tokens=256, variance_every=0, ckpt_every=0, device="cpu"), out, quiet=True)
    return out





@pytest.mark.parametrize("kind", list(TOL))
def test_units_and_lens_streamed_equal_in_memory_in_one_weight_pass(tmp_path, kind):
    path = _run(tmp_path) if kind == "run" else family_dir(tmp_path, kind)
    opts = DiagnoseOptions(**OPTS)
    mem = diagnose(load_target(str(path)), opts)
    target = open_streamed(str(path))
    streamed = diagnose(target, opts)
    worst = units_lens_diff(mem, streamed)
    assert worst <= TOL[kind], f"{kind}: max |Δ| = {worst:.3g}"
    L = streamed["model"]["n_layers"]
    assert len(streamed["sublayers"]["attn"]["delta_loss"]) == L and len(streamed["lens"]["loss"]) == L + 1
    assert streamed["lens"]["agreement"][-1] == 1.0 and abs(streamed["lens"]["loss"][-1] - streamed["loss"]["loss"]) < 1e-6
    eng = streamed["engine"]
    assert eng["weight_passes"] == 1 and eng["layers_computed"] == L
    assert set(target.source.store.meter.reads.values()) == {1}  # each tensor read once: units and lens included
    n_batches = 2
    # block evaluations per batch: base L, removal sum_l (L - l), units 2 sum_l (L - l + 1), swap sum_l<L (L - l + 1)
    swap = sum(L - l + 1 for l in range(1, L))
    assert eng["block_evals"] == n_batches * (L + L * (L - 1) // 2 + L * (L + 1) + swap)


def test_the_lens_decoded_one_sequence_at_a_time_and_units_without_removal(tmp_path):
    """Lens chunks of one sequence (max_rows = seq_len) give the numbers of whole batches; with --no-removal the units
    still report contribution and angular distance (no unit streams: L block evaluations per batch)."""
    path = hf_dir(tmp_path, "llama", 3)
    opts = DiagnoseOptions(**OPTS)
    mem = diagnose(load_target(str(path)), opts)
    one = diagnose(open_streamed(str(path)), opts, settings=SweepSettings(max_rows=32, progress=False))
    assert units_lens_diff(mem, one) <= 1e-5
    bare = DiagnoseOptions(**{**OPTS, "removal": False, "swap": False})
    got = diagnose(open_streamed(str(path)), bare)
    want = diagnose(load_target(str(path)), bare)
    assert "loss" not in got["sublayers"]["attn"] and got["engine"]["block_evals"] == 2 * 3
    for unit in ("attn", "mlp"):
        for key in ("contribution", "angular"):
            assert max(abs(u - v) for u, v in zip(got["sublayers"][unit][key], want["sublayers"][unit][key])) <= 1e-5
