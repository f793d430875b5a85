"""Progress for long work, one mechanism for every command and the library: a tqdm bar on a terminal,
log lines with a rate and an ETA otherwise.

    with progress(total=300, desc="training tiny (lns)", unit="step", initial=start) as bar:
        for step in ...:
            ...
            bar.update(1)
            bar.postfix(loss=f"{loss:.3f}", rate=f"{tok_s:,.0f} tok/s")

When stderr is not a terminal (output piped to a log file, a cluster job, CI), a bar would write nothing
readable, so :class:`LogProgress` logs (``logging``, INFO, logger ``depthlab.progress``)
``training tiny (lns): step 75/300 (25%), loss 5.213, 2,410 tok/s, 31s elapsed, ETA 1m33s`` when it
starts, at every quarter, at least every ``every_s`` seconds (:data:`EVERY_S`), and once at the end.

Library entry points (``train``, ``compare``, ``diagnose``, ``prune_target``, ``run_theory``) run inside
:func:`user_logging`: when the caller has configured no logging at all, depthlab's INFO lines go to
stderr for the duration of the call, so ``train(...)`` in a script or a notebook shows its plan and its
progress as ``depthlab train`` does; ``quiet=True`` silences them. A caller who configured logging keeps
full control (nothing is added).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

log = logging.getLogger("depthlab.progress")

#: Seconds between two progress lines when stderr is not a terminal (a line also marks each quarter).
EVERY_S = 30.0

_LINES_ONLY = False  # set by use_log_lines(): log lines even on a terminal (e.g. several processes share it)


def use_log_lines(on: bool = True) -> None:
    """Log lines instead of bars, even on a terminal: for processes that share one (``compare --jobs``
    workers), where bars would overwrite each other."""
    global _LINES_ONLY
    _LINES_ONLY = on


def plural(n: int, unit: str) -> str:
    """``1 step``, ``20 steps``, ``3 passes``, ``5 it``."""
    if n == 1 or unit == "it" or not unit[-1:].isalpha():
        return f"{n} {unit}"
    return f"{n} {unit}{'es' if unit.endswith('s') else 's'}"


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``: a duration a person reads at a glance."""
    if seconds != seconds or seconds == float("inf"):  # NaN / inf: not known yet
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class LogProgress:
    """A tqdm-like progress that reports through ``logging`` (INFO): a line at the start, at every quarter,
    at least every ``every_s`` seconds, and at the end. ``initial``: work already done before (a resumed
    run); the rate and the ETA count only this session's work."""

    def __init__(self, total: int | None, desc: str, unit: str = "it", every_s: float | None = None,
                 initial: int = 0, clock: Any = time.perf_counter) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.every_s = EVERY_S if every_s is None else every_s
        self.clock, self.initial, self.n = clock, initial, initial
        self.t0 = self.last = clock()
        self.next_quarter = 1 + (4 * initial // total if total else 0)
        self.extra: dict[str, Any] = {}
        self.closed = False
        done = f", {initial} done before" if initial else ""
        log.info("%s: started%s", desc, f" ({plural(total, unit)}{done})" if total else "")

    def __enter__(self) -> LogProgress:
        return self

    def postfix(self, **values: Any) -> None:
        """Values shown after the count in the next line (e.g. ``loss="5.21"``, ``rate="2,410 tok/s"``; None
        removes one; a callable is called only when a line is written, so a value that costs a device sync, such
        as a loss on a GPU, is read a few times a run, not at every step)."""
        self.extra.update(values)
        for key in [k for k, v in values.items() if v is None]:
            del self.extra[key]

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self.clock()
        quarter = bool(self.total) and self.n * 4 >= self.next_quarter * self.total
        if quarter or now - self.last >= self.every_s:
            if quarter:
                self.next_quarter = self.n * 4 // self.total + 1
            self.last = now
            if self.total is None or self.n < self.total:
                log.info("%s", self.line(now))

    def _extras(self) -> str:
        shown = {k: v() if callable(v) else v for k, v in self.extra.items()}
        return "".join(f", {v}" if k == "rate" else f", {k} {v}" for k, v in shown.items())

    def line(self, now: float) -> str:
        elapsed = now - self.t0
        extra = self._extras()
        if not self.total:
            return f"{self.desc}: {plural(self.n, self.unit)}{extra}, {duration(elapsed)} elapsed"
        done = self.n - self.initial
        eta = elapsed / done * (self.total - self.n) if done > 0 else float("nan")
        return (f"{self.desc}: {self.unit} {self.n}/{self.total} ({100 * self.n / self.total:.0f}%){extra}, "
                f"{duration(elapsed)} elapsed, ETA {duration(eta)}")

    def close(self, ok: bool = True) -> None:
        if self.closed:
            return
        self.closed = True
        if ok:
            extra = self._extras()
            count = plural(self.n - self.initial, self.unit) + (f" (to {self.n}/{self.total})" if self.initial else "")
            log.info("%s: done, %s in %s%s", self.desc, count, duration(self.clock() - self.t0), extra)

    def __exit__(self, *exc: Any) -> None:
        self.close(exc[0] is None)


class _Bar:
    """tqdm on a terminal, with :class:`LogProgress`'s interface (``postfix``, ``close``)."""

    def __init__(self, total: int | None, desc: str, unit: str, initial: int, stream: Any) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc=desc, unit=unit, initial=initial, leave=False, dynamic_ncols=True,
                        file=stream)
        self.values: dict[str, Any] = {}
        self.shown_at = 0.0

    def __enter__(self) -> _Bar:
        return self

    def update(self, n: int = 1) -> None:
        now = time.perf_counter()
        if self.values and now - self.shown_at >= 0.5:  # callables (a GPU loss) read twice a second at most
            self.shown_at = now
            self.bar.set_postfix({k: v() if callable(v) else v for k, v in self.values.items()}, refresh=False)
        self.bar.update(n)

    def postfix(self, **values: Any) -> None:
        self.values.update(values)
        for key in [k for k, v in values.items() if v is None]:
            del self.values[key]

    def close(self, ok: bool = True) -> None:
        self.bar.close()

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Off:
    def __enter__(self) -> _Off:
        return self

    def update(self, n: int = 1) -> None:
        pass

    def postfix(self, **values: Any) -> None:
        pass

    def close(self, ok: bool = True) -> None:
        pass

    def __exit__(self, *exc: Any) -> None:
        pass


