"""Errors a user can act on. The CLI prints them as one line and exits with code 2."""

from __future__ import annotations

from typing import Iterable


class DepthlabError(ValueError):
    """Bad input: a value the user gave that cannot work. Subclasses ValueError on purpose."""


class ConfigError(DepthlabError):
    """An invalid model or run configuration."""


def choices(valid: Iterable[str]) -> str:
    """``"choose one of: a, b, c"`` for error messages."""
    return "choose one of: " + ", ".join(str(v) for v in valid)


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (its type name when the message is empty)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
