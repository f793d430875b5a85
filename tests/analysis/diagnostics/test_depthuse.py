"""The swap test against the model with its two blocks exchanged (transformers and depthlab models), and the
effective depth's count. (Both engines give the same numbers: test_streamed.py's assert_same, every family.)"""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import hf_dir

import depthlab as d
from depthlab.analysis.diagnostics import DiagnoseOptions, ResidualCapture, diagnose, find_layers, load_target
from depthlab.analysis.diagnostics.depthuse import SwapAccumulator, deep_pairs, effective_depth
from depthlab.analysis.diagnostics.heldout import TextBatches


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def _exchanged(model: torch.nn.Module, l: int) -> torch.nn.Module:
    """A copy of ``model`` whose blocks l and l+1 (1-based) trade places in its block list; where the model picks a
    block's attention mask by position (``config.layer_types``), the types trade places too, so each block keeps its
    own (a sliding-window block stays one)."""
    out = copy.deepcopy(model)
    layers = find_layers(out)
    layers[l - 1], layers[l] = layers[l], layers[l - 1]
    types = getattr(getattr(out, "config", None), "layer_types", None)
    if types:
        types[l - 1], types[l] = types[l], types[l - 1]
    return out


@pytest.mark.parametrize("kind", ["llama", "qwen2-mixed"])  # qwen2-mixed: sliding and full attention blocks
def test_swap_equals_transformers_with_the_two_blocks_exchanged(tmp_path, kind):
    L = 4
    opts = DiagnoseOptions(tokens=96, seq_len=32, batch_size=2, jacobian=False, progress=False, sublayers=False,
                           lens=False, joint_check=False)
    target = load_target(str(hf_dir(tmp_path, kind, L)))
    rep = diagnose(target, opts)
    batches = list(TextBatches(target, opts))

    def loss(model) -> float:
        with torch.no_grad():
            tot = [torch.nn.functional.cross_entropy(model(input_ids=x, use_cache=False).logits.flatten(0, 1),
                                                     y.flatten(), reduction="sum") for x, y in batches]
        return float(sum(tot)) / sum(y.numel() for _, y in batches)

    full = loss(target.model)
    assert abs(rep["swap"]["base_loss"] - full) < 1e-5 and rep["swap"]["pairs"] == [[1, 2], [2, 3], [3, 4]]
    for l in range(1, L):
        ref = loss(_exchanged(target.model, l))
        assert abs(rep["swap"]["loss"][l - 1] - ref) < 1e-5, (l, rep["swap"]["loss"][l - 1], ref)
        assert abs(rep["swap"]["delta_loss"][l - 1] - (ref - full)) < 1e-5


def test_swap_on_a_depthlab_lns_model_moves_each_block_with_its_own_scale(make_cfg):
    """LNS: block l scales by 1/sqrt(l) wherever it sits; exchanging blocks 2 and 3 is not the identity (a naive
    'swap the weights, keep the scales' would give another number)."""
    torch.manual_seed(1)
    model = d.build_model(make_cfg("lns")).eval()
    cap = ResidualCapture(model, find_layers(model), lambda x: model(x).logits)
    ids = torch.randint(300, (2, 13))
    x, y = ids[:, :-1], ids[:, 1:]
    acc = SwapAccumulator(4)
    acc.update(cap, x, y, *cap.run(x, keep_calls=True))
    res = acc.result()
    with torch.no_grad():
        for l in range(1, 4):
            ref = float(torch.nn.functional.cross_entropy(_exchanged(model, l)(x).logits.flatten(0, 1), y.flatten()))
            assert abs(res["loss"][l - 1] - ref) < 1e-5, (l, res["loss"][l - 1], ref)
    assert all(abs(v) > 1e-6 for v in res["delta_loss"])


def test_effective_depth_counts_the_blocks_whose_removal_costs_more_than_the_threshold():
    removal = {"base_loss": 4.0, "delta_loss": [0.5, 0.041, 0.039, None, -0.2, 0.04]}
    eff = effective_depth(removal, 0.01)  # 0.04 nats: strictly above counts; None (not measurable) never does
    assert eff["blocks"] == [1, 2] and eff["n"] == 2 and eff["share"] == pytest.approx(2 / 6)
    assert eff["threshold_nats"] == pytest.approx(0.04) and eff["n_layers"] == 6
    assert effective_depth(removal, 0.0)["blocks"] == [1, 2, 3, 6]
    assert deep_pairs([5, 6, 7, 8], 8) == [4, 5, 6, 7] and deep_pairs([3], 3) == [2] and deep_pairs([1], 1) == []


def test_no_swap_leaves_the_section_out_and_effective_depth_in(tmp_path):
    opts = DiagnoseOptions(tokens=64, seq_len=32, batch_size=2, jacobian=False, progress=False, sublayers=False,
                           lens=False, joint_check=False, swap=False, effective_threshold=0.0)
    rep = diagnose(load_target(str(hf_dir(tmp_path, "llama", 3))), opts)
    assert "swap" not in rep
    assert rep["effective_depth"]["n"] == sum(v > 0 for v in rep["removal"]["delta_loss"])
    assert f"effective depth {rep['effective_depth']['n']} of 3 blocks" in rep["summary"]
