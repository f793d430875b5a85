"""Which device a ``--device`` value means, decided in one place for every command and the library.

    resolve_device("auto")     # cuda:<current> when CUDA is available, else cpu
    resolve_device("cuda")     # the current CUDA device, *with its index* (cuda:0): torch.cuda.set_device and
                               # the trainer's per-rank placement need one; an unindexed "cuda" used to crash there
    resolve_device("cuda:1")   # checked against the devices present

The decision is a pure function of the value and what the machine has (:func:`decide_device`), so it is tested
without a GPU; :func:`resolve_device` asks torch for those facts. torch is imported inside the functions.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from depthlab.base.errors import DepthlabError

if TYPE_CHECKING:
    import torch

DEVICE_HELP = "auto (cuda if available), cpu, cuda (the current GPU), cuda:N, mps"
_SPEC = re.compile(r"^(auto|cpu|mps|cuda)(?::(\d+))?$")


def decide_device(spec: str | None, cuda_count: int, cuda_current: int = 0, mps: bool = False,
                  rank: int | None = None) -> str:
    """The device string ``spec`` means on a machine with ``cuda_count`` CUDA devices (``cuda_current`` the current
    one; ``rank``: this process's local rank under torchrun, which an unindexed or automatic choice follows).
    DepthlabError, one line naming the value and the choices, for anything else."""
    spec = "auto" if spec in (None, "") else str(spec).strip().lower()
    m = _SPEC.match(spec)
    if not m or (m.group(2) is not None and m.group(1) != "cuda"):
        raise DepthlabError(f"unknown device {spec!r}; choose {DEVICE_HELP}")
    kind, index = m.group(1), m.group(2)
    if kind == "auto":
        if cuda_count:
            kind = "cuda"
        else:
            return "mps" if mps and rank is None else "cpu"
    if kind == "mps" and not mps:
        raise DepthlabError(f"--device {spec} asked, but no MPS device is available; choose cpu")
    if kind != "cuda":
        return kind
    if not cuda_count:
        raise DepthlabError(f"--device {spec} asked, but no CUDA device is available; choose cpu")
    i = int(index) if index is not None else (rank if rank is not None else cuda_current)
    if not 0 <= i < cuda_count:
        raise DepthlabError(f"--device {spec}: there {'is' if cuda_count == 1 else 'are'} {cuda_count} CUDA "
                            f"device{'s' if cuda_count != 1 else ''} (cuda:0..cuda:{cuda_count - 1})")
    return f"cuda:{i}"


def resolve_device(spec: str | None = "auto", rank: int | None = None) -> torch.device:
    """``spec`` as a :class:`torch.device` on this machine (a CUDA device always with its index)."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    return torch.device(decide_device(spec, count, torch.cuda.current_device() if count else 0, mps, rank))
