"""depthlab.analysis.theory: recursions (Lemma 3.2 / 4.1), gradient bounds, the empirical check, the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import depthlab
from depthlab.analysis.theory import (
    EmpiricalSetup,
    fit_power_law,
    gradient_bound,
    jacobian_rms_gains,
    lns_variance,
    measure_empirical,
    pre_ln_variance,
    upper_bound_log10,
)
from depthlab.base.errors import DepthlabError
from depthlab.cli import main


# ------------------------------------------------------------------ recursions
def test_pre_ln_recursion_outgrows_power_law_fitted_to_lns():
    depth = 2000
    layers = np.arange(1, depth + 1)
    pre, lns = pre_ln_variance(depth), lns_variance(depth)
    fit = fit_power_law(layers, lns)
    assert fit["r2"] > 0.99
    # Pre-LN above the LNS fit by a factor that keeps increasing over the deeper half ...
    ratio = pre / (fit["prefactor"] * layers ** fit["exponent"])
    tail = ratio[depth // 2:]
    assert np.all(np.diff(tail) > 0)
    assert tail[-1] > 100
    # ... because its own log-log slope there is steeper than the LNS exponent by a clear margin.
    slope = fit_power_law(layers[depth // 2:], pre[depth // 2:])["exponent"]
    assert slope > fit["exponent"] + 0.5


def test_recursion_closed_forms():
    # c = σ_1 = 1: LNS gives σ²_l = l exactly; Pre-LN gives σ_l ≈ (l + 1) / 2.
    np.testing.assert_allclose(lns_variance(500), np.arange(1, 501), rtol=1e-9)
    assert math.sqrt(pre_ln_variance(500)[-1]) == pytest.approx(501 / 2, rel=0.02)
    # the paper's frozen-σ upper bound (eq. 33): log10 σ²_l = (l - 1) log10 2 for Pre-LN
    np.testing.assert_allclose(upper_bound_log10(10), np.arange(10) * math.log10(2))
    assert np.all(upper_bound_log10(100)[1:] >= np.log10(pre_ln_variance(100))[1:])


def test_gradient_bound_products():
    pre_b = gradient_bound(pre_ln_variance(1000))
    lns_b = gradient_bound(lns_variance(1000), lns=True)
    assert pre_b[0] == lns_b[0] == 1.0  # L = 1: empty product
    assert np.all(np.diff(pre_b) > 0) and np.all(np.diff(lns_b) > 0)
    # on the recursions' own σ_l the LNS product converges (its factors are 1 + O(l^-1.5))
    assert lns_b[-1] - lns_b[len(lns_b) // 2] < 0.05 * lns_b[-1]
    assert pre_b[-1] > 100 * lns_b[-1]


@pytest.mark.parametrize("bad", [0, 1, -5, 2.5, True])
def test_recursion_rejects_bad_depth(bad):
    with pytest.raises(DepthlabError, match="depth"):
        pre_ln_variance(bad)


# ------------------------------------------------------------------ empirical
def test_jacobian_estimator_matches_exact_frobenius_norm():
    cfg = depthlab.from_preset("tiny", n_layers=3, d_model=16, n_heads=2, d_ff=32, vocab_size=64)
    torch.manual_seed(0)
    model = depthlab.build_model(cfg).eval().requires_grad_(False)
    x1 = model.embed(torch.randint(64, (1, 4)))  # (1, 4, 16): n = 64
    rope = model.rope(4, x1.device)

    def f(x):
        for block in model.blocks:
            x = block(x, rope)
        return x

    jac = torch.autograd.functional.jacobian(f, x1).reshape(x1.numel(), x1.numel())
    exact = (jac.norm() / math.sqrt(x1.numel())).item()
    est = jacobian_rms_gains(model, x1, [3], torch.Generator().manual_seed(1), n_probes=100)[0]
    assert est == pytest.approx(exact, rel=0.05)


@pytest.fixture(scope="module")
def empirical():
    setup = EmpiricalSetup(depth=64, d_model=32, n_heads=2, seq_len=32, batch_size=2, seeds=[0], n_jacobian_depths=5)
    return measure_empirical(setup)


def test_random_init_variance_grows_under_pre_and_slower_under_lns(empirical):
    pre, lns = empirical["schemes"]["pre"], empirical["schemes"]["lns"]
    v_pre, v_lns = np.array(pre["variance"]), np.array(lns["variance"])
    assert v_pre[0] == pytest.approx(v_lns[0])  # same embedding (same seed)
    # Pre-LN: the residual variance grows with depth, many-fold over 64 blocks
    assert v_pre[-1] > 10 * v_pre[0]
    assert v_pre[-1] > v_pre[16] > v_pre[4]
    assert pre["fits"]["variance"]["power_law"]["exponent"] > 0.5
    # LNS: grows too, but much slower, at every depth past the first block (block 1 is identical)
    assert v_lns[-1] > v_lns[0]
    assert v_lns[1] == pytest.approx(v_pre[1], rel=1e-5)
    assert np.all(v_lns[4:] < v_pre[4:])
    assert v_lns[-1] / v_lns[0] < 0.5 * v_pre[-1] / v_pre[0]
    assert lns["fits"]["variance"]["power_law"]["exponent"] < pre["fits"]["variance"]["power_law"]["exponent"]


def test_random_init_jacobian_gain(empirical):
    pre, lns = empirical["schemes"]["pre"], empirical["schemes"]["lns"]
    assert empirical["jacobian_depths"][-1] == 64
    assert all(g > 0 and math.isfinite(g) for g in pre["jacobian_gain"] + lns["jacobian_gain"])
    # as measured at init: the Pre-LN stack amplifies input perturbations more than the LNS one
    assert pre["jacobian_gain"][-1] > lns["jacobian_gain"][-1]


# ------------------------------------------------------------------ CLI
def test_cli_writes_json_and_png(tmp_path, capsys):
    out = tmp_path / "th"
    code = main(["theory", "--depth", "300", "--out", str(out), "--empirical-depth", "8", "--width", "16",
                 "--heads", "2", "--seq-len", "8", "--seeds", "0"])
    assert code == 0
    data = json.loads((out / "theory.json").read_text())
    assert len(data["recursion"]["variance"]["pre"]) == 300
    assert set(data["empirical"]["schemes"]) == {"pre", "lns"}
    assert len(data["empirical"]["schemes"]["pre"]["variance"]) == 9
    assert data["provenance"]["torch"] == torch.__version__
    assert (out / "theory.png").stat().st_size > 10_000
    printed = capsys.readouterr().out
    assert "theory.json" in printed and "theory.png" in printed


@pytest.mark.parametrize(
    "argv, word",
    [
        (["--depth", "0"], "depth"),
        (["--depth", "-3"], "depth"),
        (["--empirical-depth", "1"], "empirical depth"),
        (["--c", "0"], "c must"),
        (["--seeds", "a,b"], "seeds"),
        (["--width", "30", "--heads", "4"], "d_model"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, word):
    try:
        code = main(["theory", "--out", str(tmp_path / "x"), *argv])
    except SystemExit as exit_:  # argparse refuses a value of the wrong type itself (one line, exit 2)
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("depthlab theory: error:") and word in err
    assert not (tmp_path / "x" / "theory.json").exists()


def test_cli_refuses_a_folder_of_other_files_and_replaces_only_an_earlier_theory(tmp_path, capsys):
    small = ["--empirical-depth", "4", "--width", "16", "--heads", "2", "--seq-len", "8", "--seeds", "0"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert main(["theory", "--depth", "50", "--out", str(mine), *small]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "notes.txt" in err[0] and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    out = tmp_path / "th"
    assert main(["theory", "--depth", "50", "--out", str(out), *small]) == 0
    assert main(["theory", "--depth", "60", "--out", str(out), *small]) == 0  # an earlier theory: replaced
    assert len(json.loads((out / "theory.json").read_text())["recursion"]["variance"]["pre"]) == 60


def test_the_empirical_models_are_as_deep_as_the_recursions_and_say_how_far_they_got(tmp_path, caplog):
    """--depth 10 measures 10-block models (it measured 256-block ones: 408 s on this CPU), with progress lines."""
    import logging

    caplog.set_level(logging.INFO, logger="depthlab")
    assert main(["theory", "--depth", "10", "--out", str(tmp_path / "th"), "--width", "16", "--heads", "2",
                 "--seq-len", "8", "--seeds", "0,1"]) == 0
    data = json.loads((tmp_path / "th" / "theory.json").read_text())
    assert data["empirical"]["setup"]["depth"] == 10 and len(data["empirical"]["schemes"]["pre"]["variance"]) == 11
    said = [r.getMessage() for r in caplog.records]
    assert "theory: random-init models of 10 blocks, width 16: started (4 models)" in said
    assert any(l.startswith("theory: random-init models of 10 blocks, width 16: model 2/4 (50%)") for l in said)
    assert any(l.startswith("theory: random-init models of 10 blocks, width 16: done, 4 models in") for l in said)
