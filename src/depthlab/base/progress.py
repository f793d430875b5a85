"""Progress for long work: a tqdm bar on a terminal, a log line per stage with an ETA otherwise.

    with progress(total=64, desc="residual stream", unit="seq") as bar:
        for batch in batches:
            ...
            bar.update(len(batch))

When stderr is not a terminal (output piped to a file, a CI log), a bar would write nothing readable,
so :class:`LogProgress` logs ``desc: 16/64 seq (25%), 12s elapsed, ETA 36s`` at the start, at every
quarter and at least every ``every_s`` seconds, and once at the end.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

log = logging.getLogger("depthlab.base.progress")


class LogProgress:
    """A tqdm-like context manager that reports through ``logging`` (INFO)."""

    def __init__(self, total: int | None, desc: str, unit: str = "it", every_s: float = 15.0) -> None:
        self.total, self.desc, self.unit, self.every_s = total, desc, unit, every_s
        self.n, self.t0, self.last, self.next_quarter = 0, time.perf_counter(), 0.0, 1

    def __enter__(self) -> LogProgress:
        self.t0 = self.last = time.perf_counter()
        log.info("%s: started%s", self.desc, f" ({self.total} {self.unit})" if self.total else "")
        return self

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        quarter = self.total and self.n * 4 >= self.next_quarter * self.total
        if quarter or now - self.last >= self.every_s:
            if quarter:
                self.next_quarter = int(self.n * 4 / self.total) + 1
            self.last = now
            if self.total is None or self.n < self.total:
                log.info("%s", self.line(now))

    def line(self, now: float) -> str:
        elapsed = now - self.t0
        if not self.total:
            return f"{self.desc}: {self.n} {self.unit}, {elapsed:.0f}s elapsed"
        eta = elapsed / self.n * (self.total - self.n) if self.n else float("nan")
        return (f"{self.desc}: {self.n}/{self.total} {self.unit} ({100 * self.n / self.total:.0f}%), "
                f"{elapsed:.0f}s elapsed, ETA {eta:.0f}s")

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            log.info("%s: done, %d %s in %.0fs", self.desc, self.n, self.unit, time.perf_counter() - self.t0)


class _Off:
    def __enter__(self) -> _Off:
        return self

    def update(self, n: int = 1) -> None:
        pass

    def __exit__(self, *exc: Any) -> None:
        pass


def progress(total: int | None, desc: str, unit: str = "it", enabled: bool = True, stream: Any = None):
    """A bar when ``stream`` (default stderr) is a terminal, log lines when it is not, nothing when
    ``enabled`` is False."""
    if not enabled:
        return _Off()
    stream = stream if stream is not None else sys.stderr
    if hasattr(stream, "isatty") and stream.isatty():
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True)
    return LogProgress(total, desc, unit)
