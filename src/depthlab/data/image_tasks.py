"""Image-text multiple-choice tasks in MMMU's format: image(s), a question, lettered options, one answer.

Sources (``depthlab evaluate --tasks``):

    FILE.jsonl / FILE.json   one item per record (see the fields below); image paths relative to the file
    FILE.parquet, 'GLOB'     MMMU's own parquet files as downloaded (e.g. 'mmmu/*/validation-*.parquet'; a glob
                             in quotes), images held as bytes in the file
    builtin-shapes           offline: 200 generated pictures of 1-4 shapes of one kind and one colour, asked their
                             shape, colour or number (:mod:`depthlab.data.shapes`)

Fields of an item (MMMU's names): ``question`` (may name its images inline as ``<image 1>``), ``options`` (a list of
strings, or MMMU's Python-literal string ``"['a', 'b']"``), ``answer`` (a letter ``A``..; an index; or an option's
text), and the images: ``image`` (one), ``images`` (a list) or MMMU's ``image_1`` .. ``image_7``. An image is a path,
``{"bytes": ..., "path": ...}`` (a Hugging Face ``Image`` value, as parquet stores it), raw bytes, or a
``data:image/...;base64,`` string. MMMU items whose ``question_type`` is ``open`` are not multiple choice: skipped,
and counted in the task's ``info``.

The prompt is lmms-eval's MMMU prompt (images named inline stay where they are named, the others go first, each
followed by a newline), closed by ``Answer:`` for loglikelihood scoring::

    <image>
    {question}
    A. {option 1}
    B. {option 2}
    Answer with the option's letter from the given choices directly.
    Answer:

and each choice is scored as the continuation `` A``, `` B``, ... (``acc``; the letters all have one character, so
``acc_norm`` equals ``acc``). :data:`IMAGE` marks where an image goes; the model's processor puts its own image
tokens there (:mod:`depthlab.analysis.evaluate.image_scoring`).

Every item is checked when the task is read, before a model is loaded: each image must exist and decode, each item
must have an answer among its options and at least one image.
"""

from __future__ import annotations

import ast
import base64
import glob
import io
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from depthlab.base.errors import DepthlabError, first_line
from depthlab.base.extras import needs

IMAGE = "<image>"  # where an image goes in a rendered prompt
MC_PROMPT = "Answer with the option's letter from the given choices directly."
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
IMAGE_FIELDS = ("image", "images", *(f"image_{k}" for k in range(1, 8)))
_REF = re.compile(r"<image (\d+)>")


@dataclass(frozen=True)
class ImageRef:
    """One image: a file, encoded bytes, or a picture made in memory (a PIL image, for the built-in task)."""

    path: Path | None = None
    data: bytes | None = None
    picture: Any = None

    def open(self) -> Any:
        """The image as an RGB ``PIL.Image``."""
        try:
            from PIL import Image
        except ImportError:
            raise needs("image-text tasks", "vit") from None
        if self.picture is not None:
            return self.picture.convert("RGB")
        with Image.open(self.path if self.path is not None else io.BytesIO(self.data)) as im:
            return im.convert("RGB")

    def describe(self) -> str:
        return str(self.path) if self.path is not None else "the image bytes" if self.data is not None else "picture"


@dataclass(frozen=True)
class ImageItem:
    """One item: ``images`` in the order the prompt shows them (an image named twice appears twice); ``question`` and
    ``options`` with :data:`IMAGE` where an image is named inline; ``gold`` indexes ``options``."""

    images: tuple[ImageRef, ...]
    question: str
    options: tuple[str, ...]
    gold: int
    source: str = ""

    @property
    def letters(self) -> tuple[str, ...]:
        return tuple(LETTERS[: len(self.options)])

    @property
    def choices(self) -> tuple[str, ...]:
        """What is scored: the letters (``acc_norm``'s lengths, as for a text task's choices)."""
        return self.letters

    def context(self) -> str:
        """The prompt up to ``Answer:`` (see the module docstring), an :data:`IMAGE` per image."""
        named = (self.question + "".join(self.options)).count(IMAGE)
        first = "".join(IMAGE + "\n" for _ in range(len(self.images) - named))
        listing = "\n".join(f"{letter}. {opt}" for letter, opt in zip(self.letters, self.options))
        return f"{first}{self.question}\n{listing}\n{MC_PROMPT}\nAnswer:"

    def continuations(self) -> tuple[str, ...]:
        return tuple(" " + letter for letter in self.letters)


@dataclass
class ImageTask:
    name: str
    items: list[ImageItem]
    source: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    format: str = "image-mc"


