"""metrics.jsonl of a run (rank 0 only), optionally mirrored to tensorboard.

One JSON object per line, each with ``step``: train lines (loss, lr, tokens, tokens_per_s,
grad_norm), eval lines (eval_loss, eval_ppl, eval_tokens) and probe lines (layer_variance).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from depthlab.errors import DepthlabError

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
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        f.write("".join(ln + "\n" for ln in keep))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class MetricsLog:
    """Appends records to ``path``; on resume (``keep_until`` = the checkpoint's step) first drops
    the lines written after that step. Does nothing on ranks other than 0 (``enabled=False``)."""

    def __init__(self, path: Path, enabled: bool, keep_until: int | None, tensorboard: bool) -> None:
        self.enabled, self.path, self.tb = enabled, path, None
        if not enabled:
            return
        if keep_until is not None and path.is_file():  # resuming: drop lines past the checkpoint
            _truncate_after(path, keep_until)
        self.f = path.open("a")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise DepthlabError("--tensorboard needs the tensorboard package "
                                    "(pip install 'depthlab[logging]')") from None
            self.tb = SummaryWriter(str(path.parent / "tensorboard"))

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` (and its numbers to tensorboard; list values as one scalar per block)."""
        if not self.enabled:
            return
        self.f.write(json.dumps(record) + "\n")
        self.f.flush()
        if self.tb is not None:
            for k, v in record.items():
                if isinstance(v, list):
                    for i, x in enumerate(v, 1):
                        self.tb.add_scalar(f"{k}/{i:03d}", x, record["step"])
                elif k != "step" and isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, record["step"])

    def close(self) -> None:
        if self.enabled:
            self.f.close()
            if self.tb is not None:
                self.tb.close()
