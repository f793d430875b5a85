"""Outputs that appear whole or not at all: a directory written as a temporary sibling, then renamed.

    with publish_dir(out) as tmp:        # tmp = <out's parent>/.<out name>.tmp-<pid>
        write_everything_into(tmp)       # a crash or an exception here leaves nothing at ``out``
    # here ``out`` exists, complete (renamed from tmp; an empty ``out`` made by the caller is replaced)

A killed process leaves at most a ``.<name>.tmp-<pid>`` sibling, never a half-written ``out``;
:func:`remove_stale_tmp_dirs` clears those of dead processes before a rerun.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from depthlab.errors import DepthlabError, is_disk_full, os_error_line

TMP_MARK = ".tmp-"


def tmp_sibling(out: Path) -> Path:
    """The temporary sibling ``out`` is written as by this process."""
    return out.parent / f".{out.name}{TMP_MARK}{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_tmp_dirs(out: Path) -> list[Path]:
    """Remove ``out``'s temporary siblings left by processes that no longer run; returns what was removed."""
    removed = []
    prefix = f".{out.name}{TMP_MARK}"
    for p in out.parent.glob(f"{prefix}*") if out.parent.is_dir() else []:
        pid = p.name[len(prefix):]
        if pid.isdigit() and not _alive(int(pid)) and int(pid) != os.getpid():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


@contextlib.contextmanager
def publish_dir(out: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary sibling of ``out``; on success rename it to ``out`` (which must be absent or an
    empty directory), on any exception remove it. DepthlabError (one line) when ``out`` holds files."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DepthlabError(f"output directory {str(out)!r} exists and is not empty; give a new one")
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp_dirs(out)
    tmp = tmp_sibling(out)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        _fsync_tree(tmp)
        if out.exists():
            out.rmdir()  # the caller's empty directory (e.g. locked by the CLI): replaced by the complete one
        os.rename(tmp, out)
    except Exception as err:  # noqa: BLE001 - a full disk, however a library words it, becomes one line
        full = not isinstance(err, DepthlabError) and is_disk_full(err, tmp)
        shutil.rmtree(tmp, ignore_errors=True)  # removing writes nothing: works on a full disk too
        if full or isinstance(err, OSError):
            raise DepthlabError(os_error_line(err, out, full)) from None
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fsync_tree(root: Path) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