def progress(total: int | None, desc: str, unit: str = "it", enabled: bool = True, stream: Any = None,
             initial: int = 0, every_s: float | None = None, lines: bool = False):
    """A bar when ``stream`` (default stderr) is a terminal, log lines (:class:`LogProgress`) when it is not
    or ``lines`` asks for them, nothing when ``enabled`` is False. Each has ``update(n)``, ``postfix(**values)``
    and ``close()``, and is a context manager."""
    if not enabled:
        return _Off()
    stream = stream if stream is not None else sys.stderr
    if not (lines or _LINES_ONLY) and hasattr(stream, "isatty") and stream.isatty():
        return _Bar(total, desc, unit, initial, stream)
    return LogProgress(total, desc, unit, every_s, initial)


@contextlib.contextmanager
def user_logging(quiet: bool = False) -> Iterator[None]:
    """Around a library entry point: when the caller configured no logging (no handler on the root logger
    nor on ``depthlab``'s), depthlab's INFO lines go to stderr for the call, as the command line shows them;
    ``quiet``: only warnings and errors, whatever the caller configured."""
    lib = logging.getLogger("depthlab")
    saved_level = lib.level
    handler = None
    if not logging.getLogger().handlers and not lib.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        lib.addHandler(handler)
        if lib.level == logging.NOTSET:  # a level the caller set on depthlab's logger stays
            lib.setLevel(logging.INFO)
    if quiet:
        lib.setLevel(logging.WARNING)
    try:
        yield
    finally:
        lib.setLevel(saved_level)
        if handler is not None:
            lib.removeHandler(handler)


F = TypeVar("F", bound=Callable[..., Any])


def logs_to_stderr(fn: F) -> F:
    """Decorate a library entry point: it runs inside :func:`user_logging` (``quiet`` taken from its ``quiet``
    keyword argument, if it has one)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with user_logging(bool(kwargs.get("quiet", False))):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
