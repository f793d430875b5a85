"""One writer per run directory: an exclusive ``fcntl.flock`` on ``<run>/.lock`` holding the PID.

    with RunLock(out):          # DepthlabError "... is in use by process 1234" when another holds it
        ...                     # train / compare for the whole run

The kernel releases a flock when its process dies (``kill -9`` included), so a stale ``.lock`` file
never blocks. Acquiring writes nothing when the lock is held by someone else.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from depthlab.base.errors import DepthlabError

LOCK_NAME = ".lock"

try:
    import fcntl
except ImportError:  # Windows: no locking (documented)
    fcntl = None


class RunLock:
    """An exclusive lock on ``<directory>/.lock`` (the directory must exist)."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / LOCK_NAME
        self.fd: int | None = None

    def acquire(self) -> RunLock:
        if fcntl is None:
            return self
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise DepthlabError(f"cannot lock {str(self.path.parent)!r}: {err.strerror or err}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DepthlabError(f"run directory {str(self.path.parent)!r} is in use by process {holder} "
                                f"(another depthlab command is writing it); wait for it or choose another") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return self

    def try_acquire_quietly(self) -> bool:
        """Take the lock if nobody holds it, writing nothing (no PID: a clean-up on a full disk must not write);
        False when another process holds it. A missing ``.lock`` counts as free."""
        if fcntl is None or not self.path.exists():
            return True
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing releases the flock; the file stays (harmless)
            self.fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


#: What a training run writes before its first checkpoint (and nothing else: a directory holding more is not one).
FIRST_FILES = ("config.json", "metrics.jsonl", "tokenizer", "checkpoint", "summary.json", LOCK_NAME)


def stopped_before_first_checkpoint(out: Path) -> bool:
    """Whether ``out`` is a run directory whose training stopped (``kill -9``, a crash) before its first checkpoint:
    a run's config.json, no checkpoint (only the hidden ``.tmp-*`` of an interrupted write), and nothing but what
    a run writes first. Such a run holds nothing to resume: a fresh command on the same ``--out`` starts it
    afresh (:meth:`RunGuard.create`), where any other existing directory is refused."""
    import json

    if not (out / "config.json").is_file() or any(p.name not in FIRST_FILES for p in out.iterdir()):
        return False
    ckpt = out / "checkpoint"
    if ckpt.exists() and (not ckpt.is_dir() or any(not (p.name.startswith(".") and ".tmp-" in p.name) for p in ckpt.iterdir())):
        return False
    try:
        saved = json.loads((out / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(saved, dict) and "train" in saved and "model" in saved


def check_resumable(out: Path) -> None:
    """Refuse, in one line saying what to do, a ``--resume`` of a run that stopped before its first checkpoint."""
    if not stopped_before_first_checkpoint(out):
        return
    lock = RunLock(out)
    if not lock.try_acquire_quietly():
        raise DepthlabError(f"run directory {str(out)!r} is in use by another process (still before its first "
                            "checkpoint); wait for it")
    lock.release()
    raise DepthlabError(f"cannot resume {str(out)!r}: it stopped before its first checkpoint, so there is nothing to "
                        "resume; run the command that started it again (without --resume): it starts the run afresh")


class RunGuard:
    """A run directory's lock and clean-up for one command (see :func:`run_guard`)."""

    def __init__(self, out: Path, enabled: bool, existing: bool) -> None:
        self.out, self.enabled, self.existing, self.lock = out, enabled, existing, RunLock(out)
        self.created: Path | None = None  # the topmost directory this command created
        self.was_empty = False  # an existing empty directory: its contents are ours
        self.kept = False

    def enter(self) -> None:
        if self.enabled and self.existing and (self.out / "config.json").is_file():
            self.lock.acquire()  # an existing run: locked before anything is read

    def create(self) -> None:
        """Create the directory (after validation) and lock it; a fresh run found filled meanwhile by
        another process is refused."""
        if not self.enabled or self.lock.fd is not None:
            return
        missing = [p for p in (self.out, *self.out.parents) if not p.exists()]
        was_empty = not missing and self.out.is_dir() and not any(self.out.iterdir())
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise DepthlabError(f"cannot create {str(self.out)!r}: {err.strerror or err}") from None
        self.lock.acquire()  # refused: another process holds it, and nothing here is ours to remove
        if stopped_before_first_checkpoint(self.out):  # nothing to resume there, and nobody writes it: start afresh
            import logging

            logging.getLogger(__name__).warning("%s holds a run stopped before its first checkpoint (nothing to "
                                                "resume): starting it afresh", self.out)
            for p in self.out.iterdir():
                if p.name != LOCK_NAME:
                    shutil.rmtree(p) if p.is_dir() else p.unlink()
            was_empty = True
        if any(p.name != LOCK_NAME for p in self.out.iterdir()):
            self.lock.release()
            raise DepthlabError(f"run directory {str(self.out)!r} was created by another process meanwhile; "
                                "choose a new --out")
        self.created, self.was_empty = (missing[-1] if missing else None), was_empty

    def keep(self) -> None:
        """Set-up succeeded: what was created stays, whatever happens later."""
        self.kept = True

    def exit(self, failed: bool) -> None:
        try:
            if failed and self.enabled and not self.kept and self.lock.fd is not None:
                self._remove_created()
        finally:
            self.lock.release()

    def _remove_created(self) -> None:
        if self.created is not None:
            shutil.rmtree(self.created, ignore_errors=True)
        elif self.was_empty and self.out.is_dir():
            for p in self.out.iterdir():
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


@contextlib.contextmanager
def run_guard(out: Path, enabled: bool = True, existing: bool = False) -> Iterator[RunGuard]:
    """Lock ``out`` for a command that writes it: an ``existing`` run (one with config.json) at once,
    before anything is read; a new one at ``guard.create()`` (after validation). If the command fails
    before ``guard.keep()``, what it created is removed again. ``enabled=False`` (ranks other than 0)
    does nothing."""
    guard = RunGuard(out, enabled, existing)
    guard.enter()
    failed = True
    try:
        yield guard
        failed = False
    finally:
        guard.exit(failed)