class _BadItem(ValueError):
    """An image-text item that cannot be scored (one line, the caller adds where)."""


# ---------------------------------------------------------------------------------------------- one row
def _options(raw: Any) -> list[str]:
    if isinstance(raw, str):  # MMMU stores the list as its Python repr
        try:
            raw = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            raise _BadItem(f"'options' is a string that is not a list: {raw[:40]!r}") from None
    if not isinstance(raw, (list, tuple)) or len(raw) < 2 or not all(isinstance(o, (str, int, float)) for o in raw):
        raise _BadItem("'options' must be a list of at least two strings")
    opts = [str(o) for o in raw]
    if any(not o.strip() for o in opts):
        raise _BadItem("an option is empty")
    return opts


def _gold(raw: Any, options: list[str]) -> int:
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        raise _BadItem("no answer")
    if isinstance(raw, int) and not isinstance(raw, bool):
        index = raw
    elif isinstance(raw, str) and raw.strip().upper() in LETTERS[: len(options)] and len(raw.strip()) == 1:
        index = LETTERS.index(raw.strip().upper())
    elif isinstance(raw, str) and raw in options:
        index = options.index(raw)
    else:
        raise _BadItem(f"answer {raw!r} is not among the options {', '.join(LETTERS[: len(options)])}")
    if not 0 <= index < len(options):
        raise _BadItem(f"answer {raw!r} is not among the {len(options)} options")
    return index


def _ref(value: Any, base: Path) -> ImageRef | None:
    """An image field's value as an :class:`ImageRef` (None for an empty MMMU slot)."""
    if value is None:
        return None
    if isinstance(value, dict):  # a Hugging Face Image value: bytes, else a path
        if value.get("bytes"):
            return ImageRef(data=bytes(value["bytes"]))
        value = value.get("path")
        if not value:
            return None
    if isinstance(value, (bytes, bytearray)):
        return ImageRef(data=bytes(value))
    if isinstance(value, str) and value.startswith("data:image/"):
        try:
            return ImageRef(data=base64.b64decode(value.split(",", 1)[1], validate=True))
        except (ValueError, IndexError):
            raise _BadItem("an image's data: URL is not base64") from None
    if isinstance(value, str) and value:
        return ImageRef(path=(base / value) if not Path(value).is_absolute() else Path(value))
    raise _BadItem(f"an image must be a path, bytes or a data: URL, got {type(value).__name__}")


def _slots(row: dict, base: Path) -> dict[int, ImageRef]:
    """The row's images by MMMU number (1-based): ``image_k``, or ``image`` / ``images`` in order."""
    slots: dict[int, ImageRef] = {}
    listed = row.get("images") if "images" in row else ([row["image"]] if "image" in row else [])
    if not isinstance(listed, list):
        raise _BadItem("'images' must be a list")
    for k, value in enumerate(listed, 1):
        if (ref := _ref(value, base)) is not None:
            slots[k] = ref
    for k in range(1, 8):
        if (ref := _ref(row.get(f"image_{k}"), base)) is not None:
            slots[k] = ref
    return slots


def check_image(ref: ImageRef) -> None:
    """Raise :class:`_BadItem` when the image is missing or does not decode."""
    if ref.path is not None and not ref.path.is_file():
        raise _BadItem(f"image {str(ref.path)!r} does not exist")
    try:
        ref.open().load()
    except DepthlabError:
        raise
    except Exception as err:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError...: one line
        raise _BadItem(f"cannot read {ref.describe()} as an image: {first_line(err)[:120]}") from None


def parse_item(row: dict, base: Path) -> ImageItem | None:
    """One row -> an item (None for an MMMU open question, which is not multiple choice)."""
    if str(row.get("question_type", "multiple-choice")).strip().lower() == "open":
        return None
    for name in ("question", "options", "answer"):
        if name not in row:
            raise _BadItem(f"no {name!r} field")
    if not isinstance(row["question"], str) or not row["question"].strip():
        raise _BadItem("'question' must be a non-empty string")
    options = _options(row["options"])
    gold = _gold(row["answer"], options)
    slots = _slots(row, base)
    if not slots:
        raise _BadItem(f"no image ({', '.join(IMAGE_FIELDS[:3])}, or image_1 .. image_7)")
    text = row["question"] + "\x00" + "\x00".join(options)
    named = [int(k) for k in _REF.findall(text)]
    missing = sorted({k for k in named if k not in slots})
    if missing:
        raise _BadItem(f"names <image {missing[0]}> but has no image_{missing[0]}")
    images = [slots[k] for k in sorted(slots) if k not in named] + [slots[k] for k in named]
    for ref in dict.fromkeys(images):
        check_image(ref)
    question, *opts = _REF.sub(IMAGE, text).split("\x00")
    return ImageItem(tuple(images), question, tuple(opts), gold)


