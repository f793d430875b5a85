"""Files written and read safely. THE one way depthlab publishes a result: write a temporary sibling, fsync it,
rename it over the destination, so a crash, ``kill -9`` or a full disk leaves the old file or the new one, never
half of one.

    with publish(path) as tmp:                       # tmp = <dir>/.<name>.tmp-<pid>: write it (a file)
        torch.save(obj, tmp)
    with publish(out, directory=True) as tmp:        # a directory, published whole
        write_everything_into(tmp)
    write_json_atomic(path, obj); write_text_atomic(path, text)
    remove_stale_tmp(path)                           # siblings left by processes that no longer run
    json_safe({"x": float("nan"), "t": (1, 2)})      # {"x": None, "t": [1, 2]}
    for where, row in read_json_records(path, "task file"): ...   # where = "file:line" or "file[i]"
    sha256_file(path)                                # hex digest, read in 4 MiB chunks

Every temporary name is ``.<name>.tmp-<pid>`` beside its destination (one convention: a stale one is
recognised, and removed once its process is gone). A CI test checks that no module outside this one
renames, replaces or fsyncs files by hand.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from depthlab.base.errors import DepthlabError, is_disk_full, os_error_line

TMP_MARK = ".tmp-"


def json_safe(x: Any) -> Any:
    """JSON-ready: NaN/inf -> None, tuples -> lists, numpy scalars -> Python numbers, keys -> str."""
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if type(x).__module__ == "numpy" and hasattr(x, "item"):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def tmp_sibling(path: str | Path) -> Path:
    """The temporary sibling this process writes ``path`` as: ``<dir>/.<name>.tmp-<pid>``."""
    path = Path(path)
    return path.parent / f".{path.name}{TMP_MARK}{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_tmp(path: str | Path) -> list[Path]:
    """Remove ``path``'s temporary siblings left by processes that no longer run; returns what was removed."""
    path = Path(path)
    removed = []
    prefix = f".{path.name}{TMP_MARK}"
    for p in path.parent.glob(f"{prefix}*") if path.parent.is_dir() else []:
        pid = p.name[len(prefix):]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            _remove(p)
            removed.append(p)
    return removed


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for p in sorted(root.rglob("*")) if root.is_dir() else [root]:
        if p.is_file() and not p.is_symlink():
            _fsync(p)
    _fsync(root)


def _swap(tmp: Path, path: Path) -> None:
    """Rename ``tmp`` over ``path``: one rename for a file (atomic); a directory in place is renamed aside
    first and removed after (a crash between the two leaves the new one or the old one aside, never half)."""
    if path.is_dir() and not path.is_symlink():
        old = path.parent / f".{path.name}.old-{os.getpid()}"
        os.rename(path, old)
        os.rename(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)
    _fsync(path.parent)


@contextlib.contextmanager
def publish(path: str | Path, *, directory: bool = False,
            if_exists: Literal["replace", "keep", "refuse"] = "replace") -> Iterator[Path]:
    """Yield the temporary sibling of ``path`` to write (with ``directory``: a fresh, empty directory); when
    the block ends without an error, fsync it and rename it to ``path``; on any error remove it.

    ``if_exists`` says what an existing ``path`` gets at the rename: ``replace`` (the default), ``keep`` (another
    writer got there first with the same content: ours is dropped, e.g. a cache), ``refuse`` (checked before the
    block runs as well: DepthlabError naming it; an empty directory, such as one the CLI holds a lock on, counts
    as absent). A failed write (a full disk, however a library words it) becomes one DepthlabError line."""
    path = Path(path)
    if if_exists == "refuse" and _occupied(path):
        raise DepthlabError(f"output {'directory' if directory else 'file'} {str(path)!r} exists and is not empty; "
                            "give a new one")
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp(path)
    tmp = tmp_sibling(path)
    _remove(tmp)
    if directory:
        tmp.mkdir()
    try:
        yield tmp
        _fsync_tree(tmp)
        if if_exists == "keep" and _occupied(path):
            _remove(tmp)
            return
        if if_exists == "refuse" and _occupied(path):
            raise DepthlabError(f"output {str(path)!r} appeared while it was written; give a new one")
        if directory and path.is_dir() and not any(path.iterdir()):
            path.rmdir()  # the caller's empty directory (e.g. locked by the CLI): replaced by the complete one
        _swap(tmp, path)
    except Exception as err:  # noqa: BLE001 - a full disk, however a library words it, becomes one line
        full = not isinstance(err, DepthlabError) and is_disk_full(err, tmp.parent)
        _remove(tmp)  # removing writes nothing: works on a full disk too
        if full or isinstance(err, OSError):
            raise DepthlabError(os_error_line(err, path, full)) from None
        raise
    except BaseException:
        _remove(tmp)
        raise


def _occupied(path: Path) -> bool:
    return path.exists() and (not path.is_dir() or any(path.iterdir()))


def fresh_out(out: str | Path, flag: str = "--out") -> Path:
    """``out`` as a Path when it is absent or an empty directory (one a lock was just taken on counts as empty);
    else a one-line DepthlabError naming ``flag``: every command that writes a result directory checks this, before
    any work, so nothing of an earlier result is ever overwritten or mixed in."""
    path = Path(out)
    if _occupied(path):
        raise DepthlabError(f"{flag} {str(path)!r} exists and is not empty; give a new or empty directory")
    return path


def publish_dir(out: str | Path) -> contextlib.AbstractContextManager[Path]:
    """A result directory, published whole: ``out`` must be absent or empty (DepthlabError, one line, when it
    holds files)."""
    return publish(out, directory=True, if_exists="refuse")


def move_into(src: str | Path, path: str | Path) -> None:
    """Move a finished file (written by another program, on the same file system) to ``path``: fsynced, then
    one rename."""
    src = Path(src)
    _fsync(src)
    _swap(src, Path(path))


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through :func:`publish`."""
    with publish(path) as tmp:
        tmp.write_text(text)


def write_json_atomic(path: str | Path, obj: Any, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON (one trailing newline) to ``path`` through :func:`publish`."""
    write_text_atomic(path, json.dumps(obj, indent=indent) + "\n")


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def jsonl_lines(text: str) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of JSON Lines text, blank lines skipped. Lines end at ``\\n`` only (a ``\\r``
    before it is dropped): ``str.splitlines`` would also cut at U+2028, U+0085 and other characters that
    JSON allows unescaped inside strings."""
    for no, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if line.strip():
            yield no, line


def read_json_records(path: str | Path, what: str = "file") -> Iterator[tuple[str, Any]]:
    """``(where, value)`` for every record of ``path``: a ``.json`` file (suffix in any case) holds one JSON list,
    any other file one JSON value per line (``where`` = ``file[i]`` / ``file:line``). DepthlabError, one line
    naming ``what`` and the file (and line), for bytes that are not UTF-8 and for invalid JSON."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise DepthlabError(f"{what} {str(path)!r} is not valid UTF-8 (byte {err.start})") from None
    except OSError as err:
        raise DepthlabError(f"{what} {str(path)!r} cannot be read: {err.strerror or err}") from None
    if path.suffix.lower() == ".json":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as err:
            raise DepthlabError(f"{path}: invalid JSON ({err.msg}, line {err.lineno})") from None
        if not isinstance(rows, list):
            raise DepthlabError(f"{path}: expected a JSON list of records, got {type(rows).__name__}")
        yield from ((f"{path}[{i}]", r) for i, r in enumerate(rows))
        return
    for no, line in jsonl_lines(text):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DepthlabError(f"{path}:{no}: invalid JSON ({err.msg})") from None
        yield f"{path}:{no}", row
