"""Figures (depthlab.analysis.plots): whole PNGs or none, inputs that do not line up refused in one line, one colour
per scheme in every figure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from matplotlib.image import imread

from depthlab.analysis.plots import diagnostics as P
from depthlab.base.errors import DepthlabError

PNG = b"\x89PNG\r\n\x1a\n"
ROOT = Path(__file__).resolve().parents[3]


def _layout(L: int) -> list[list[float | None]]:
    """A diagnose-report angular matrix: matrix[n-1][l-1] = d(x^l, x^{l+n}), None where l + n > L + 1."""
    return [[0.1 * n if l + n <= L + 1 else None for l in range(1, L + 1)] for n in range(1, L + 1)]


def test_each_figure_writes_a_whole_png(tmp_path):
    L = 5
    paths = [
        P.angular_heatmap(_layout(L), tmp_path / "a.png"),
        P.adjacent_angular([0.1] * L, tmp_path / "b.png", threshold=0.1),
        P.removal_drop([0.5, -0.01, 0.2, 0.0, 3.0], tmp_path / "c.png", base_loss=3.2, delta_acc=[0.1] * L),
        P.variance_growth([1.0] * (L + 1), [2.0] * (L + 1), tmp_path / "d.png"),
        P.jacobian_summary([1, 2, 3], [0.5, 0.4, 0.3], [0.9, 0.8, 0.7], tmp_path / "e.png"),
    ]
    for path in paths:
        assert path.read_bytes()[:8] == PNG
        height, width, channels = imread(path).shape
        assert height > 100 and width > 100 and channels in (3, 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.png", "c.png", "d.png", "e.png"]  # no temp file


def test_a_figure_that_fails_while_written_leaves_the_earlier_one_whole(tmp_path, monkeypatch):
    path = P.adjacent_angular([0.1, 0.2, 0.3], tmp_path / "adjacent.png")
    before = path.read_bytes()

    def broken(self, fname, **kw):  # half a PNG, then the disk fills up
        Path(fname).write_bytes(PNG + b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", broken)
    with pytest.raises(DepthlabError, match="no space left on the device holding"):  # one line, naming the file
        P.adjacent_angular([0.3, 0.2, 0.1], path)
    assert path.read_bytes() == before  # the earlier figure, untouched
    assert [p.name for p in tmp_path.iterdir()] == ["adjacent.png"]  # and no half-written sibling left
    with pytest.raises(DepthlabError):
        P.adjacent_angular([0.3, 0.2, 0.1], tmp_path / "new.png")
    assert not (tmp_path / "new.png").exists()  # a new figure: whole or not at all


@pytest.mark.parametrize("draw, words", [
    (lambda p: P.variance_growth([1.0] * 5, [2.0] * 4, p), ["variance has 5", "mean_norm has 4"]),
    (lambda p: P.jacobian_summary([1, 2, 3], [0.5, 0.4], [0.9, 0.8, 0.7], p), ["rel_dist has 2", "layers has 3"]),
    (lambda p: P.removal_drop([0.1] * 4, p, delta_acc=[0.0] * 3), ["delta_loss has 4", "delta_acc has 3"]),
    (lambda p: P.angular_heatmap(_layout(4)[:3], p), ["L rows of L values", "3 rows"]),
    (lambda p: P.angular_heatmap([[0.1, 0.2], [0.3]], p), ["L rows of L values"]),
    (lambda p: P.variance_growth([], [], p), ["variance has 0"]),
])
def test_inputs_that_do_not_line_up_are_refused_before_drawing(tmp_path, draw, words):
    with pytest.raises(DepthlabError) as err:
        draw(tmp_path / "x.png")
    assert len(str(err.value).splitlines()) == 1 and all(w in str(err.value) for w in words), str(err.value)
    assert not list(tmp_path.iterdir())


def test_a_scheme_has_one_colour_in_every_figure_and_report():
    """pre blue and lns orange whatever the order a figure lists them in; registry schemes and the paper's
    Table 8 variants all distinct; the same label always gets the same colour (no per-figure enumeration)."""
    from depthlab.analysis.plots._base import scheme_color
    from depthlab.models.schemes import SCHEMES

    assert (scheme_color("pre"), scheme_color("lns")) == ("#1f77b4", "#ff7f0e")
    variants = [f"lns:position={p}" for p in ("before-norm", "after-branch", "after-residual", "attn-only", "ffn-only")]
    names = [*SCHEMES, *variants]
    assert len({scheme_color(n) for n in names}) == len(names)
    assert [scheme_color(n) for n in reversed(names)] == [scheme_color(n) for n in names][::-1]


def test_importing_plots_leaves_the_backend_alone():
    code = ("import sys, matplotlib; raw = lambda: dict.__getitem__(matplotlib.rcParams, 'backend'); b = raw(); "
            "import depthlab.analysis.plots.training, depthlab.analysis.plots.diagnostics, "
            "depthlab.analysis.plots.compare, depthlab.analysis.plots.theory; "
            "assert raw() == b, raw(); assert 'matplotlib.pyplot' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
