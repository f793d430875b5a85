"""``compare``: train every scheme the same way, diagnose each, and put them side by side.

    from depthlab.compare import CompareConfig, compare
    result = compare(CompareConfig(schemes=["pre", "lns"], preset="tiny"), "cmp/")

Modules: :mod:`~depthlab.compare.config` (the settings, torch-free), :mod:`~depthlab.compare.experiment` (train x
schemes x seeds, the table's rows, resume),
:mod:`~depthlab.compare.parallel` (``--jobs``), :mod:`~depthlab.compare.table` (columns and cells),
:mod:`~depthlab.compare.curves` (depth over training across schemes), :mod:`~depthlab.compare.downstream`
(``--finetune`` / ``--eval``: the paper's Table 2 shape), :mod:`~depthlab.compare.page` (figures, report.html),
:mod:`~depthlab.compare.sweep` (``--sweep``: the comparison once per cell of a grid of training settings; its
``compare`` is the entry point, a plain compare without a sweep).
"""

from depthlab.base.lazy import lazy_exports

__all__ = ["CompareConfig", "Downstream", "compare", "aggregate", "run_name", "run_dirname", "run_row",
           "train_and_diagnose", "COLUMNS", "markdown_table"]

__getattr__ = lazy_exports(__name__, {
    "CompareConfig": "depthlab.compare.config", "Downstream": "depthlab.compare.config",
    "compare": "depthlab.compare.sweep",  # one compare, or one per cell of a regime sweep
    **{name: "depthlab.compare.experiment" for name in ("aggregate", "run_name", "run_dirname", "run_row",
                                                  "train_and_diagnose")},
    "COLUMNS": "depthlab.compare.table", "markdown_table": "depthlab.compare.table"})
