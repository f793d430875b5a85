"""The output directory of a command: checked before the command runs, removed again when it fails.

    guard = OutputGuard.for_args(args)     # DepthlabError for an --out that is a file or not writable
    ...                                     # the command
    guard.cleanup()                         # on failure: remove what the command created

A directory that existed before is never removed, nor one holding a training checkpoint (a failed
train or compare stays resumable), nor one another process holds the run lock of.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from depthlab.base.errors import DepthlabError

#: command -> the argparse dest of its output directory.
OUTPUT_ARGS = {"train": "out", "compare": "out", "diagnose": "out", "export": "hf", "tokenize": "out",
               "theory": "out", "evaluate": "out", "prune": "out", "finetune": "out", "demo": "out"}


def check_output_dir(path: Path, flag: str) -> None:
    """Refuse, in one line, an output directory that cannot be created or written."""
    if path.is_symlink() and not path.exists():
        raise DepthlabError(f"{flag} {str(path)!r} is a symbolic link to {os.readlink(path)!r}, which does not exist")
    if path.exists() and not path.is_dir():
        raise DepthlabError(f"{flag} {str(path)!r} is an existing file, not a directory")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise DepthlabError(f"{flag} {str(path)!r}: {str(parent)!r} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DepthlabError(f"{flag} {str(path)!r}: {str(parent)!r} is not writable")


class OutputGuard:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.existed = path is None or path.exists()

    @classmethod
    def for_args(cls, args) -> OutputGuard:
        dest = OUTPUT_ARGS.get(getattr(args, "command", None) or "")
        value = getattr(args, dest, None) if dest else None
        if not value:
            return cls(None)
        path = Path(value).expanduser()
        check_output_dir(path, "--" + dest)
        return cls(path)

    def cleanup(self) -> None:
        """Remove the output directory when this command created it and it holds no checkpoint. Never raises and
        never writes (on a full disk the clean-up must not fail itself): the lock is only tested, not recorded."""
        if self.existed or self.path is None or not self.path.is_dir():
            return
        try:
            if any(self.path.rglob("trainer_state.json")):
                return
            from depthlab.base.store.lock import RunLock

            lock = RunLock(self.path)
            if not lock.try_acquire_quietly():  # another process created it meanwhile and is writing it: not ours
                return
            try:
                shutil.rmtree(self.path, ignore_errors=True)
            finally:
                lock.release()
        except OSError:  # the one error line matters more than a failed clean-up
            return
