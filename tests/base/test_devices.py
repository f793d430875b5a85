"""--device means one thing on every command: depthlab.base.devices.decide_device, tested without a GPU."""

import pytest

from depthlab.base.devices import decide_device
from depthlab.base.errors import DepthlabError


@pytest.mark.parametrize("spec, count, current, rank, want", [
    ("auto", 0, 0, None, "cpu"), (None, 0, 0, None, "cpu"), ("cpu", 2, 0, None, "cpu"),
    ("auto", 2, 1, None, "cuda:1"),   # the current device, indexed
    ("cuda", 1, 0, None, "cuda:0"),   # an unindexed cuda: the current device WITH its index (set_device needs one)
    ("cuda", 4, 2, None, "cuda:2"), ("CUDA:1 ", 2, 0, None, "cuda:1"),
    ("cuda", 4, 0, 3, "cuda:3"),      # under torchrun an unindexed cuda follows the local rank
    ("auto", 4, 0, 2, "cuda:2"), ("cuda:0", 4, 0, 3, "cuda:0"),   # an explicit index wins
])
def test_a_device_value_resolves_to_an_indexed_device(spec, count, current, rank, want):
    assert decide_device(spec, count, current, rank=rank) == want


def test_mps_when_present_and_never_an_unknown_or_absent_device():
    assert decide_device("auto", 0, mps=True) == "mps" and decide_device("mps", 0, mps=True) == "mps"
    for spec, count, match in (("gpu", 1, "unknown device 'gpu'; choose auto"), ("cuda", 0, "no CUDA device"),
                               ("cuda:2", 2, r"2 CUDA devices \(cuda:0..cuda:1\)"), ("cpu:1", 0, "unknown device"),
                               ("mps", 0, "no MPS device")):
        with pytest.raises(DepthlabError, match=match):
            decide_device(spec, count)
