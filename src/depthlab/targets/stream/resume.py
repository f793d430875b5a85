"""The resume state of a streamed command: one directory beside its output, one writer, saved after every layer.

    with owned_state(out) as root:                 # .<out>.stream-state, locked for the whole command
        ...                                        # sweeps save their progress under root/<pass> (PassState)
        publish the output                         # then the state is removed; a crash or kill -9 leaves it
    state = PassState(root, "diagnose", fingerprint(...))   # one sweep's saved progress

A streamed command writing ``out`` keeps its progress in a hidden sibling (:func:`state_dir`; ``out`` itself appears
only once complete). :func:`owned_state` is the one place that holds it: it takes the lock (a second command writing
the same ``out`` is refused in one line naming the holder's PID, before it reads or writes anything), and removes
the state once the command's output is published. Each sweep (a *pass*) keeps its own subdirectory: after each layer
the live lanes (and the base's new state) are saved atomically (temporary file, fsync, rename), after each group of
batches the consumer's sums. A pass killed at any point and rerun with the same inputs continues after the last
saved layer, with the same numbers; a :func:`fingerprint` (checkpoint files and every file beside them: config.json,
the tokenizer; dtypes, lanes, the token ids) decides
whether a saved state applies, and a damaged one is discarded with a warning (the pass starts over).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from depthlab.base.errors import DepthlabError, first_line
from depthlab.base.fileio import publish, write_json_atomic

if TYPE_CHECKING:
    from depthlab.targets.stream.sweep import Consumer

log = logging.getLogger(__name__)


def state_dir(out: str | Path) -> Path:
    """Where a streamed command writing to ``out`` keeps its resume state: a hidden sibling of ``out``."""
    out = Path(out)
    return out.parent / f".{out.name}.stream-state"


@contextlib.contextmanager
def owned_state(out: Path | None) -> Iterator[Path | None]:
    """The resume state of the command writing ``out`` (None: no state, nothing held), for the command's whole run:
    locked on entry, removed once the body has returned (its output published); a body that raises leaves it for the
    rerun to continue from."""
    root = state_dir(out) if out is not None else None
    with hold_state(root, out):
        yield root
        clear_state(root)


def clear_state(root: Path | None) -> None:
    """Remove the resume state once its results are written."""
    if root is not None and root.exists():
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def hold_state(root: Path | None, out: Path | None = None) -> Iterator[None]:
    """The one-writer lock of a resume state (``root/.lock``, the run lock of ``train``): a second holder of the same
    ``root`` is refused in one line naming the holder's PID. On exit, a state directory holding nothing but the lock
    (no progress saved: e.g. a full disk) is removed again."""
    from depthlab.base.store.lock import LOCK_NAME, RunLock

    if root is None:
        yield
        return
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DepthlabError(f"cannot create the resume state {str(root)!r}: {err.strerror or err}") from None
    lock = RunLock(root)
    try:
        lock.acquire()
    except DepthlabError as err:
        holder = first_line(err).split("in use by process ", 1)[-1].split(" ", 1)[0]
        what = str(out) if out is not None else str(root)
        raise DepthlabError(f"{what!r} is being written by another streamed command (process {holder}, which holds "
                            f"{str(root / LOCK_NAME)!r}); wait for it to finish or choose another --out") from None
    try:
        yield
    finally:
        if root.is_dir() and all(p.name == LOCK_NAME for p in root.iterdir()):
            shutil.rmtree(root, ignore_errors=True)
        lock.release()


#: Files beside the weights hashed whole into a pass's fingerprint up to this size (config.json, the tokenizer's
#: files, generation_config.json; a larger one by size and mtime, as the weight files are).
SIDE_FILE_BYTES = 64 << 20


def fingerprint(name: str, source: Any, batches: Sequence[Any], lanes: Sequence[Any], keep_states: bool,
                taps: list[bool], groups: list[range]) -> str:
    """What a pass's saved state was made for: its name, lanes, groups, what the consumer's sums hold (``taps``), the
    dtypes, the checkpoint files (path, size, mtime), every other file beside them (config.json, the tokenizer:
    content; :func:`side_files`) and the batches' token ids and labels. An edit of any of them (``rope_theta`` in
    config.json, the weights untouched) makes the state apply no more: the pass starts over."""
    h = hashlib.sha256()
    files = sorted({info.file for info in source.store.index.values()})
    ident = [name, keep_states, taps, [(s.key, sorted(s.skip), sorted(s.zero), *([sorted(s.experts)] if s.experts else []))
                                for s in lanes],
             [(g.start, g.stop) for g in groups],
             str(source.dtype), str(source.compute_dtype),
             [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files], side_files(files)]
    h.update(json.dumps(ident).encode())
    for b in batches:
        h.update(b.ids.cpu().numpy().tobytes())
        if b.labels is not None:
            h.update(b.labels.cpu().numpy().tobytes())
        for name, value in sorted((b.inputs or {}).items()):  # an image-text batch: its pixels, the blocks it skips
            h.update(name.encode())
            h.update(value.cpu().numpy().tobytes() if hasattr(value, "cpu") else repr(value).encode())
    return h.hexdigest()


def side_files(weights: Sequence[Path]) -> list[list[Any]]:
    """Every other file in the directories of the weight files ``weights``, each as [path, sha256 of its content] (a
    file over :data:`SIDE_FILE_BYTES`: [path, size, mtime]): config.json, the tokenizer's files, anything else a
    model directory or a run's checkpoint holds that may change the numbers. Hidden files (locks) are left out."""
    out: list[list[Any]] = []
    weight_set = {Path(w) for w in weights}
    for folder in sorted({Path(w).parent for w in weights}):
        for f in sorted(folder.iterdir()):
            if f in weight_set or f.name.startswith(".") or not f.is_file():
                continue
            st = f.stat()
            if st.st_size > SIDE_FILE_BYTES:
                out.append([str(f), st.st_size, st.st_mtime_ns])
            else:
                out.append([str(f), hashlib.sha256(f.read_bytes()).hexdigest()])
    return out


