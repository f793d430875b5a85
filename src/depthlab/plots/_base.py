"""What every figure module shares: resolution, saving, tick spacing."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt

DPI = 130


def save(fig, path: str | Path, layout: bool = True) -> Path:
    """Lay out (unless ``layout=False``, e.g. with a shared colour bar), write ``path`` as PNG
    (creating its folder), close the figure, return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if layout:
        fig.tight_layout()
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def ticks(n: int, max_ticks: int = 16) -> list[int]:
    """1-based tick positions for n layers, at most ``max_ticks`` of them."""
    step = max(1, math.ceil(n / max_ticks))
    return list(range(1, n + 1, step))
