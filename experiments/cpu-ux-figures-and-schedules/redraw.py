"""Redraw every figure of a compare directory from its runs' metrics.jsonl and report.json (the code on PYTHONPATH
draws them): ``PYTHONPATH=SRC python redraw.py COMPARE_DIR``."""

import json
import sys
from pathlib import Path

from depthlab.analysis.diagnostics.report import make_figures
from depthlab.analysis.plots.training import run_figures
from depthlab.compare.page import write_compare_report

out = Path(sys.argv[1])
for run in (out / "runs").iterdir():
    run_figures(run)
    make_figures(json.loads((run / "diagnostics" / "report.json").read_text()), run / "diagnostics")
write_compare_report(json.loads((out / "summary.json").read_text()), out)
