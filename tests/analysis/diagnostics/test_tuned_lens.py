"""The tuned lens (--tuned-lens): its maps are the least-squares solution (torch.linalg.lstsq on the stacked states),
identity maps give the plain lens exactly (state 0 included), and on a trained model where the plain lens is poor
it lowers the lens loss on held-out batches the maps never saw."""

from __future__ import annotations

import pytest
import torch

import depthlab as d
from depthlab.analysis.diagnostics import DiagnoseOptions, diagnose, load_target
from depthlab.analysis.diagnostics.capture import capture_of
from depthlab.analysis.diagnostics.lens import LensAccumulator, TunedLens, _mapped
from depthlab.base.errors import DepthlabError
from depthlab.cli import main

OPTS = dict(tokens=1024, seq_len=32, batch_size=4, jacobian=False, progress=False, joint_check=False, removal=False,
            sublayers=False, tuned_lens=True)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 4-block Pre-LN tiny trained 150 steps: its early blocks' plain lens is far from the final layer."""
    from depthlab.train import TrainConfig, train

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("tuned") / "run"
    cfg = d.from_preset("tiny", n_layers=4, d_model=32, n_heads=4, d_ff=64, scheme="pre")
    train(cfg, TrainConfig(data="builtin", tokenizer="bytes", steps=150, batch_size=8, seq_len=32, eval_every=0, lr=3e-3,
                           eval_tokens=256, variance_every=0, ckpt_every=0, device="cpu"), out, quiet=True)
    return out


def test_maps_are_the_least_squares_solution():
    gen = torch.Generator().manual_seed(0)
    L, D = 3, 6
    batches = [[torch.randn(2, 5, D, generator=gen) for _ in range(L + 1)] for _ in range(3)]
    fit = TunedLens(L, ridge=0.0)
    for states in batches:
        fit.update(states)
    fit.solve()
    y = torch.cat([s[-1].flatten(0, 1) for s in batches]).double()
    for i in range(L):
        x = torch.cat([s[i].flatten(0, 1) for s in batches]).double()
        x = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)
        want = torch.linalg.lstsq(x, y).solution
        assert torch.allclose(fit.maps[i], want, atol=1e-9), i
    h = batches[0][L - 1]
    assert torch.allclose(fit.apply(L - 1, h).double(), h.double() @ want[:-1] + want[-1], atol=1e-5)
    assert fit.apply(L, h) is h  # the last state is the model's own output: no map


def test_identity_maps_give_the_plain_lens_exactly(trained):
    target = load_target(str(trained))
    cap = capture_of(target)
    L = cap.n_layers
    x = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(2))
    D = target.info["d_model"]
    fit = TunedLens(L)
    fit.maps = torch.cat([torch.eye(D), torch.zeros(1, D)]).double().expand(L, D + 1, D)
    logits, states = cap.run(x)
    plain, same = LensAccumulator(L), LensAccumulator(L)
    plain.update(cap, x, y, logits, states)
    same.add(logits, _mapped(cap, x, states, fit), y)
    a, b = plain.result(), same.result()
    for key in ("loss", "agreement", "kl"):
        assert max(abs(u - v) for u, v in zip(a[key], b[key])) <= 1e-5, key


def test_tuned_lens_lowers_the_lens_loss_on_unseen_batches(trained):
    rep = diagnose(load_target(str(trained)), DiagnoseOptions(**OPTS))
    tuned, L = rep["lens"]["tuned"], rep["model"]["n_layers"]
    plain = tuned["plain"]
    assert plain["loss"][1] - plain["loss"][-1] > 0.2  # the plain lens is poor after block 1
    assert abs(tuned["loss"][-1] - plain["loss"][-1]) < 1e-9  # the last state: the model's logits for both
    for i in range(L):
        assert tuned["loss"][i] < plain["loss"][i] - 1e-3 and tuned["kl"][i] < plain["kl"][i], i
    assert tuned["fit_tokens"] == tuned["tokens"] == 512  # half the batches each


def test_refusals_are_one_line_before_work(trained, tmp_path, capsys):
    with pytest.raises(DepthlabError, match="--tuned-lens is compared with the logit lens"):
        DiagnoseOptions(tuned_lens=True, lens=False).validate()
    with pytest.raises(DepthlabError, match="needs two held-out batches|makes 1 batch"):
        diagnose(load_target(str(trained)), DiagnoseOptions(**{**OPTS, "tokens": 64}))
    assert main(["diagnose", str(trained), "--stream", "--tuned-lens", "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--tuned-lens needs the model in memory" in err
