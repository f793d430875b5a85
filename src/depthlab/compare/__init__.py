"""``compare``: train every scheme the same way, diagnose each, and put them side by side.

    from depthlab.compare import CompareConfig, compare
    result = compare(CompareConfig(schemes=["pre", "lns"], preset="tiny"), "cmp/")

Modules: :mod:`~depthlab.compare.config` (the settings, torch-free), :mod:`~depthlab.compare.experiment` (train x
schemes x seeds, the table's rows, resume),
:mod:`~depthlab.compare.parallel` (``--jobs``), :mod:`~depthlab.compare.table` (columns and cells),
:mod:`~depthlab.compare.curves` (depth over training across schemes), :mod:`~depthlab.compare.downstream`
(``--finetune`` / ``--eval``: the paper's Table 2 shape), :mod:`~depthlab.compare.page` (figures, report.html).
"""

from depthlab.base.lazy import lazy_exports

__all__ = ["CompareConfig", "Downstream", "compare", "aggregate", "run_name", "run_dirname", "run_row",
           "train_and_diagnose", "COLUMNS", "markdown_table"]

__getattr__ = lazy_exports(__name__, {
    "CompareConfig": "depthlab.compare.config", "Downstream": "depthlab.compare.config",
    **{name: "depthlab.compare.experiment" for name in ("compare", "aggregate", "run_name", "run_dirname", "run_row",
                                                  "train_and_diagnose")},
    "COLUMNS": "depthlab.compare.table", "markdown_table": "depthlab.compare.table"})
