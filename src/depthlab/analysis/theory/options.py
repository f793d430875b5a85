"""What ``theory`` computes: plain data, no torch and no numpy (the command line derives its flags from it).

    TheoryOptions(depth=1000)                           # the recursions' depth; empirical=False: recursions only
    RecursionParams(c=1.0, sigma1_sq=1.0, A=1.0, B=1.0) # the recursions' constants (docs/paper.md §6.8)
    EmpiricalSetup(depth=256, d_model=64, seeds=[0, 1]) # the random-init models of the empirical check
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from depthlab.base.errors import DepthlabError

if TYPE_CHECKING:
    from depthlab.models.config import ModelConfig

MAX_EMPIRICAL_DEPTH = 4096  # beyond this a CPU run takes far too long to be useful


def check_int(name: str, value: Any, lo: int, hi: int | None = None) -> int:
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= lo
    if ok and hi is not None:
        ok = value <= hi
    if not ok:
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise DepthlabError(f"{name} must be an integer {rng}, got {value!r}")
    return int(value)


def check_pos(name: str, value: float, allow_zero: bool = False) -> float:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        rng = ">= 0" if allow_zero else "> 0"
        raise DepthlabError(f"{name} must be a finite number {rng}, got {value!r}")
    return float(value)


@dataclass
class TheoryOptions:
    """What ``depthlab theory`` runs: the recursions to ``depth``, and the empirical check unless ``empirical`` is
    off (its models: :class:`EmpiricalSetup`; the recursions' constants: :class:`RecursionParams`)."""

    depth: int = 1000  # depth to iterate the recursions to (>= 2)
    empirical: bool = True  # also measure random-init pre and lns models (--no-empirical: the recursions only, instant)
    recursion: RecursionParams = field(default_factory=lambda: RecursionParams())
    setup: EmpiricalSetup = field(default_factory=lambda: EmpiricalSetup())


@dataclass
class RecursionParams:
    """The constants of the recursions and gradient bounds (docs/paper.md §6.8)."""

    c: float = 1.0  # branch constant c of the Θ(1 + c/σ) factor (paper: numerator set to 1)
    sigma1_sq: float = 1.0  # σ²_1, variance of block 1's input (only c/σ_1 matters)
    A: float = 1.0  # first-order constant of the gradient bound (Theorems 3.3 / 4.2)
    B: float = 1.0  # second-order constant of the gradient bound (Theorems 3.3 / 4.2)


@dataclass
class EmpiricalSetup:
    """The randomly initialised pre and lns models of the empirical check (:mod:`depthlab.analysis.theory.empirical`)."""

    depth: int = 256  # blocks of the random models at most; as many as the recursions when fewer (every depth measured)
    d_model: int = 64  # width; narrow so hundreds of layers run in seconds on a CPU
    n_heads: int = 4  # attention heads
    d_ff: int | None = None  # MLP width; None = the tiny preset's ratio 2.75·d_model, rounded to a multiple of 8
    seq_len: int = 64  # tokens per sequence
    batch_size: int = 2  # sequences
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])  # init seeds, one model per scheme and seed (default 0,1,2)
    init_std: float = 0.02  # weight init std (the paper's); larger values exaggerate the branches
    n_jacobian_depths: int = 12  # geometric grid of probed depths for ‖∂y_l/∂x_1‖

    def validate(self) -> None:
        check_int("empirical depth", self.depth, 2, MAX_EMPIRICAL_DEPTH)
        for name in ("d_model", "n_heads", "seq_len", "batch_size", "n_jacobian_depths"):
            check_int(name, getattr(self, name), 1)
        if self.d_ff is not None:
            check_int("d_ff", self.d_ff, 1)
        if not self.seeds:
            raise DepthlabError("seeds must list at least one seed, got none")
        check_pos("init_std", self.init_std)
        self.config("pre")  # shape errors (width vs heads, ...) surface now, as ConfigError

    def config(self, scheme: str) -> ModelConfig:
        """The tiny preset narrowed/deepened to this setup."""
        from depthlab.models.configure import from_preset

        return from_preset(
            "tiny", scheme=scheme, n_layers=self.depth, d_model=self.d_model, n_heads=self.n_heads,
            d_ff=self.ffn, max_seq_len=self.seq_len, init_std=self.init_std,
        )

    @property
    def ffn(self) -> int:
        return self.d_ff if self.d_ff is not None else max(8, 8 * round(2.75 * self.d_model / 8))

    def probe_depths(self) -> list[int]:
        import numpy as np

        grid = np.geomspace(1, self.depth, self.n_jacobian_depths)
        return sorted({int(round(v)) for v in grid} | {self.depth})
