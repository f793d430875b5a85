"""Curse-of-Depth diagnostics for any layered model (docs/paper.md §5): angular distance, layer removal,
layerwise variance, block Jacobians; ``depthlab diagnose`` and its report.

    from depthlab.diagnostics import load_target, diagnose, DiagnoseOptions, write_report
    target = load_target("smollm2")                       # or a run dir, an HF dir, preset:tiny, minilm
    report = diagnose(target, DiagnoseOptions(tokens=8192))
    write_report(report, "reports/smollm2")

Lower level: :class:`ResidualCapture` (hooks reading the residual stream, replay for removal),
:class:`AngularAccumulator`, :class:`VarianceAccumulator`, :class:`RemovalAccumulator`, :class:`MCAccumulator`,
:func:`block_jacobians`.
"""

from depthlab.diagnostics.angular import AngularAccumulator, adjacent, pair_matrix_to_layout
from depthlab.diagnostics.capture import LayerCall, ResidualCapture, find_layers
from depthlab.diagnostics.jacobian import block_jacobian, block_jacobians
from depthlab.diagnostics.mc import MCAccumulator, MCItem, load_mc
from depthlab.diagnostics.removal import RemovalAccumulator, joint_removal_loss, nll_sum
from depthlab.diagnostics.report import render_html, write_report
from depthlab.diagnostics.runner import DiagnoseOptions, diagnose
from depthlab.diagnostics.summary import removable_blocks, summary_sentence
from depthlab.diagnostics.variance import VarianceAccumulator
from depthlab.targets import SHORT_NAMES, Target, load_target

__all__ = [
    "SHORT_NAMES",
    "AngularAccumulator",
    "DiagnoseOptions",
    "LayerCall",
    "MCAccumulator",
    "MCItem",
    "RemovalAccumulator",
    "ResidualCapture",
    "Target",
    "VarianceAccumulator",
    "adjacent",
    "block_jacobian",
    "block_jacobians",
    "diagnose",
    "find_layers",
    "joint_removal_loss",
    "load_mc",
    "load_target",
    "nll_sum",
    "pair_matrix_to_layout",
    "removable_blocks",
    "render_html",
    "summary_sentence",
    "write_report",
]