def is_image_row(row: Any) -> bool:
    """Whether a task-file row is an image-text item (a question, options, and an image field)."""
    return isinstance(row, dict) and "question" in row and "options" in row and any(f in row for f in IMAGE_FIELDS)


# ---------------------------------------------------------------------------------------------- files
def parse_image_rows(rows: Iterable[tuple[str, dict]], name: str, source: str, base: Path,
                     limit: int | None = None) -> ImageTask:
    """A task from ``(where, row)`` pairs; every multiple-choice row must parse (DepthlabError naming where)."""
    items, skipped = [], 0
    for where, row in rows:
        if not isinstance(row, dict):
            raise DepthlabError(f"{where}: expected a JSON object, got {type(row).__name__}")
        try:
            item = parse_item(row, base)
        except _BadItem as err:
            raise DepthlabError(f"{where}: {err}") from None
        if item is None:
            skipped += 1
            continue
        items.append(ImageItem(item.images, item.question, item.options, item.gold, where))
        if limit is not None and len(items) >= limit:
            break
    if not items:
        raise DepthlabError(f"image-text task {name!r} ({source}) holds no multiple-choice items"
                            + (f" ({skipped} open questions)" if skipped else ""))
    return ImageTask(name, items, source, {"skipped_open": skipped})


def _parquet_rows(path: Path) -> Iterable[tuple[str, dict]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise needs("reading .parquet", "parquet") from None
    try:
        table = pq.read_table(path)
    except Exception as err:  # noqa: BLE001 - ArrowInvalid, OSError: one line
        raise DepthlabError(f"cannot read {str(path)!r} as parquet: {first_line(err)[:200]}") from None
    for i, row in enumerate(table.to_pylist()):
        yield f"{path}[{i}]", row


def _file_rows(path: Path) -> Iterable[tuple[str, dict]]:
    if path.suffix.lower() == ".parquet":
        return _parquet_rows(path)
    from depthlab.base.fileio import read_json_records

    return read_json_records(path, "task file")


def image_task_files(spec: str) -> list[Path]:
    """The files of a task spec: one file, or the files a glob pattern matches (sorted); DepthlabError when none."""
    if any(c in spec for c in "*?["):
        files = sorted(Path(p) for p in glob.glob(spec, recursive=True) if Path(p).is_file())
        if not files:
            raise DepthlabError(f"task pattern {spec!r} matches no file")
        return files
    path = Path(spec)
    if not path.is_file():
        raise DepthlabError(f"task file {spec!r} does not exist")
    return [path]


def load_image_task(spec: str, limit: int | None = None, name: str | None = None) -> ImageTask:
    """An image-text task from a ``.jsonl``/``.json``/``.parquet`` file or a glob of them (MMMU's subjects)."""
    files = image_task_files(spec)
    rows = ((w, r) for f in files for w, r in _file_rows(f))
    base = files[0].parent
    task = parse_image_rows(rows, name or (files[0].stem if len(files) == 1 else spec), spec, base, limit)
    task.info["files"] = len(files)
    return task



def folder_task(root: str | Path, limit: int | None = None) -> ImageTask:
    """An image folder (one sub-folder per class, as a ViT trains on) as an image-text task: each picture asked
    what it shows, the class names as options (26 classes at most, one letter each). Every image is checked first
    (:func:`depthlab.data.images.check_image_folder`: one line naming a file Pillow cannot read)."""
    from depthlab.data.images import IMAGE_SUFFIXES, check_image_folder

    classes = check_image_folder(root)
    if len(classes) > len(LETTERS):
        raise DepthlabError(f"image folder {str(root)!r} has {len(classes)} classes; an image-text item offers at most "
                            f"{len(LETTERS)} lettered options")
    files = [(f, k) for k, name in enumerate(classes) for f in sorted((Path(root) / name).iterdir())
             if f.suffix.lower() in IMAGE_SUFFIXES]
    files = sorted(files, key=lambda fk: (fk[0].name, fk[1]))[: limit or None]  # the classes interleaved
    items = [ImageItem((ImageRef(path=f),), "What does the picture show?", tuple(classes), k, str(f))
             for f, k in files]
    return ImageTask(Path(root).name, items, str(root), {"classes": classes})
