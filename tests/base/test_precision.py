"""What --weights and --dtype mean (depthlab.base.precision): one table for every command and the library."""

from __future__ import annotations

import pytest
import torch

from depthlab.base.errors import DepthlabError
from depthlab.base.precision import PRECISIONS, decide_precision, default_compute_dtype, resolve_precision


@pytest.mark.parametrize("device, weights, compute, auto_weights, expected", [
    ("cpu", "auto", "auto", None, ("fp32", "fp32")),
    ("cuda", "auto", "auto", None, ("bf16", "bf16")),
    ("cpu", "bf16", "auto", None, ("bf16", "fp32")),     # bf16 weights on a CPU: each linear upcast while it computes
    ("cuda", "bf16", "auto", None, ("bf16", "bf16")),
    ("cpu", "bf16", "bf16", None, ("bf16", "bf16")),     # bf16 arithmetic, asked for
    ("cuda", "bf16", "fp32", None, ("bf16", "fp32")),    # upcast on a GPU too, asked for
    ("cpu", "auto", "bf16", None, ("bf16", "bf16")),     # automatic weights follow a bf16 compute
    ("cuda", "auto", "auto", "fp32", ("fp32", "fp32")),  # a command whose automatic weights are fp32 (prune)
    ("cuda", "fp32", "auto", None, ("fp32", "fp32")),
])
def test_the_one_table(device, weights, compute, auto_weights, expected):
    assert decide_precision(device, weights, compute, auto_weights) == expected


def test_refusals_name_the_value_and_the_choices():
    with pytest.raises(DepthlabError, match="needs bf16 weights; give --weights bf16"):
        decide_precision("cpu", "fp32", "bf16")
    with pytest.raises(DepthlabError, match=r"unknown --dtype 'fp16'.*auto.*fp32.*bf16"):
        decide_precision("cpu", "auto", "fp16")
    with pytest.raises(DepthlabError, match="unknown --weights"):
        decide_precision("cpu", "float32", "auto")
    assert PRECISIONS == ("auto", "fp32", "bf16")


def test_torch_dtypes_and_the_library_default_agree_with_the_table():
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert resolve_precision(cpu, "bf16") == (torch.bfloat16, torch.float32)
    assert resolve_precision(gpu) == (torch.bfloat16, torch.bfloat16)
    for device in (cpu, gpu):
        for weights in ("fp32", "bf16"):
            w, c = resolve_precision(device, weights)
            assert default_compute_dtype(device, w) == c
    assert default_compute_dtype(cpu, torch.float16) == torch.float16  # other dtypes compute in themselves
