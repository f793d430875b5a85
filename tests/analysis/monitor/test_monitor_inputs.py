"""Issue 33, cases 4 and 13: the monitor refuses, at construction or at ``step()``, each bad input with one
DepthlabError naming the argument, instead of a raw error or a silent measurement of something else."""

from __future__ import annotations

import pytest
import torch

import depthlab as d
from depthlab.analysis.monitor.core import DepthMonitor
from depthlab.base.errors import DepthlabError

VOCAB, CONTEXT = 64, 16


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return d.build_model(d.from_preset("tiny", n_layers=2, d_model=16, n_heads=2, d_ff=32, vocab_size=VOCAB,
                                       max_seq_len=CONTEXT)).eval()


def ids(b: int = 2, t: int = 9, high: int = VOCAB) -> torch.Tensor:
    return torch.randint(0, high, (b, t))


BAD_PROBES = [
    ("float ids", lambda: ids().float(), "float32 values"),
    ("negative id", lambda: ids() - VOCAB, "negative token id"),
    ("beyond the vocabulary", lambda: ids() + VOCAB, f"vocabulary of {VOCAB}"),
    ("longer than the context", lambda: ids(t=CONTEXT + 2), f"context of {CONTEXT}"),
    ("empty", lambda: ids(b=0), "B >= 1"),
    ("a list of ints", lambda: [1, 2, 3, 4], "not a list of 4 items"),
    ("a nested list", lambda: [[1, 2, 3], [4, 5, 6]], "pair of tensors"),
    ("labels of another shape", lambda: (ids(t=8), ids(t=7)), "labels"),
]


@pytest.mark.parametrize("make,needle", [c[1:] for c in BAD_PROBES], ids=[c[0] for c in BAD_PROBES])
def test_a_bad_probe_batch_is_refused_at_construction(model, make, needle):
    with pytest.raises(DepthlabError, match="probe_batch") as err:
        DepthMonitor(model, make(), every=2)
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("every", [True, 0, 1.5, "2"])
def test_every_must_be_a_positive_integer(model, every):
    with pytest.raises(DepthlabError, match="every"):
        DepthMonitor(model, ids(), every=every)


def test_steps_out_of_order_and_a_figure_before_any_probe_are_refused(model, tmp_path):
    monitor = DepthMonitor(model, ids(t=CONTEXT + 1), every=2)  # a full context (+1 label) is fine
    with pytest.raises(DepthlabError, match="no probe yet"):
        monitor.write_figure(str(tmp_path / "f.png"))
    assert monitor.step(4) is not None
    with pytest.raises(DepthlabError, match="step 2 comes after step 4"):
        monitor.step(2)
    for bad in (-1, 1.0, True):
        with pytest.raises(DepthlabError, match="step must be a non-negative integer"):
            monitor.step(bad)
    assert monitor.step(6, last=True) is not None and [r["step"] for r in monitor.records] == [4, 6]
