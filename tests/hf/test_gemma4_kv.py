"""Gemma 4 with KV sharing (real E2B/E4B checkpoints are KV-shared), on a tiny random model built with
``AutoConfig.for_model`` + ``from_config`` (no download): blocks 3 and 4 reuse the keys and values of blocks 1
(sliding) and 2 (full attention).

- ``diagnose`` in memory: removing block 1 or 2 has no defined output (a later block reads the keys and values they
  compute; no pruned model computes it), reported as not measurable (None, the reason, one log line each); the
  removal of blocks 3 and 4 equals a naive forward written here with the block's output replaced by its input, and
  block 3's equals the export without it loaded in plain transformers; angular distance, variance, the logit lens
  and the attention/MLP units keep working.
- ``prune --remove 2`` (every method) picks only blocks the config can lose, its export reloads in plain
  ``AutoModelForCausalLM.from_pretrained`` with the logits of the original with those blocks skipped (naive); a
  request the config cannot meet is one line before any pass over data; ``--stream`` on this config is refused.
- Both engines skip the blocks Gemma 4's config cannot lose without KV sharing too (its last block must stay full
  attention).
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
from tiny_models import GEMMA4_KV

from depthlab.analysis.diagnostics import DiagnoseOptions, diagnose
from depthlab.analysis.diagnostics.removal import nll_sum
from depthlab.base.errors import DepthlabError
from depthlab.hf.families import config_limit
from depthlab.hf.tiny import save_tiny, tiny_model
from depthlab.prune.export import drop_layers, write_hf
from depthlab.prune.select import angular_block, check_removable, lowest_influence, most_removable
from depthlab.targets import load_target

IDS = torch.randint(3, 300, (2, 12), generator=torch.Generator().manual_seed(1))
OPTS = dict(data="builtin", tokens=64, seq_len=16, batch_size=2, progress=False)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def kv_model(tmp_path_factory):
    model = tiny_model("gemma4_text", **GEMMA4_KV)
    assert model.config.kv_sharing_modes == ["store", "store", "reuse", "reuse"]
    return model, save_tiny(model, tmp_path_factory.mktemp("gemma4kv"))


def _skipping(model, ids: torch.Tensor, blocks) -> torch.Tensor:
    """Naive: the model's forward with each block's output replaced by its input (the block still runs, so the keys
    and values it shares are still computed: the definition only for blocks that share none)."""
    def identity(_m, args, kwargs, _out):
        return args[0] if args else kwargs["hidden_states"]

    hooks = [model.model.layers[b - 1].register_forward_hook(identity, with_kwargs=True) for b in blocks]
    try:
        with torch.no_grad():
            return model(input_ids=ids, use_cache=False).logits
    finally:
        for h in hooks:
            h.remove()


def _batches(path):
    from depthlab.analysis.diagnostics.heldout import TextBatches

    target = load_target(str(path))
    return TextBatches(target, DiagnoseOptions(**OPTS, split="val"))


def test_diagnose_reports_a_kv_producers_removal_as_not_measurable(kv_model, tmp_path, caplog):
    from transformers import AutoModelForCausalLM

    model, path = kv_model
    with caplog.at_level(logging.WARNING, logger="depthlab.analysis.diagnostics.removal"):
        report = diagnose(load_target(str(path)), DiagnoseOptions(**OPTS, jacobian=False, joint_check=False,
                                                                  mc="builtin-mc", mc_limit=4))
    removal = report["removal"]
    assert removal["delta_loss"][:2] == [None, None] and removal["loss"][:2] == [None, None]
    assert sorted(removal["unmeasurable"]) == ["1", "2"]
    assert "block(s) [1] cannot be skipped" in removal["unmeasurable"]["1"]
    assert "sliding_attention" in removal["unmeasurable"]["1"] and "full_attention" in removal["unmeasurable"]["2"]
    removal_lines = [r for r in caplog.records if r.name.endswith(".removal") and "not measured" in r.getMessage()]
    assert len(removal_lines) == 2  # one line per block (the swap test says its own)
    assert set(report["removal"]["removable"]["blocks"]) <= {3, 4}
    assert report["mc"]["delta_acc"][:2] == [None, None] and None not in report["mc"]["delta_acc"][2:]

    # blocks 3 and 4: the naive skip on the same held-out batches; block 3: the export without it, in transformers
    without_3 = write_hf(drop_layers(_copy(model), [3]), tmp_path / "no3")
    loaded = AutoModelForCausalLM.from_pretrained(str(without_3)).eval()
    sums = {3: 0.0, 4: 0.0, "export": 0.0, "base": 0.0}
    count = 0
    for x, y in _batches(path):
        for b in (3, 4):
            sums[b] += nll_sum(_skipping(model, x, [b]), y)[0]
        with torch.no_grad():
            sums["export"] += nll_sum(loaded(input_ids=x, use_cache=False).logits, y)[0]
            total, n = nll_sum(model(input_ids=x, use_cache=False).logits, y)
        sums["base"], count = sums["base"] + total, count + n
    assert removal["base_loss"] == pytest.approx(sums["base"] / count, abs=1e-5)
    for b in (3, 4):
        assert removal["loss"][b - 1] == pytest.approx(sums[b] / count, abs=1e-5)
    assert removal["loss"][2] == pytest.approx(sums["export"] / count, abs=1e-5)

    # the rest of the diagnosis keeps working on this config
    L = 4
    assert all(math.isfinite(v) for row in report["angular"]["matrix"] for v in row if v is not None)
    assert all(math.isfinite(v) for v in report["variance"]["variance"])
    assert report["lens"]["loss"][-1] == pytest.approx(removal["base_loss"], abs=1e-5)  # x^{L+1} decoded: the model
    assert len(report["lens"]["loss"]) == L + 1 and all(math.isfinite(v) for v in report["lens"]["loss"])
    for unit in ("attn", "mlp"):  # zeroing a branch keeps the shared keys and values: measurable everywhere
        assert all(math.isfinite(v) for v in report["sublayers"][unit]["delta_loss"])


def _copy(model):
    import copy

    return copy.deepcopy(model)


def test_the_cli_report_shows_the_unmeasurable_blocks(kv_model, tmp_path):
    from depthlab.cli import main

    _, path = kv_model
    out = tmp_path / "diag"
    rc = main(["diagnose", str(path), "--out", str(out), "--tokens", "32", "--seq-len", "16", "--batch-size", "2",
               "--no-jacobian", "--no-progress"])
    assert rc in (0, None)
    assert (out / "report.html").exists()
    import json

    assert sorted(json.loads((out / "report.json").read_text())["removal"]["unmeasurable"]) == ["1", "2"]


@pytest.mark.parametrize("method", ["removal", "angular-block", "influence"])
def test_prune_remove_2_picks_only_blocks_the_config_can_lose(kv_model, tmp_path, method):
    from transformers import AutoModelForCausalLM

    from depthlab.prune import PruneOptions, prune_target

    model, path = kv_model
    report = prune_target(load_target(str(path)), PruneOptions(remove=2, method=method, **OPTS, latency_tokens=2),
                          tmp_path / "out")
    removed = report["removed_blocks"]
    assert len(removed) == 2 and config_limit(model.config, "prune", removed) is None
    assert removed in ([1, 3], [3, 4])  # the only pairs this config can lose
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    with torch.no_grad():
        got = loaded(input_ids=IDS, use_cache=False).logits
    torch.testing.assert_close(got, _skipping(model, IDS, removed), atol=2e-5, rtol=1e-4)


def test_a_request_the_config_cannot_meet_is_one_line_before_any_work(kv_model, tmp_path, monkeypatch):
    from depthlab.prune import PruneOptions, pipeline, prune_target

    model, path = kv_model
    monkeypatch.setattr(pipeline, "held_out_batches", lambda *a: pytest.fail("data read before the refusal"))
    for method, n in (("angular-block", 3),):  # blocks 1..3 or 2..4: a producer or a sliding end
        with pytest.raises(DepthlabError, match=rf"--remove {n} --method {method}: .*at most 2") as err:
            prune_target(load_target(str(path)), PruneOptions(remove=n, method=method, **OPTS), tmp_path / method)
        assert "\n" not in str(err.value) and "blocks [1] cannot go" in str(err.value)
        assert "blocks [2] cannot go" in str(err.value) and "block 3 (sliding_attention) would become the last" in str(err.value)
        assert not (tmp_path / method).exists()
    with pytest.raises(DepthlabError, match=r"blocks 3\.\.4 reuse the keys and values"):  # streaming: refused
        prune_target(str(path), PruneOptions(remove=2, **OPTS, stream=True), tmp_path / "stream")
    assert not (tmp_path / "stream").exists()


def test_the_selections_skip_what_the_limits_forbid(kv_model):
    model, _ = kv_model
    allowed = lambda blocks: config_limit(model.config, "prune", blocks)  # noqa: E731
    assert most_removable(4, allowed) == [1, 3, 4]  # block 1 goes once its consumer 3 has: block 2 (full) ends it
    assert most_removable(4, None) == [1, 2, 3]
    angular = torch.full((5, 5), 0.5)
    angular[0, 2] = 0.01  # blocks 1-2 would be the best run: forbidden
    assert angular_block(angular, 2) == [1, 2] and angular_block(angular, 2, allowed) == [3, 4]
    influence = [0.01, 0.02, 0.5, 0.4]  # 1 and 2 the lowest: 1 goes once its consumer 3 has gone; 4 cannot end it
    assert lowest_influence(influence, 2) == [1, 2] and lowest_influence(influence, 2, allowed) == [1, 3]
    check_removable("removal", 2, 4, allowed)
    check_removable("influence", 3, 4, allowed)
    with pytest.raises(DepthlabError, match="at most 2 consecutive blocks"):
        check_removable("angular-block", 3, 4, allowed)
    last_two = lambda blocks: "the last two cannot go" if {3, 4} & set(blocks) else None  # noqa: E731
    with pytest.raises(DepthlabError, match=r"--remove 3 --method removal: .*at most 2 blocks of 4 go together "
                                            r"\(the last two cannot go\)"):
        check_removable("removal", 3, 4, last_two)


def test_both_engines_skip_a_last_block_gemma4_cannot_lose(tmp_path_factory, tmp_path):
    """Without KV sharing: the last block (full attention) cannot go while a sliding block would end the model; the
    greedy choice, in memory and streamed, is the same allowed pair."""
    from depthlab.prune import PruneOptions, prune_target

    model = tiny_model("gemma4_text")
    path = save_tiny(model, tmp_path_factory.mktemp("gemma4"))
    opts = dict(remove=2, method="removal", **OPTS, latency_tokens=2)
    streamed = prune_target(str(path), PruneOptions(**opts, stream=True), tmp_path / "s")
    in_memory = prune_target(load_target(str(path)), PruneOptions(**opts), tmp_path / "m")
    assert streamed["removed_blocks"] == in_memory["removed_blocks"]
    assert 4 not in in_memory["removed_blocks"] and config_limit(model.config, "prune", in_memory["removed_blocks"]) is None
    for report in (streamed, in_memory):  # block 4 was never a candidate
        assert all("4" not in step["candidates"] for step in report["selection"]["greedy_path"])


@pytest.mark.parametrize("method", ["removal", "angular-block", "influence"])
def test_a_budget_removes_only_what_the_config_can_lose(kv_model, tmp_path, method):
    """A budget no loss reaches: each method stops at the most blocks it can choose among the allowed sets (blocks
    1, 3 and 4 can go together: block 2, full attention, then ends the model and no block reuses block 1's keys)."""
    from depthlab.prune import PruneOptions, prune_target

    model, path = kv_model
    report = prune_target(load_target(str(path)), PruneOptions(budget=1e3, method=method, **OPTS, latency_tokens=2),
                          tmp_path / "out")
    removed = report["removed_blocks"]
    assert config_limit(model.config, "prune", removed) is None
    assert removed == ([3, 4] if method == "angular-block" else [1, 3, 4])
