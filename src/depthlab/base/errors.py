"""Errors a user can act on. The CLI prints them as one line and exits with code 2."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


class DepthlabError(ValueError):
    """Bad input: a value the user gave that cannot work. Subclasses ValueError on purpose."""


class ConfigError(DepthlabError):
    """An invalid model or run configuration."""


#: The most tokens one command may read or train on (steps x batch x sequence length, evaluation tokens): about
#: 70 times the largest published LLM pre-training run. A larger number is a typo, refused before any work.
MAX_TOKENS = 10**15


def check_work(what: str, tokens: int, fix: str) -> None:
    """Refuse, naming the request, work of more than :data:`MAX_TOKENS` tokens (``what``: how it was asked for;
    ``fix``: the flag to lower)."""
    if tokens > MAX_TOKENS:
        raise DepthlabError(f"{what} = {tokens:.3g} tokens, more than depthlab accepts ({MAX_TOKENS:.0e}, about 70x "
                            f"the largest published pre-training run); lower {fix}")


def choices(valid: Iterable[str]) -> str:
    """``"choose one of: a, b, c"`` for error messages."""
    return "choose one of: " + ", ".join(str(v) for v in valid)


#: What a refused pickle (one holding more than tensors) is called, wherever it surfaces.
UNSAFE_PICKLE = "refusing to unpickle a file that holds more than tensors (not written by depthlab, or tampered with)"


def first_line(err: BaseException) -> str:
    """The first non-empty line of an exception's message, or its type name when it has none
    (how a wrapped library error becomes one line of a DepthlabError or of the CLI's stderr). A first line
    that announces more (``"... from one of:"``) is joined with the lines that follow, up to 400 characters."""
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    if not lines:
        return type(err).__name__
    if lines[0].startswith("Weights only load failed"):  # torch's advice to switch the protection off: never ours
        return UNSAFE_PICKLE
    if not lines[0].endswith(":") or len(lines) == 1:
        return lines[0]
    return " ".join(lines)[:400]


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else repr(value) if isinstance(value, str) else str(value)


def check_int(flag: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an integer in ``[minimum, maximum]``, else DepthlabError naming ``flag`` and the value."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (maximum is not None
                                                                                    and value > maximum):
        valid = f"an integer >= {minimum}" if maximum is None else f"an integer in {minimum}..{maximum}"
        raise DepthlabError(f"{flag} {_shown(value)} is out of range: give {valid}")
    return value


def check_number(flag: str, value: Any, *, above: float | None = None, minimum: float | None = None,
                 maximum: float | None = None) -> float:
    """``value`` as a finite number (``> above``, ``>= minimum``, ``<= maximum`` when given), else
    DepthlabError naming ``flag`` and the value (NaN and inf included)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (above is None or value > above) and (minimum is None or value >= minimum)
    ok = ok and (maximum is None or value <= maximum)
    if not ok:
        bounds = [f"> {above:g}" if above is not None else "", f">= {minimum:g}" if minimum is not None else "",
                  f"<= {maximum:g}" if maximum is not None else ""]
        valid = " and ".join(b for b in bounds if b)
        raise DepthlabError(f"{flag} {_shown(value)} is out of range: give a finite number{' ' + valid if valid else ''}")
    return float(value)


def os_error_line(err: BaseException, path: Any, full: bool | None = None) -> str:
    """A failed write in one line: ``no space left on the device holding 'path'`` for a full disk (``full``:
    known already, else :func:`is_disk_full`), otherwise ``cannot write 'path': <reason>``."""
    if full if full is not None else is_disk_full(err):
        return f"no space left on the device holding {str(path)!r}"
    reason = err.strerror if isinstance(err, OSError) and err.strerror else first_line(err)
    return f"cannot write {str(path)!r}: {reason}"


def is_disk_full(err: BaseException, where: Any = None) -> bool:
    """Whether ``err`` comes from a full disk: ENOSPC / EDQUOT, or a library's wording of it (safetensors: "os
    error 28"). Libraries that hide the cause (torch's ``enforce fail at inline_container.cc``) are recognised
    with ``where``, a path on the device written to: a failed write that left less than 1 MiB free there."""
    import errno
    import shutil

    text = str(err)
    if (isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)) or "No space left" in text \
            or "os error 28" in text:
        return True
    if where is None or not isinstance(err, (OSError, RuntimeError)):
        return False
    try:
        return shutil.disk_usage(where).free < 2**20
    except OSError:
        return False
