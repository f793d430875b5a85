"""metrics.jsonl of a run (rank 0 only), optionally mirrored to experiment trackers.

One JSON object per line, each with ``step``: train lines (loss, lr, tokens, tokens_per_s,
grad_norm), eval lines (eval_loss, eval_ppl, eval_tokens) and probe lines (layer_variance, ...).
Each line also goes to the trackers the run names (TensorBoard, W&B, trackio:
:mod:`depthlab.analysis.monitor.trackers`), which get the depth heatmap when the log closes.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from depthlab.analysis.monitor.trackers import Trackers, TrackerSpec
from depthlab.base.fileio import write_text_atomic

log = logging.getLogger(__name__)


def _truncate_after(path: Path, step: int) -> None:
    """Keep the lines of ``path`` up to ``step``: written to a new file, fsynced, renamed over the old
    one (a crash leaves either the old or the new history, never half). A torn (unparsable) line, as a
    crash mid-write leaves, is dropped with a warning."""
    keep, torn = [], 0
    for ln in path.read_text(errors="replace").splitlines():
        if not ln.strip():
            continue
        try:
            rec = json.loads(ln)
        except ValueError:
            torn += 1
            continue
        if isinstance(rec, dict) and rec.get("step", 0) <= step:
            keep.append(ln)
    if torn:
        log.warning("%s: dropped %d unreadable line(s) (a write cut short)", path, torn)
    write_text_atomic(path, "".join(ln + "\n" for ln in keep))


class MetricsLog:
    """Appends records to ``path``; on resume (``keep_until`` = the checkpoint's step) first drops
    the lines written after that step. Does nothing on ranks other than 0 (``enabled=False``)."""

    def __init__(self, path: Path, enabled: bool, keep_until: int | None, trackers: TrackerSpec | None = None,
                 config: dict[str, Any] | None = None) -> None:
        self.enabled, self.path, self.trackers = enabled, path, None
        if not enabled:
            return
        if keep_until is not None and path.is_file():  # resuming: drop lines past the checkpoint
            _truncate_after(path, keep_until)
        if trackers is not None and trackers.backends:
            self.trackers = Trackers.open(trackers, path.parent, config, keep_until)
        self.f = path.open("a")

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` (and send it to the trackers)."""
        if not self.enabled:
            return
        self.f.write(json.dumps(record) + "\n")
        self.f.flush()
        if self.trackers is not None:
            self.trackers.write(record)

    def close(self) -> None:
        """Close the file; the trackers get the depth heatmap of every probe line in it, then close."""
        if self.enabled:
            self.f.close()
            if self.trackers is not None:
                lines = [json.loads(ln) for ln in self.path.read_text().splitlines() if ln.strip()]
                self.trackers.finish(lines)
