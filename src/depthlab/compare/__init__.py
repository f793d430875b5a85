"""``compare``: train every scheme the same way, diagnose each, and put them side by side.

    from depthlab.compare import CompareConfig, compare
    result = compare(CompareConfig(schemes=["pre", "lns"], preset="tiny"), "cmp/")

Modules: :mod:`~depthlab.compare.run` (train x schemes x seeds, the table's rows, resume),
:mod:`~depthlab.compare.parallel` (``--jobs``), :mod:`~depthlab.compare.table` (columns and cells),
:mod:`~depthlab.compare.tracking` (depth over training across schemes), :mod:`~depthlab.compare.downstream`
(``--finetune`` / ``--eval``: the paper's Table 2 shape), :mod:`~depthlab.compare.report` (figures, report.html).
"""

from depthlab.compare.run import CompareConfig, aggregate, compare, run_dirname, run_name, run_row, train_and_diagnose
from depthlab.compare.table import COLUMNS, markdown_table

__all__ = ["CompareConfig", "compare", "aggregate", "run_name", "run_dirname", "run_row", "train_and_diagnose",
           "COLUMNS", "markdown_table"]
