"""Choosing blocks: angular-block, influence and greedy removal on models built so the answer is known."""

import itertools

import pytest
import torch
from tiny_models import tiny_hf

from depthlab.analysis.diagnostics import ResidualCapture, find_layers
from depthlab.analysis.diagnostics.removal import joint_removal_loss
from depthlab.base.errors import DepthlabError
from depthlab.prune import angular_block, greedy_removal, lowest_influence, select_blocks, survey_model


def _model_with_identity_blocks(identity, n_layers=6, head_gain=30.0):
    """A random HF Llama whose blocks ``identity`` (1-based) add exactly zero (output projections zeroed),
    with a sharp LM head: held-out labels are the full model's own argmax, so its loss is near 0 and any
    removal that changes the function costs loss, while removing an identity block costs exactly nothing."""
    hf = tiny_hf("llama", n_layers, seed=1)
    with torch.no_grad():
        for l in identity:
            hf.model.layers[l - 1].self_attn.o_proj.weight.zero_()
            hf.model.layers[l - 1].mlp.down_proj.weight.zero_()
        hf.lm_head.weight.mul_(head_gain)
    cap = ResidualCapture(hf, find_layers(hf), lambda x: hf(input_ids=x, use_cache=False).logits)
    torch.manual_seed(2)
    batches = []
    for _ in range(2):
        x = torch.randint(0, 300, (2, 16))
        with torch.no_grad():
            batches.append((x, hf(input_ids=x).logits.argmax(-1)))
    return hf, cap, batches


def test_angular_block_and_influence_find_the_identity_run():
    _, cap, batches = _model_with_identity_blocks([3, 4])
    survey = survey_model(cap, batches)
    assert float(survey.angular[2, 4]) < 1e-3  # d(x^3, x^5): blocks 3-4 do nothing
    assert angular_block(survey.angular, 2) == [3, 4]
    assert lowest_influence(survey.influence, 2) == [3, 4]
    assert survey.influence[2] < 1e-6 and min(survey.influence[i] for i in (0, 1, 4, 5)) > 1e-3


def test_angular_block_picks_the_smallest_distance_in_a_constructed_matrix():
    m = torch.full((7, 7), 0.5)
    m[1, 4] = 0.05  # d(x^2, x^5): the run 2..4 for n = 3
    m[3, 6] = 0.10
    assert angular_block(m, 3) == [2, 3, 4]
    m[3, 6] = 0.01
    assert angular_block(m, 3) == [4, 5, 6]


def test_greedy_removal_equals_brute_force_on_six_blocks():
    _, cap, batches = _model_with_identity_blocks([2, 5])
    brute = {s: joint_removal_loss(cap, batches, s) for s in itertools.combinations(range(1, 7), 2)}
    best = min(brute, key=brute.get)
    assert best == (2, 5) and sorted(brute.values())[1] > brute[best] + 1e-3  # unique optimum: they must agree
    steps = greedy_removal(cap, batches, n=3)
    assert sorted(s.block for s in steps[:2]) == [2, 5]
    assert abs(steps[1].loss - brute[best]) < 1e-6
    removed = set()
    for step in steps:  # every candidate scored with prefix reuse == recomputed from scratch
        for m, loss in step.candidates.items():
            assert abs(loss - joint_removal_loss(cap, batches, removed | {m})) < 1e-5, (removed, m)
        removed.add(step.block)


def test_budget_takes_the_most_blocks_within_it_and_refuses_none():
    _, cap, batches = _model_with_identity_blocks([2, 5])
    survey = survey_model(cap, batches)
    for method in ("removal", "influence"):
        sel = select_blocks(method, cap, batches, survey, budget=1e-6)
        assert sel.removed == [2, 5], method
        assert abs(sel.loss - survey.loss) < 1e-6
    with pytest.raises(DepthlabError, match="unknown --method 'nope'"):
        select_blocks("nope", cap, batches, survey, remove=1)
