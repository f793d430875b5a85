"""Curse-of-Depth diagnostics for any layered model (docs/paper.md §5): angular distance, layer removal,
layerwise variance, block Jacobians; ``depthlab diagnose`` and its report.

    from depthlab.analysis.diagnostics import load_target, diagnose, DiagnoseOptions, write_report
    target = load_target("smollm2")                       # or a run dir, an HF dir, preset:tiny, minilm
    report = diagnose(target, DiagnoseOptions(tokens=8192))
    write_report(report, "reports/smollm2")

Models larger than memory: ``diagnose(load_target(path, stream=None), opts)`` reads one layer at a time when the
model would not fit (``stream=True`` always; ``depthlab.targets.engine.plan_engine`` decides, the report's ``engine``
says which ran and why). The frame: :mod:`~depthlab.analysis.diagnostics.dispatch` (every check once, then the
engine) -> :mod:`~depthlab.analysis.diagnostics.in_memory` or :mod:`~depthlab.analysis.diagnostics.streamed` (the
engines: they feed blocks) -> :mod:`~depthlab.analysis.diagnostics.measures` (the measures, built once, and their
report sections); the layer-by-layer reading itself is :mod:`depthlab.targets.stream`.

Lower level: :class:`ResidualCapture` (hooks reading the residual stream, replay for removal),
:class:`AngularAccumulator`, :class:`VarianceAccumulator`, :class:`RemovalAccumulator`, :class:`MCAccumulator`,
:func:`block_jacobians`.
"""

from depthlab.base.lazy import lazy_exports

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
    "plan_engine",
    "removable_blocks",
    "render_html",
    "summary_sentence",
    "write_report",
]

__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys(("AngularAccumulator", "adjacent", "pair_matrix_to_layout"), "depthlab.analysis.diagnostics.angular"),
    **dict.fromkeys(("LayerCall", "ResidualCapture", "find_layers"), "depthlab.analysis.diagnostics.capture"),
    **dict.fromkeys(("block_jacobian", "block_jacobians"), "depthlab.analysis.diagnostics.jacobian"),
    **dict.fromkeys(("MCAccumulator", "MCItem", "load_mc"), "depthlab.analysis.diagnostics.mc"),
    **dict.fromkeys(("RemovalAccumulator", "joint_removal_loss", "nll_sum"), "depthlab.analysis.diagnostics.removal"),
    **dict.fromkeys(("render_html", "write_report"), "depthlab.analysis.diagnostics.report"),
    "DiagnoseOptions": "depthlab.analysis.diagnostics.options",
    "diagnose": "depthlab.analysis.diagnostics.dispatch",
    **dict.fromkeys(("removable_blocks", "summary_sentence"), "depthlab.analysis.diagnostics.summary"),
    "plan_engine": "depthlab.targets.engine",
    "VarianceAccumulator": "depthlab.analysis.diagnostics.variance",
    **dict.fromkeys(("SHORT_NAMES", "Target", "load_target"), "depthlab.targets"),
})