def _atomic_save(obj: Any, path: Path) -> None:
    with publish(path) as tmp:
        torch.save(obj, tmp)


class PassState:
    """The saved progress of one sweep under ``root/<pass>`` (see the module docstring)."""

    def __init__(self, root: Path | None, name: str, fingerprint: str) -> None:
        self.dir = root / name if root is not None else None
        self.fingerprint = fingerprint
        if self.dir is None:
            return
        plan = self.dir / "plan.json"
        if self.dir.exists():
            try:
                same = json.loads(plan.read_text()).get("fingerprint") == fingerprint
            except (OSError, ValueError):
                same = False
            if not same:
                log.warning("discarding the saved state in %s: it was made for other inputs", self.dir)
                shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(plan, {"fingerprint": fingerprint}, indent=None)

    def _path(self, name: str) -> Path:
        assert self.dir is not None
        return self.dir / name

    def _load(self, name: str) -> Any:
        return torch.load(self._path(name), map_location="cpu", weights_only=True)

    def _readable(self, read: Callable[[], Any]) -> Any:
        """``read()``, or None after discarding this pass's saved state when a file of it is damaged (tampered
        with, cut short): the pass then starts over, with a warning naming the directory."""
        try:
            return read()
        except Exception as err:  # noqa: BLE001 - any damage: unpickling, truncation, a missing file, wrong content
            assert self.dir is not None
            log.warning("discarding the saved state in %s: it is damaged (%s); this pass starts over", self.dir,
                        first_line(err)[:120])
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.dir / "plan.json", {"fingerprint": self.fingerprint}, indent=None)
            return None

    def applied(self, consumer: Consumer, saved: dict[str, Any]) -> bool:
        """``consumer`` loaded from ``saved``; False (the state discarded, see :meth:`_readable`) when it does not fit."""
        fresh = consumer.state_dict()

        def load() -> bool:
            try:
                consumer.load_state_dict(saved)
            except Exception:
                consumer.load_state_dict(fresh)  # nothing of the damaged state stays
                raise
            return True
        return bool(self._readable(load))

    def done(self) -> dict[str, Any] | None:
        if self.dir is None or not self._path("done.pt").is_file():
            return None
        return self._readable(lambda: self._load("done.pt"))

    def last_group(self) -> tuple[int, dict[str, Any]] | None:
        """(the last finished group, the consumer's sums after it)."""
        if self.dir is None:
            return None
        found = sorted(self.dir.glob("consumer-*.pt"))
        return self._readable(lambda: (int(found[-1].stem.split("-")[1]), self._load(found[-1].name))) if found else None

    def last_layer(self, group: int, keep_states: bool, consumer: bool = False
                   ) -> tuple[int, list, list, dict[str, Any] | None] | None:
        """(last saved layer j, the live lanes after it, the base states x^1..x^{j+1}, the consumer's sums after it
        when ``consumer``) of ``group``."""
        if self.dir is None:
            return None
        found = sorted(self.dir.glob(f"g{group:05d}-streams-*.pt"))
        if not found:
            return None
        def read() -> tuple[int, list, list, dict[str, Any] | None]:
            j = int(found[-1].stem.rsplit("-", 1)[1])
            states = [self._load(f"g{group:05d}-states-{k:05d}.pt") for k in range(j + 1)] if keep_states else []
            sums = self._load(f"g{group:05d}-consumer-{j:05d}.pt") if consumer else None
            return j, self._load(found[-1].name), states, sums
        return self._readable(read)

    def save_layer(self, group: int, j: int, lanes: list[torch.Tensor], state: list[torch.Tensor] | None,
                   consumer_state: dict[str, Any] | None = None) -> None:
        if self.dir is None:
            return
        if state is not None:
            _atomic_save(state, self._path(f"g{group:05d}-states-{j:05d}.pt"))
        if consumer_state is not None:  # before the lanes: their file (named "streams" since the first release) marks
            _atomic_save(consumer_state, self._path(f"g{group:05d}-consumer-{j:05d}.pt"))  # the layer saved
        _atomic_save(lanes, self._path(f"g{group:05d}-streams-{j:05d}.pt"))
        if j > 0:
            self._path(f"g{group:05d}-streams-{j - 1:05d}.pt").unlink(missing_ok=True)
            self._path(f"g{group:05d}-consumer-{j - 1:05d}.pt").unlink(missing_ok=True)

    def save_group(self, group: int, consumer_state: dict[str, Any], last: bool) -> None:
        if self.dir is None:
            return
        _atomic_save(consumer_state, self._path("done.pt" if last else f"consumer-{group:05d}.pt"))
        for p in [*self.dir.glob(f"g{group:05d}-*.pt"), *self.dir.glob("consumer-*.pt")]:
            if p.name != f"consumer-{group:05d}.pt" or last:
                p.unlink(missing_ok=True)
