"""A config integer that places layers, in a layout inferred from the model (the attack re-run on the inferred-layout
path, docs/reliability.md): AFMoE's ``num_dense_layers`` ("the first k layers are dense"). Pruning a dense block was
refused after all the work (in memory: the export's logits differed from skipping; streamed: the export did not read
back, in a line naming a hidden temporary directory). A rule (``INDEX_RULES``) now rewrites it, and the export is
exact in both engines, checked against the original with the block bypassed by a forward hook (not depthlab's own
check); where no rule knows such a field, the streamed export's read-back is refused in one line naming --out."""

from __future__ import annotations

import json

import pytest
import torch

from depthlab.base.errors import DepthlabError
from depthlab.hf.family_rules import INDEX_RULES
from depthlab.hf.tiny import save_tiny
from depthlab.prune import PruneOptions, prune_target

PRUNE = dict(method="removal", blocks=[1], data="builtin", tokens=64, seq_len=16, batch_size=2, progress=False,
             latency_tokens=2)


def _skip(_module, args, kwargs, output):
    h = args[0] if args and isinstance(args[0], torch.Tensor) else kwargs["hidden_states"]
    return (h, *output[1:]) if isinstance(output, tuple) else h


@pytest.fixture(scope="module")
def afmoe(tmp_path_factory):
    return save_tiny("afmoe", tmp_path_factory.mktemp("afmoe") / "model")  # block 1 dense, blocks 2-4 MoE


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "in-memory"])
def test_pruning_afmoes_dense_block_rewrites_num_dense_layers_and_exports_exactly(afmoe, stream, tmp_path, one_thread):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    prune_target(str(afmoe), PruneOptions(**PRUNE, stream=stream), out)
    assert json.loads((out / "config.json").read_text())["num_dense_layers"] == 0
    ref = AutoModelForCausalLM.from_pretrained(str(afmoe), dtype=torch.float32).eval()
    ref.model.layers[0].register_forward_hook(_skip, with_kwargs=True)
    got = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    ids = torch.randint(3, 250, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(got(ids).logits, ref(ids).logits, atol=1e-4, rtol=1e-4)


def test_a_streamed_export_that_does_not_read_back_is_refused_naming_out(afmoe, tmp_path, monkeypatch, one_thread):
    """Without the rule (a field no rule knows), the pruned config says layer 1 is dense while its weights are MoE."""
    monkeypatch.setitem(INDEX_RULES, "num_dense_layers", lambda config, keep, n_layers: None)
    out = tmp_path / "out"
    with pytest.raises(DepthlabError, match=r"the pruned checkpoint does not read back .*nothing written") as err:
        prune_target(str(afmoe), PruneOptions(**PRUNE, stream=True), out)
    assert str(out) in str(err.value) and ".tmp-" not in str(err.value)
    assert not out.exists() and not list(tmp_path.glob(".out.tmp-*"))
